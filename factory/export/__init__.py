"""Export: DPO / KTO / reward / SFT / GRPO rows, writers, manifests, dataset cards and validation.

Reading and validating a file (what ``factory export validate`` and every trainer do) imports neither polars
nor the store; the names that build exports resolve on first use (PEP 562).
"""

from factory._lazy_exports import lazy_exports
from factory.export._columns import FORMAT_COLUMNS, SIDE_FILE_COLUMNS
from factory.export._files import FILE_KINDS, MANIFEST_SUFFIX, file_kind, iter_records, side_path, write_rows
from factory.export._validate import validate_file

_LAZY = {
    **dict.fromkeys(("ExportResult", "export", "judge_objective_agreement", "write_dataset_card"), "_exporter"),
    **dict.fromkeys(("EXPORT_FORMATS", "ExportFormat", "ExportOptions", "ExportRows", "create_format",
                     "format_names", "kto_weights", "length_bias", "register_format", "render_text",
                     "tool_schemas_json"), "_formats"),
    "ExportManifest": "_manifest",
    **dict.fromkeys(("PAIR_STRATEGIES", "PairOptions", "build_pairs"), "_pairs"),
    **dict.fromkeys(("ExportSource", "load_source"), "_source"),
}

__all__ = [
    "EXPORT_FORMATS",
    "FILE_KINDS",
    "FORMAT_COLUMNS",
    "MANIFEST_SUFFIX",
    "PAIR_STRATEGIES",
    "SIDE_FILE_COLUMNS",
    "ExportFormat",
    "ExportManifest",
    "ExportOptions",
    "ExportResult",
    "ExportRows",
    "ExportSource",
    "PairOptions",
    "build_pairs",
    "create_format",
    "export",
    "file_kind",
    "format_names",
    "iter_records",
    "judge_objective_agreement",
    "kto_weights",
    "length_bias",
    "load_source",
    "register_format",
    "render_text",
    "side_path",
    "tool_schemas_json",
    "validate_file",
    "write_dataset_card",
    "write_rows",
]


__getattr__ = lazy_exports(__name__, _LAZY)
