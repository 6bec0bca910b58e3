"""``ExportManifest``: what an export file depends on and what was done to its rows (``FILE.manifest.json``).

Written by :func:`~factory.export.export`, read by the dataset card and by
every trainer. Reading one imports neither polars nor the store (only
pydantic), so a trainer checks its data as lightly as a plain TRL script.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from factory.records import Record, RecordPart

__all__ = ["ExportManifest"]


class SideFile(RecordPart):
    """A side file of an export (the reward format's scalar file)."""

    file: str
    sha256: str


class ExportedRun(RecordPart):
    """One run an export drew from.

    Attributes:
        run_id: The run.
        dataset_hash: Hash of its tasks.
        config_hash: Hash of its result-determining settings.
        model: Its policy's model spec.
        ranked_at_export: Whether the export ranked it (it had no stored ranking).
        ranking: Its ranking's statistics (None: not ranked): the evidence test of the judge's signal with
            its n, or the reason no test applies; the objective outcomes (pass rates, usable pairs, pass@k;
            the run's figures, without a per-task list, so a manifest's size does not grow with the run's:
            ``factory rank`` gives each task's); the definitions used (see ``factory.ranking``).
    """

    run_id: str
    dataset_hash: str | None = None
    config_hash: str | None = None
    model: str | None = None
    ranked_at_export: bool = False
    ranking: dict[str, Any] | None = None


class KTOBalance(RecordPart):
    """KTO's class balance, and the class weights that equalize it (what ``factory train kto`` reads)."""

    desirable: int
    undesirable: int
    desirable_share: float
    desirable_weight: float
    undesirable_weight: float


class ExportManifest(Record):
    """The manifest written beside an export file.

    Every field but ``format`` has a default, so a manifest written before
    manifests were versioned (some fields came later) or by hand for a file
    made elsewhere still reads; the exporter always sets every one.

    Attributes:
        format: The export format (``dpo``, ``kto``, ``reward``, ``sft``, ``grpo``).
        trainer: The TRL trainer that reads the file as is (``trl.DPOTrainer``...).
        file: The data file's name.
        file_sha256: Its digest (``sha256:<hex>``).
        files: Side files by tag (``scalar``).
        rows: Rows in the file.
        columns: Its columns.
        conversational: Message lists (True) or plain strings.
        strategy: The pair strategy (pair formats only).
        filters: The options that shaped the rows, ``rolling`` included.
        options_hash: Hash of the format and those options.
        runs: The runs drawn from.
        run_ids: Their ids, oldest iteration first.
        dataset_hash: The tasks' hash when every run shares one.
        dataset_hashes: Every run's tasks' hash.
        config_hash: The run's config hash (one run only).
        config_hashes: Every run's config hash.
        counts: Branches, tasks, and the format's own counts.
        length_bias: Chosen-longer share and length ratio of the pairs (pair formats).
        judge_objective_agreement: How the judge agrees with the objective verdicts.
        powered: Every run's evidence test is powered (False where a run has none; None: not recorded).
        evidence: In every run a signal other than the objective (the judge) predicts the objective
            outcome: powered, significant and in the right direction. False where no test applies
            (an order by the objective outcome itself); ``evidence_tests`` says which (None: not recorded).
        evidence_tests: One line per run: the test, its n and result, or why none applies.
        created_at: When (ISO 8601, UTC).
        factory_version: The factory version that wrote it.
        git_sha: The factory checkout's commit, when known.
        kto: KTO's class balance and weights (the kto format only; absent from the file otherwise).
    """

    schema_version: Literal[1] = 1
    format: str
    trainer: str | None = None
    file: str | None = None
    file_sha256: str | None = None
    files: dict[str, SideFile] = Field(default_factory=dict)
    rows: int | None = None
    columns: list[str] = Field(default_factory=list)
    conversational: bool | None = None
    strategy: str | None = None
    filters: dict[str, Any] = Field(default_factory=dict)
    options_hash: str | None = None
    runs: list[ExportedRun] = Field(default_factory=list)
    run_ids: list[str] = Field(default_factory=list)
    dataset_hash: str | None = None
    dataset_hashes: list[str] = Field(default_factory=list)
    config_hash: str | None = None
    config_hashes: list[str | None] = Field(default_factory=list)
    counts: dict[str, Any] = Field(default_factory=dict)
    length_bias: dict[str, Any] | None = None
    judge_objective_agreement: dict[str, Any] = Field(default_factory=dict)
    powered: bool | None = None
    evidence: bool | None = None
    evidence_tests: list[str] = Field(default_factory=list)
    created_at: str | None = None
    factory_version: str | None = None
    git_sha: str | None = None
    kto: KTOBalance | None = None

    def document(self) -> dict[str, Any]:
        """The manifest as the JSON object written to the file (``kto`` only where it applies)."""
        return self.model_dump(mode="json", exclude={"kto"} if self.kto is None else None)
