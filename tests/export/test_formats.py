"""The export-format extension point: a format of our own, registered by name, exports like the built-ins."""

from __future__ import annotations

import json

import polars as pl
import pytest

from factory.errors import ConfigError
from factory.export import (
    EXPORT_FORMATS,
    MANIFEST_SUFFIX,
    ExportFormat,
    ExportOptions,
    ExportRows,
    ExportSource,
    create_format,
    export,
    format_names,
    register_format,
)
from factory.store import Store


class AnswersFormat:
    """One row per clean branch: the task prompt and the branch's final answer, labelled by its objective pass."""

    name = "answers"
    trainer = "SFTTrainer"
    columns = {"prompt": "text", "answer": "text", "passed": "bool"}

    def build(self, source: ExportSource, options: ExportOptions) -> ExportRows:
        clean = source.branches.filter(~pl.col("hack_detected") & pl.col("final_answer").is_not_null())
        rows = clean.select(pl.col("task_prompt").alias("prompt"), pl.col("final_answer").alias("answer"),
                            pl.col("objective_pass").fill_null(False).alias("passed"))
        return ExportRows(rows, stats={"branches": source.branches.height, "clean": clean.height})


@pytest.fixture
def answers_format(monkeypatch):
    monkeypatch.setattr(EXPORT_FORMATS, "_entries", dict(EXPORT_FORMATS._entries))  # registered for this test only
    register_format("answers", AnswersFormat)


def test_the_built_in_formats_are_registered():
    assert format_names() == sorted(["dpo", "kto", "reward", "sft", "grpo", "ppo", "hints", "spans"]) \
        == EXPORT_FORMATS.names()
    for name in format_names():
        fmt: ExportFormat = create_format(name)
        assert callable(fmt.build) and fmt.name == name and fmt.columns
        # a TRL trainer's name, or (hints, spans: read by our own trainers) the command that trains on it
        assert fmt.trainer.endswith("Trainer") or fmt.trainer.startswith("factory train ")


def test_a_format_of_our_own_is_exported_by_name(answers_format, exported_run, tmp_path):
    assert "answers" in format_names() and isinstance(create_format("answers"), AnswersFormat)
    out = tmp_path / "answers.jsonl"
    with Store.open(exported_run, read_only=True) as store:
        export(store, "answers", ["r1"], out)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows and all(set(row) == {"prompt", "answer", "passed"} for row in rows)
    assert {"Final: 42", "Final: 41"} <= {row["answer"] for row in rows}
    assert any(row["passed"] for row in rows) and not all(row["passed"] for row in rows)
    manifest = json.loads((tmp_path / ("answers.jsonl" + MANIFEST_SUFFIX)).read_text())
    assert manifest["format"] == "answers" and manifest["trainer"] == "trl.SFTTrainer"
    assert manifest["counts"]["branches"] == 12 and manifest["counts"]["clean"] == len(rows)


def test_an_unknown_format_lists_the_registered_ones(exported_run, tmp_path):
    with pytest.raises(ConfigError, match="dpo"):
        create_format("no-such-format")
    with Store.open(exported_run, read_only=True) as store, pytest.raises(ConfigError, match="grpo"):
        export(store, "no-such-format", ["r1"], tmp_path / "x.jsonl")
    assert not (tmp_path / "x.jsonl").exists()
