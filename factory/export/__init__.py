"""Export: DPO / KTO / reward / SFT / GRPO rows, writers, manifests, dataset cards and validation."""

from factory.export._exporter import ExportResult, export, judge_objective_agreement, write_dataset_card
from factory.export._files import FILE_KINDS, file_kind, iter_records, side_path, write_rows
from factory.export._formats import (
    ExportFormat,
    ExportOptions,
    ExportRows,
    create_format,
    format_names,
    kto_weights,
    length_bias,
    register_format,
    render_text,
    tool_schemas_json,
)
from factory.export._pairs import PAIR_STRATEGIES, PairOptions, build_pairs
from factory.export._source import MESSAGE_JSON_SHAPE, ExportSource, load_source
from factory.export._validate import validate_file

__all__ = [
    "FILE_KINDS",
    "MESSAGE_JSON_SHAPE",
    "PAIR_STRATEGIES",
    "ExportFormat",
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
