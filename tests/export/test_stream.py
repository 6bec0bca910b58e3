"""Streaming exports: slices of whole tasks, bounded, and the same files as the whole-frame build.

The store here is mid-sized and varied on purpose (written through the store's own write methods): two runs,
one ranked by ``factory rank`` (stored) and one ranked at export; tasks of 1 to 6 branches; passes, fails,
verifier errors, infrastructure failures, detected and suspected hacks, judge scores; single-turn and
multi-turn tool branches; tasks whose content repeats (for ``--dedupe``). Every format is exported streaming
in small slices and compared with what the format's ``build`` makes of the whole frame at once, written by
the plain writers: the JSONL byte for byte, the Parquet table for table, and the counts.
"""

from __future__ import annotations

import json
import random
from datetime import datetime, timedelta
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from factory.export import (
    ExportOptions,
    ExportStream,
    PairOptions,
    create_format,
    export,
    load_source,
    side_path,
    validate_file,
    write_rows,
)
from factory.store import Store

RUNS = ("s-ranked", "s-unranked")
TASKS = 24
START = datetime(2026, 1, 1)


def _trajectory(rng: random.Random, prompt: str, tools: bool, answer: str, reply: str) -> list[dict]:
    messages = [{"role": "system", "content": "You solve tasks."}, {"role": "user", "content": prompt}]
    for k in range(1 + len(reply) % 3 if tools else 0):
        call = {"id": f"call_{k}", "type": "function",
                "function": {"name": "write_file", "arguments": {"path": "a.py", "content": f"x = {k}"}}}
        messages += [{"role": "assistant", "content": f"step {k}", "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": f"call_{k}", "name": "write_file", "content": "ok"}]
    messages.append({"role": "assistant", "content": f"{reply}\nFinal: {answer}"})
    return messages


def _write_run(store: Store, run_id: str, seed: int, *, ranked: bool) -> None:
    rng = random.Random(seed)
    store.write_run({"run_id": run_id, "created_at": START, "finished_at": START + timedelta(hours=1),
                     "status": "finished", "task_file": "t.jsonl", "dataset_hash": "sha256:d", "config_hash":
                     f"sha256:{run_id}", "model": "replay:x", "sandbox": "none", "n_branches": 6, "config": {}})
    tasks, branches, events, verdicts, rankings = [], [], [], [], []
    for t in range(TASKS):
        task_id = f"t{t:03d}"
        prompt = f"task {t % 18}: what is {t % 18} + 1?"  # 6 tasks repeat an earlier one's content
        spec = {"id": task_id, "prompt": prompt, "answer": str(t % 18 + 1), "verifiers": ["answer"]}
        if t % 7 == 0:
            spec["solution"] = "never exported"
        tasks.append({"run_id": run_id, "task_id": task_id, "task_hash": f"h{t}", "prompt": prompt,
                      "verifiers": ["answer"], "spec": spec})
        tools = t % 3 == 0
        for b in range(rng.randint(1, 6)):
            status = "infra_error" if rng.random() < 0.06 else "ok"
            passed = rng.random() < 0.5
            answer = str(t % 18 + 1) if passed else str(t % 18 + 2 + b)
            reply = f"reply {b} " * (1 + (t % 18 + b) % 5)  # the same in a task that repeats another
            key = {"run_id": run_id, "task_id": task_id, "branch_index": b}
            branches.append({**key, "session_id": f"{run_id}-{task_id}-{b}", "rollout_id": task_id,
                             "temperature": 0.8, "seed": b, "model": "replay:x", "status": status,
                             "final_answer": answer, "input_tokens": 10, "output_tokens": 5,
                             "trajectory": _trajectory(rng, prompt, tools, answer, reply),
                             "started_at": START, "finished_at": START})
            events.append({**key, "seq": 0, "ts": START, "kind": "run_start",
                           "payload": {"mode": "tools" if tools else "single-turn"}})
            if status != "ok":
                continue
            verdict_status = "error" if rng.random() < 0.05 else ("pass" if passed else "fail")
            details = {"hack_detected": rng.random() < 0.08, "hack_suspected": rng.random() < 0.05}
            verdicts.append({**key, "verifier": "answer", "version": "1", "ok": passed, "score": float(passed),
                             "status": verdict_status, "details": details, "created_at": START})
            if rng.random() < 0.5:
                verdicts.append({**key, "verifier": "judge", "version": "2", "ok": True,
                                 "score": round(rng.random(), 3), "status": "pass", "details": {},
                                 "created_at": START})
            if ranked:
                strength = rng.gauss(0, 1)
                rankings.append({**key, "rank": 0, "reward": round(float(passed) + rng.random() / 10, 6),
                                 "strength": strength, "ci_low": strength - 0.5, "ci_high": strength + 0.5,
                                 "components": {}, "created_at": START})
    for task_ranks in _ranks(rankings):
        for rank, row in enumerate(task_ranks, start=1):
            row["rank"] = rank
    store.write_tasks(tasks)
    store.write_branches(branches, events)
    store.write_verdicts(verdicts)
    if rankings:
        store.write_rankings(rankings)


def _ranks(rankings: list[dict]) -> list[list[dict]]:
    by_task: dict[str, list[dict]] = {}
    for row in rankings:
        by_task.setdefault(row["task_id"], []).append(row)
    return [sorted(rows, key=lambda r: -r["reward"]) for rows in by_task.values()]


@pytest.fixture(scope="module")
def varied(tmp_path_factory) -> Path:
    db = tmp_path_factory.mktemp("stream") / "varied.duckdb"
    with Store.open(db) as store:
        _write_run(store, RUNS[0], 1, ranked=True)
        _write_run(store, RUNS[1], 2, ranked=False)
    return db


def test_slices_are_whole_tasks_bounded_in_size_and_add_up_to_the_whole_frame(varied):
    with Store.open(varied, read_only=True) as store:
        whole = load_source(store, RUNS, batch_branches=None)
        assert whole.batch_branches is None and len(list(whole.batches())) == len(RUNS)  # one slice per run
        frame = whole.branches
        for size in (9, 40):
            source = load_source(store, RUNS, batch_branches=size)
            slices = list(source.batches())
            most = source.max_branches_per_task
            assert all(0 < s.height < size + most for s in slices)  # closes at the first task past `size`
            keys = [set(s.select("run_id", "task_id").unique().iter_rows()) for s in slices]
            assert all(not (a & b) for i, a in enumerate(keys) for b in keys[i + 1:])  # a task is in one slice
            assert all(s["run_id"].n_unique() == 1 for s in slices)
            assert pl.concat(slices).equals(frame)
        assert frame.height == source.n_branches and "infra_error" not in frame["status"].to_list()


def test_the_store_counts_slices_and_outcomes_as_the_rows_it_holds(varied):
    """The slice bounds and per-task outcome counts come from DuckDB (no row per task or branch in Python)."""
    from factory.verifiers import opinion_verifiers

    with Store.open(varied, read_only=True) as store:
        for size in (None, 1, 9, 40, 10_000):
            want, before = [], {}  # closes at the first task that takes it to `size` branches or more
            for run_id, task_id, n in store.export_tasks(list(RUNS)).iter_rows():
                if want and want[-1][0] == run_id and (size is None or before[run_id] // size == want[-1][-1]):
                    want[-1][2:4] = [task_id, want[-1][3] + n]
                else:
                    want.append([run_id, task_id, task_id, n, 0 if size is None else before.get(run_id, 0) // size])
                before[run_id] = before.get(run_id, 0) + n
            rows = store.export_slices(list(RUNS), size)
            assert [list(r) for r in rows.select("run_id", "first_task", "last_task", "branches").iter_rows()] == \
                [w[:4] for w in want]
        source = load_source(store, RUNS, batch_branches=9)
        assert source.n_tasks == source.tasks.height and source.n_branches == int(source.tasks["branches"].sum())
        assert source.max_branches_per_task == int(source.tasks["branches"].max())
        for run_id in RUNS:
            records = store.branch_records(run_id, opinions=opinion_verifiers())
            passed = pl.col("objective_pass")
            want = (records.group_by("task_id").agg(
                passed.count().cast(pl.Int32).alias("verified"), passed.sum().cast(pl.Int32).alias("passed"),
                passed.null_count().cast(pl.Int32).alias("unverified"),
                pl.col("judge_score").count().cast(pl.Int32).alias("judge_scores"),
                pl.col("objective_score").count().cast(pl.Int32).alias("objective_scores"))
                .sort("task_id").drop("task_id"))
            counts = store.run_outcome_counts(run_id, opinions=opinion_verifiers())
            assert counts.equals(want) and counts["judge_scores"].sum() > 0


OPTIONS = {
    "default": ExportOptions(),
    "all-pairs": ExportOptions(pairs=PairOptions(strategy="all-pairs", hacks_as_rejected=True), dedupe=True),
    "filtered": ExportOptions(pairs=PairOptions(strategy="all-pairs"), top_confidence=0.5, length_balance=True),
    "standard": ExportOptions(conversational=False, sft_all_passing=True, dedupe=True,
                              pairs=PairOptions(strategy="pass-fail")),
}
CASES = [("dpo", "default"), ("dpo", "filtered"), ("reward", "standard"), ("kto", "default"), ("sft", "all-pairs"),
         ("grpo", "all-pairs")]


@pytest.mark.parametrize(("fmt", "case"), CASES)
def test_a_streamed_export_is_the_whole_frame_build_byte_for_byte(varied, tmp_path, fmt, case):
    options = OPTIONS[case]
    suffix = ".parquet" if case == "default" and fmt in ("dpo", "kto", "reward") else ".jsonl"
    out = tmp_path / f"{fmt}{suffix}"
    with Store.open(varied, read_only=True) as store:
        result = export(store, fmt, list(RUNS), out, options, batch_branches=30)
        whole = load_source(store, RUNS, batch_branches=None)
        assert isinstance(create_format(fmt).stream(whole, options), ExportStream)  # what export() wrote through
        reference = create_format(fmt).build(whole, options)
    write_rows(reference.rows, tmp_path / f"ref{suffix}")
    if suffix == ".jsonl":
        assert out.read_bytes() == (tmp_path / f"ref{suffix}").read_bytes()
    else:
        assert pq.read_table(out).equals(pq.read_table(tmp_path / f"ref{suffix}"))
    for tag, frame in reference.extra.items():
        write_rows(frame, tmp_path / f"ref.{tag}{suffix}")
        if suffix == ".jsonl":
            assert side_path(out, tag).read_bytes() == (tmp_path / f"ref.{tag}{suffix}").read_bytes()
        else:
            assert pq.read_table(side_path(out, tag)).equals(pq.read_table(tmp_path / f"ref.{tag}{suffix}"))
    manifest = json.loads(result.manifest_path.read_text())
    assert manifest["rows"] == reference.rows.height > 0 and manifest["columns"] == reference.rows.columns
    assert {k: manifest["counts"][k] for k in reference.stats} == json.loads(json.dumps(reference.stats))
    if fmt == "kto":
        assert manifest["kto"] == reference.manifest["kto"]
    assert validate_file(out, fmt) == reference.rows.height


def test_ppo_rows_are_the_scalar_reward_rows_under_their_own_name(varied, tmp_path, cli):
    ppo = tmp_path / "ppo.jsonl"
    done = cli("export", "ppo", "--runs", ",".join(RUNS), "--db", varied, "--out", ppo)
    assert done.exit_code == 0, done.output
    with Store.open(varied, read_only=True) as store:
        reward = export(store, "reward", list(RUNS), tmp_path / "reward.jsonl")
    assert ppo.read_bytes() == reward.extra_paths["scalar"].read_bytes()
    manifest = json.loads((tmp_path / "ppo.jsonl.manifest.json").read_text())
    assert manifest["format"] == "ppo" and manifest["trainer"] == "trl.RLOOTrainer"
    assert manifest["rows"] == manifest["counts"]["rows"] == validate_file(ppo, "ppo")
    assert cli("export", "validate", ppo, "--format", "ppo").exit_code == 0
    assert {"prompt", "completion", "reward", "components"} <= set(manifest["columns"])
    card = (tmp_path / "README.md").read_text()
    assert "## `ppo.jsonl`" in card and "- ppo" in card and "config_name: ppo" in card
