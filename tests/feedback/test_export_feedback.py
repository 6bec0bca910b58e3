"""``factory export hints|spans``: accepted feedback only, the row contract, validation, and the golden samples.

The golden samples in ``tests/data/feedback`` are also the fixtures the trainers' tests read (``factory train
hint``, ``rw-sft``, ``span-kto``). Regenerate after an intended format change with
``FACTORY_REGEN_GOLDEN=1 pytest tests/feedback/test_export_feedback.py`` and review the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from factory.errors import ExportValidationError
from factory.export import export, validate_file
from factory.store import Store, feedback_id
from tests.export.test_golden import normalized
from tests.feedback.conftest import RUN, invoke

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "feedback"
TASK = "fix-factorial"


def ok(result) -> str:
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module")
def exported(feedback_run, tmp_path_factory) -> Path:
    """Every proposal accepted, one overridden, a person's span added and a person's hint rejected; both exports."""
    folder = tmp_path_factory.mktemp("feedback-export")
    db = folder / "run.duckdb"
    db.write_bytes(feedback_run.read_bytes())
    proposals = json.loads(ok(invoke("feedback", "propose", RUN, "--db", db, "--json")))["proposals"]
    result = invoke("export", "hints", "--run", RUN, "--db", db, "--out", folder / "none.jsonl")
    assert result.exit_code == 1 and "nothing to export: no accepted feedback with a hint" in result.output
    ok(invoke("feedback", "accept", *[p["feedback_id"] for p in proposals], "--db", db))
    ok(invoke("feedback", "override", feedback_id(RUN, TASK, 2, turn=0, source="verifier"), "--hint",
              "factorial(0) must return 1: the base case is still wrong.", "--db", db))
    ok(invoke("feedback", "add", RUN, TASK, 2, "--span", "4:6", "--polarity", "negative",
              "--note", "submitted without running the tests", "--db", db))
    ok(invoke("feedback", "add", RUN, TASK, 0, "--turn", 2, "--polarity", "negative", "--hint", "Never exported.",
              "--db", db))
    ok(invoke("feedback", "reject", feedback_id(RUN, TASK, 0, turn=2, source="user"), "--db", db))
    for fmt in ("hints", "spans"):
        ok(invoke("export", fmt, "--run", RUN, "--db", db, "--out", folder / f"{fmt}.jsonl"))
    if os.environ.get("FACTORY_REGEN_GOLDEN"):
        GOLDEN.mkdir(parents=True, exist_ok=True)
        for fmt in ("hints", "spans"):
            (GOLDEN / f"{fmt}.jsonl").write_text((folder / f"{fmt}.jsonl").read_text())
    return folder


@pytest.mark.parametrize("fmt", ["hints", "spans"])
def test_a_fresh_export_matches_the_golden_sample_and_validates(exported, fmt):
    assert normalized(exported / f"{fmt}.jsonl") == normalized(GOLDEN / f"{fmt}.jsonl")
    assert validate_file(GOLDEN / f"{fmt}.jsonl", fmt) == validate_file(exported / f"{fmt}.jsonl", fmt)
    manifest = json.loads((exported / f"{fmt}.jsonl.manifest.json").read_text())
    assert manifest["format"] == fmt and manifest["trainer"].startswith("factory train ")
    assert manifest["counts"]["accepted_feedback"] == 6 and manifest["run_ids"] == [RUN]
    assert f"## `{fmt}.jsonl`" in (exported / "README.md").read_text()


def test_hints_rows_hold_the_turn_the_hint_and_accepted_feedback_only(exported):
    rows = [json.loads(line) for line in (exported / "hints.jsonl").read_text().splitlines()]
    assert [(r["branch_index"], r["turn"]) for r in rows] == [(0, 0), (1, 0), (1, 1), (2, 0)]
    assert "Never exported." not in {r["hint"] for r in rows}  # rejected
    for row in rows:
        assert row["teacher_prompt"] == [*row["prompt"], {"role": "user", "content": "Hint: " + row["hint"],
                                                          "name": None, "tool_call_id": None, "tool_calls": None}]
        assert sum(m["role"] == "assistant" for m in row["prompt"]) == row["turn"]
        assert [m["role"] for m in row["completion"]] == ["assistant"]
    tool_error = rows[1]["completion"][0]["tool_calls"][0]["function"]
    assert (tool_error["name"], json.loads(tool_error["arguments"])) == ("read_file", {"path": "helpers.py"})
    assert rows[3]["hint"] == "factorial(0) must return 1: the base case is still wrong."  # the override


def test_spans_rows_give_every_message_a_polarity(exported):
    rows = {r["branch_index"]: r for r in map(json.loads, (exported / "spans.jsonl").read_text().splitlines())}
    assert rows[0]["polarity"] == ["neutral", "neutral", "negative", "neutral", "positive", "neutral", "neutral",
                                   "neutral"]
    assert rows[2]["spans"] == [{"start": 2, "end": 3, "polarity": "negative", "source": "verifier"},
                                {"start": 4, "end": 6, "polarity": "negative", "source": "user"}]
    assert rows[2]["polarity"] == ["neutral", "neutral", "negative", "neutral", "negative", "neutral"]  # tool: neutral
    for row in rows.values():
        assert len(row["polarity"]) == len(row["messages"])


def test_validation_names_rows_that_break_the_contract(tmp_path):
    hints = [json.loads(line) for line in (GOLDEN / "hints.jsonl").read_text().splitlines()]
    spans = [json.loads(line) for line in (GOLDEN / "spans.jsonl").read_text().splitlines()]
    hints[0]["teacher_prompt"] = hints[0]["prompt"]
    hints[1]["turn"] = 3
    spans[0]["polarity"][3] = "negative"  # a tool message
    spans[1]["polarity"] = spans[1]["polarity"][:-1]
    spans[2]["spans"][0]["end"] = 99
    for fmt, rows in (("hints", hints), ("spans", spans)):
        (tmp_path / f"{fmt}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ExportValidationError) as caught:
        validate_file(tmp_path / "hints.jsonl", "hints")
    assert caught.value.problems == [
        f"{tmp_path / 'hints.jsonl'}:1: field 'teacher_prompt': must be 'prompt' plus a last user message "
        "'Hint: ' + 'hint'",
        f"{tmp_path / 'hints.jsonl'}:2: field 'turn': 3, but 'prompt' holds 0 assistant message(s) before the turn"]
    with pytest.raises(ExportValidationError) as caught:
        validate_file(tmp_path / "spans.jsonl", "spans")
    problems = "\n".join(caught.value.problems)
    assert ":1: field 'polarity[3]': a tool message is never in a loss: must be neutral, got negative" in problems
    assert ":2: field 'polarity': 7 entries for 8 messages" in problems
    assert ":3: field 'spans[0]': expected 0 <= start < end <= 6" in problems


def test_parquet_files_hold_the_same_rows(exported):
    pq = pytest.importorskip("pyarrow.parquet")
    with Store.open(exported / "run.duckdb", read_only=True) as store:
        for fmt in ("hints", "spans"):
            result = export(store, fmt, [RUN], exported / "parquet" / f"{fmt}.parquet")
            assert validate_file(result.path, fmt) == result.manifest.rows
            jsonl = [json.loads(line) for line in (exported / f"{fmt}.jsonl").read_text().splitlines()]
            assert pq.read_table(result.path).to_pylist() == jsonl
