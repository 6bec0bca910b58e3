"""Training data: an export file, checked against its format and read with its manifest.

Every trainer starts here. The file is validated the way ``factory export
validate`` does (each problem as ``FILE:LINE: field``) before anything is
loaded, and the manifest written beside it (``FILE.manifest.json``) supplies
what the trainer needs from the export (KTO's class weights) and what the
result depends on (dataset hash, runs, options hash).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from factory.errors import ConfigError, RecordError
from factory.export import MANIFEST_SUFFIX, file_kind, validate_file
from factory.provenance import file_sha256

if TYPE_CHECKING:  # read on use: importing the trainers imports no pydantic
    from factory.export import ExportManifest

__all__ = ["TrainingData", "load_training_data"]

@dataclass
class TrainingData:
    """An export file loaded as a ``datasets.Dataset``, with what it depends on.

    Attributes:
        path: The data file.
        format: The export format the rows follow (``dpo``, ``kto``, ``reward``, ``reward-scalar``, ``sft``, ``grpo``).
        dataset: The rows, as TRL reads them (no column mapping).
        manifest: The export manifest, or None for a file made elsewhere.
        file_sha256: Digest of the data file (``sha256:<hex>``, as manifests write it).
        warnings: What the user should know (no manifest, unpowered ranking...).
    """

    path: Path
    format: str
    dataset: Any
    manifest: ExportManifest | None
    file_sha256: str
    warnings: list[str] = field(default_factory=list)

    def provenance(self) -> dict[str, Any]:
        """What a model trained on these rows depends on, for the training result."""
        manifest = self.manifest.model_dump(mode="json") if self.manifest is not None else {}
        return {
            "file": str(self.path), "format": self.format, "file_sha256": self.file_sha256,
            "rows": len(self.dataset),
            "dataset_hash": manifest.get("dataset_hash"), "dataset_hashes": manifest.get("dataset_hashes"),
            "run_ids": manifest.get("run_ids"), "options_hash": manifest.get("options_hash"),
            "config_hashes": manifest.get("config_hashes"), "export_powered": manifest.get("powered"),
            "export_evidence": manifest.get("evidence"), "manifest": self.manifest is not None,
        }


def _manifest_for(path: Path) -> tuple[ExportManifest | None, str | None]:
    """The manifest beside ``path``, and the side-file tag when ``path`` is a side file (``scalar``)."""
    own = path.with_name(path.name + MANIFEST_SUFFIX)
    if own.is_file():
        return _read_manifest(own), None
    # data.scalar.jsonl is described by data.jsonl.manifest.json (its "files" section)
    stem, _, tag = path.stem.rpartition(".")
    if stem:
        main = path.with_name(f"{stem}{path.suffix}{MANIFEST_SUFFIX}")
        if main.is_file():
            manifest = _read_manifest(main)
            side = manifest.files.get(tag)
            if side is not None and side.file == path.name:
                return manifest, tag
    return None, None


def _read_manifest(path: Path) -> ExportManifest:
    from factory.export import ExportManifest

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the export manifest: {exc}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: cannot read the export manifest: {exc}") from exc
    if not isinstance(data, dict) or "format" not in data:
        raise ConfigError(f"{path}: field 'format': missing; not an export manifest")
    try:
        return ExportManifest.from_stored(data)
    except RecordError as exc:
        raise ConfigError(f"{path}: {exc}") from exc


# The columns that tell one format a trainer reads from another, where a file comes without its manifest.
_TELLING_COLUMNS = {"reward": {"chosen", "rejected"}, "reward-scalar": {"completion", "reward"}}


def _first_row_columns(path: Path, kind: str) -> set[str]:
    """The column names of ``path``'s first row (empty where it cannot be read: validation says why)."""
    try:
        if kind == "parquet":
            import pyarrow.parquet as pq

            return set(pq.read_schema(path).names)
        with path.open(encoding="utf-8") as handle:
            for line in handle:
                if line.strip():
                    row = json.loads(line)
                    return set(row) if isinstance(row, dict) else set()
    except (OSError, ValueError, ImportError):
        pass
    return set()


def _format_by_columns(path: Path, kind: str, expected: tuple[str, ...]) -> str:
    """Which of ``expected`` a file without a manifest follows, told by its columns (the first, where none tells)."""
    if len(expected) > 1:
        columns = _first_row_columns(path, kind)
        for fmt in expected:
            telling = _TELLING_COLUMNS.get(fmt)
            if telling and telling <= columns:
                return fmt
    return expected[0]


def load_training_data(path: str | Path, expected: str | tuple[str, ...]) -> TrainingData:
    """Validate and load an export file for a trainer.

    Args:
        path: A ``.jsonl`` or ``.parquet`` file written by ``factory export`` (or following its format).
        expected: The format(s) this trainer reads; ``reward-scalar`` is the reward format's scalar file.

    Raises:
        ConfigError: Missing file, wrong format for this trainer (per the manifest), unreadable manifest.
        ExportValidationError: Rows that break the format, each named by file, line and field.
    """
    path = Path(path)
    expected = (expected,) if isinstance(expected, str) else tuple(expected)
    if not path.is_file():
        raise ConfigError(f"--data {path}: no such file (write one with: factory export {expected[0]} ...)")
    kind = file_kind(path)
    manifest, tag = _manifest_for(path)
    warnings: list[str] = []
    if manifest is not None:
        fmt = f"{manifest.format}-{tag}" if tag else manifest.format
        if fmt not in expected:
            raise ConfigError(f"{path}: field 'format': the manifest says {fmt!r}, this trainer reads "
                              f"{' or '.join(repr(e) for e in expected)}")
        recorded = manifest.file_sha256 if tag is None else manifest.files[tag].sha256
    else:
        fmt, recorded = _format_by_columns(path, kind, expected), None
        warnings.append(f"{path}: no export manifest beside it; provenance (dataset hash, runs) is not recorded")
    validate_file(path, fmt)
    digest = "sha256:" + file_sha256(path)  # the manifest's spelling
    if recorded and recorded != digest:
        warnings.append(f"{path}: changed since it was exported ({digest[:19]}... here, {recorded[:19]}... in the "
                        "manifest)")
    if manifest is not None and manifest.powered is False:
        # Say which: a run ordered by the objective outcome has no test at all, which is not the same as a weak one.
        why = "; ".join(manifest.evidence_tests) or "see the manifest's runs"
        warnings.append(f"{path}: no powered evidence test behind this export's ranking ({why})")
    import datasets

    # A throwaway cache: the rows are small next to a model, and nothing is left in ~/.cache.
    with tempfile.TemporaryDirectory(prefix="factory-data-") as cache:
        dataset = datasets.load_dataset("json" if kind == "jsonl" else "parquet", data_files=str(path),
                                        split="train", cache_dir=cache, keep_in_memory=True)
    return TrainingData(path, fmt, dataset, manifest, digest, warnings)
