"""Typed, versioned records: their round trips, the upgrade of older shapes, and a committed old database.

``tests/data/store-v6.duckdb`` is a real run written by factory before records
were versioned (see ``tests/data/make_store_db.py``): it must open, every
stored record in it must read as its model, reading must lose nothing, and
the CLI must work on it.
"""

from __future__ import annotations

import json
import shutil
from datetime import datetime
from pathlib import Path

import polars as pl
import pytest
from pydantic import TypeAdapter

from factory.errors import RecordError
from factory.provenance import content_hash
from factory.rollouts import ForkConfig
from factory.store import (
    MIGRATIONS,
    BranchRecord,
    ErrorEvent,
    Event,
    JudgeCallEvent,
    RunManifest,
    RunStartEvent,
    Store,
    WorkspaceSnapshot,
    parse_event,
)
from factory.verifiers import Verdict

GOLDEN = Path(__file__).parents[1] / "data" / "store-v6.duckdb"
EVENT_KINDS = {"run_start", "model_call", "tool_call", "tool_result", "final_answer", "error", "judge_call", "verdict"}

MANIFEST = {
    "dataset_hash": "sha256:d", "task_file": "tasks.jsonl", "n_tasks": 2, "model": "replay:x", "branches": 2,
    "sampling": {"temperatures": [0.7, 0.7], "seeds": [0, 1], "max_tokens": 512},
    "agent": {"max_turns": 8, "max_tokens": 512, "single_turn": None, "tool_timeout_s": 60.0,
              "system_prompt": None, "summary_bytes": 800},
    "sandbox": "bwrap", "limits": {"timeout_s": 60.0},
    "memory": {"k": 3, "embedder": "hashing", "dim": 256, "backend": "duckdb", "memories_at_start": 0},
    "package_version": "0.1.0", "git_sha": None, "python": "3.11.7", "platform": "linux",
}


def test_a_record_is_stored_as_before_plus_its_version_and_reads_back_equal():
    manifest = RunManifest.from_stored(json.dumps(MANIFEST))
    stored = manifest.model_dump(mode="json")
    assert stored == {**MANIFEST, "schema_version": 1}
    assert RunManifest.from_stored(json.dumps(stored)) == manifest
    assert manifest.memory is not None and manifest.memory.model_dump()["embedder"] == "hashing"


def test_config_hash_is_the_hash_the_unversioned_manifest_gave():
    keys = ("dataset_hash", "model", "branches", "sampling", "agent", "sandbox", "limits", "memory")
    assert RunManifest.from_stored(MANIFEST).config_hash() == content_hash({k: MANIFEST[k] for k in keys})


def test_an_unversioned_document_reads_as_version_1_with_later_fields_defaulted():
    old = {k: v for k, v in MANIFEST.items() if k != "memory"}  # written before memory priming existed
    manifest = RunManifest.from_stored({**old, "retired_key": 1})
    assert (manifest.schema_version, manifest.memory) == (1, None)
    assert WorkspaceSnapshot.from_stored({"files": {"a.py": "x"}, "deleted": []}).skipped == []
    start = parse_event({"seq": 0, "ts": datetime(2026, 1, 1), "kind": "run_start", "payload": json.dumps(
        {"task_id": "t", "model": "m", "temperature": 0.7, "seed": 0, "mode": "tools", "max_turns": 8,
         "system_prompt": "s"})})
    assert isinstance(start, RunStartEvent) and start.primer is None


@pytest.mark.parametrize("bad", [
    {"schema_version": 3},  # a newer factory wrote it
    {"schema_version": 1, "files": {"a.py": 3}},  # not the shape
    "[1, 2]",  # not an object
    "{not json",
])
def test_what_cannot_be_read_is_a_record_error(bad):
    with pytest.raises(RecordError, match="WorkspaceSnapshot"):
        WorkspaceSnapshot.from_stored(bad if isinstance(bad, str) else json.dumps(bad))


def test_a_newly_written_record_refuses_unknown_fields():
    with pytest.raises(ValueError, match="extra"):
        ErrorEvent(seq=0, ts=datetime(2026, 1, 1), type="x", message="y", typo=1)


def test_events_are_told_apart_by_kind():
    row = JudgeCallEvent(seq=4, ts=datetime(2026, 1, 1), verifier="judge", version="1", sample_index=0, score=8.0,
                         status="ok", reason="fine", raw="{}", model="replay:j", prompt_version="1",
                         latency_s=0.01).row()
    assert set(row) == {"seq", "ts", "kind", "payload"} and row["kind"] == "judge_call"
    assert row["payload"]["schema_version"] == 1 and "seq" not in row["payload"]
    assert isinstance(parse_event(row), JudgeCallEvent) and parse_event(row).score == 8.0
    # the union validates an event by its kind, as any pydantic model field typed ``Event`` would
    as_model = TypeAdapter(Event).validate_python({**row["payload"], "seq": 4, "ts": row["ts"], "kind": "judge_call"})
    assert as_model == parse_event(row)
    with pytest.raises(RecordError, match="unknown kind"):
        parse_event({**row, "kind": "teleport"})
    with pytest.raises(RecordError, match="RunStartEvent"):
        parse_event({**row, "kind": "run_start"})


# ------------------------------------------------------------------ the committed old database


@pytest.fixture
def golden(tmp_path: Path) -> Path:
    """A copy of the committed database (opening it read-write migrates it; the original stays as committed)."""
    db = tmp_path / "store.duckdb"
    shutil.copyfile(GOLDEN, db)
    return db


def test_the_committed_database_opens_and_is_brought_up_to_date(golden):
    with Store.open(golden) as store:
        assert store.migrations() == [m.name for m in MIGRATIONS]
        assert set(store.runs()["run_id"]) == {"r1", "r2"}
        assert store.branches("r1").height == 16 and store.branches("r2").height == 4


def test_every_record_in_the_committed_database_reads_and_loses_nothing(golden):
    with Store.open(golden) as store:
        kinds = set()
        for run in store.runs().iter_rows(named=True):
            manifest = RunManifest.from_stored(run["config"])
            assert manifest.model_dump(mode="json") == {**json.loads(run["config"]), "schema_version": 1}
            assert manifest.config_hash() == run["config_hash"]  # the hash the old code recorded
            config = ForkConfig.from_manifest(run["config"], concurrency=2)
            assert (config.branches, config.sandbox) == (run["n_branches"], "bwrap")
            for row in store.branches(run["run_id"]).iter_rows(named=True):
                branch = BranchRecord.from_row(row)
                if row["workspace"] is not None:
                    # version 1 as stored, read with version 2's (empty) link and special-file records
                    assert branch.workspace.model_dump(mode="json") == {**json.loads(row["workspace"]),
                                                                        "schema_version": 1, "symlinks": {},
                                                                        "special": {}}
            for row in store.events(run["run_id"]).iter_rows(named=True):
                event = parse_event(row)
                kinds.add(event.kind)
                stored = {**json.loads(row["payload"]), "schema_version": 1}
                if event.kind == "tool_call":  # stored before the way each call arrived was recorded
                    stored = {**stored, "origin": None}
                assert event.payload() == stored
            for row in store.verdicts(run["run_id"]).iter_rows(named=True):
                verdict = Verdict.from_row(row)
                for sample, stored in zip(verdict.judge_samples, json.loads(row["details"]).get("samples", [])):
                    assert sample.model_dump(mode="json") == {**stored, "schema_version": 1}
        assert kinds == EVENT_KINDS - {"error"}  # every branch of the golden run ended cleanly
        assert manifest.memory is not None and manifest.memory.k == 3  # r2 was primed
        primed = [parse_event(r) for r in store.events("r2").iter_rows(named=True) if r["kind"] == "run_start"]
        assert all(e.primer for e in primed)
        judgments = store.judgments("r1")
        assert set(judgments["kind"]) == {"scalar", "pairwise"}
        assert store.verdicts("r1").filter(pl.col("verifier") == "judge").height == 4


def test_the_current_code_writes_the_same_shapes_plus_the_version(golden, exported_run):
    """A run stored now has the keys the old database has, plus ``schema_version``, kind by kind."""

    def shapes(db: Path, run_id: str) -> tuple[set[str], dict[str, set[str]]]:
        with Store.open(db, read_only=True) as store:
            manifest = set(json.loads(store.run(run_id)["config"]))
            keys: dict[str, set[str]] = {}
            for row in store.events(run_id).iter_rows(named=True):
                keys.setdefault(row["kind"], set()).update(json.loads(row["payload"]))
            return manifest, keys

    old_manifest, old_events = shapes(golden, "r1")
    new_manifest, new_events = shapes(exported_run, "r1")
    # the execution backend is recorded since the committed database was written (absent there: local)
    assert new_manifest == old_manifest | {"schema_version", "backend"}
    shared = set(old_events) & set(new_events)
    assert shared >= {"run_start", "model_call", "tool_call", "tool_result", "final_answer", "verdict"}
    added = {"tool_call": {"origin"}}  # recorded since the committed database was written (read as None there)
    for kind in shared:
        assert new_events[kind] == old_events[kind] | {"schema_version"} | added.get(kind, set()), kind


def test_the_cli_works_on_the_committed_database(golden, cli, tmp_path):
    runs = json.loads(cli("runs", "--db", golden, "--json").output)
    assert {r["run_id"] for r in runs} == {"r1", "r2"}
    ranked = cli("rank", "r1", "--db", golden, "--json")
    assert ranked.exit_code == 0 and len(json.loads(ranked.output)["ranked"]) == 16
    out = tmp_path / "sft.jsonl"
    exported = cli("export", "sft", "--run", "r1", "--db", golden, "--out", out, "--json")
    assert exported.exit_code == 0 and json.loads(exported.output)["manifest"]["rows"] > 0
    assert cli("export", "validate", out, "--format", "sft").exit_code == 0
    # re-verifying rebuilds each branch's sandbox from its old workspace snapshot: the same outcomes again
    with Store.open(golden, read_only=True) as store:
        stored = store.verdicts("r1").filter(pl.col("verifier") == "tests")
    verified = cli("verify", "run", "r1", "--db", golden, "--verifier", "tests", "--json")
    assert verified.exit_code == 0, verified.output
    summary = json.loads(verified.output)
    assert (summary["verified"], summary["passed"]) == (stored.height, stored["ok"].sum()) == (4, 1)
