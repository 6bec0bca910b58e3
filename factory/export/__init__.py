"""Export: DPO / KTO / reward / SFT / GRPO / PPO rows, writers, manifests, dataset cards and validation.

Reading and validating a file (what ``factory export validate`` and every trainer do) imports neither polars
nor the store; the names that build exports resolve on first use (PEP 562).
"""

from factory._lazy_exports import lazy_exports
from factory.export._files import FILE_KINDS, MANIFEST_SUFFIX, file_kind, iter_records, side_path, write_rows
from factory.export._validate import validate_file

_LAZY = {
    "export": "_exporter",
    **dict.fromkeys(("EXPORT_FORMATS", "ExportFormat", "ExportOptions", "ExportRows", "create_format",
                     "format_names", "kto_weights", "register_format"), "_formats"),
    "ExportManifest": "_manifest",
    **dict.fromkeys(("PairOptions", "build_pairs"), "_pairs"),
    **dict.fromkeys(("ExportSource", "load_source"), "_source"),
    "ExportStream": "_stream",
}

__all__ = [
    "EXPORT_FORMATS",
    "FILE_KINDS",
    "MANIFEST_SUFFIX",
    "ExportFormat",
    "ExportManifest",
    "ExportOptions",
    "ExportRows",
    "ExportSource",
    "ExportStream",
    "PairOptions",
    "build_pairs",
    "create_format",
    "export",
    "file_kind",
    "format_names",
    "iter_records",
    "kto_weights",
    "load_source",
    "register_format",
    "side_path",
    "validate_file",
    "write_rows",
]


__getattr__ = lazy_exports(__name__, _LAZY)
