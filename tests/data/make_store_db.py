"""Write a small real `factory` database: the golden file that ``tests/store/test_records.py`` reads.

Usage (from the repository root, with bubblewrap installed)::

    .venv/bin/python -m tests.data.make_store_db tests/data/store-vN.duckdb

It drives the real CLI, as a user would: ``factory fork`` of four tasks x
four branches with the scripted ``replay:`` policy in bwrap sandboxes, every
branch verified (tests, answer, a 2-sample ``replay:`` judge), winners kept in
memory (hashing embedder); ``factory rank`` with the judge's pairwise
comparisons; then a second, memory-primed run. So the file holds every table
and every kind of stored record: run manifests (with and without memory),
every event kind, workspace snapshots, verdicts, scalar and pairwise judge
samples, rankings and memories.

A committed golden file is never regenerated: it stands for the databases the
version that wrote it left behind. When the schema or a record changes, write
a new file (the next N) with the new code and keep the old one, so the tests
keep proving that old databases open and read. ``store-v6.duckdb`` was written
by factory at commit f81345c (migrations 0001-0006, records not yet versioned).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import duckdb
from click.testing import CliRunner

from factory.cli import main
from tests._runs import FACTORIAL_FILES, FACTORIAL_TESTS, REPLIES

TASKS = [
    {"id": "add", "prompt": "What is 17 + 25? Reply as `Final: <n>`.", "answer": "42"},
    {"id": "mul", "prompt": "What is 12 * 13? Reply as `Final: <n>`.", "answer": "156"},
    {"id": "fix-factorial", "prompt": "factorial(0) returns 0. Fix solution.py so the tests pass.",
     "files": FACTORIAL_FILES, "tests": FACTORIAL_TESTS, "test_command": "python -m pytest -q"},
    {"id": "haiku", "prompt": "Write a haiku about rain.",
     "rubric": "Three lines of 5, 7 and 5 syllables, about rain."},
]
POLICY = [
    *REPLIES,
    {"prompt_contains": "haiku about rain", "response": {"text": "Soft rain on the roof\nthe gutters hum a low tune\n"
                                                                 "puddles hold the sky"}},
    {"prompt_contains": "haiku about rain", "response": {"text": "Rain."}},
]
JUDGE = [  # the sample's seed picks among matches: sample 0 scores 8, sample 1 scores 6
    {"prompt_contains": "You score one candidate", "response": {"text": json.dumps({"score": 8, "reason": "apt"})}},
    {"prompt_contains": "You score one candidate", "response": {"text": json.dumps({"score": 6, "reason": "thin"})}},
    {"prompt_contains": "You compare two candidate", "response": {"text": json.dumps({"preference": "A",
                                                                                     "reason": "fuller"})}},
]


def _jsonl(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _factory(*args: str) -> None:
    result = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    if result.exit_code != 0:
        raise SystemExit(f"factory {' '.join(map(str, args))} failed:\n{result.output}")


def write_store(out: Path) -> None:
    """Write the database to ``out`` (refuses to overwrite: golden files are never regenerated)."""
    if out.exists():
        raise SystemExit(f"{out} exists; golden databases are never regenerated (write the next version instead)")
    with tempfile.TemporaryDirectory(prefix="factory-golden-") as tmp:
        folder = Path(tmp)
        db = folder / "store.duckdb"
        tasks = _jsonl(folder / "tasks.jsonl", TASKS)
        policy = f"replay:{_jsonl(folder / 'policy.jsonl', POLICY)}"
        judge = f"replay:{_jsonl(folder / 'judge.jsonl', JUDGE)}"
        common = ("--db", db, "--model", policy, "--sandbox", "bwrap", "--concurrency", "4",
                  "--memory", "--embedder", "hashing", "--json")
        _factory("fork", tasks, *common, "--run-id", "r1", "--branches", "4", "--judge", judge,
                 "--judge-samples", "2")
        _factory("rank", "r1", "--db", db, "--judge-pairs", "1", "--judge", judge, "--json")
        answers = _jsonl(folder / "answers.jsonl", TASKS[:2])
        _factory("fork", answers, *common, "--run-id", "r2", "--branches", "2")  # primed by r1's winners
        with duckdb.connect(str(db)) as con:  # everything in the file: no write-ahead log to ship
            con.execute("CHECKPOINT")
        if db.with_name(db.name + ".wal").exists():
            raise SystemExit("the database still has a write-ahead log after CHECKPOINT")
        shutil.copyfile(db, out)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    write_store(Path(sys.argv[1]))
