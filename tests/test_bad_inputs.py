"""Bad input to every command: a clean error, never a traceback, and the store as it was.

A catalogue of bad command lines — options out of range or not finite,
unknown names and runs, malformed files, URLs without a scheme — each run
through the real ``factory`` command, in-process, against one real store (the
run of tests/_runs.py: replay model, bwrap sandboxes, real verifiers). Each
case asserts what a user sees: the exit code (2 for bad input, 1 otherwise),
the first stderr line is ``error: ...`` naming the option, file, line or field,
no traceback, nothing written where an output was asked for, and every table
of the store holding exactly the rows it held before.

The cases that need a read-only folder run the command as a subprocess inside
a read-only bind mount (or a folder without write permission when not root).
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from factory.cli import main
from factory.store import Store


@dataclass(frozen=True)
class Case:
    """One bad command line.

    Attributes:
        argv: The arguments; ``{db}`` is the store, ``{files}`` the folder of prepared input files,
            ``{out}`` a folder no case may write in, ``{missing}`` a path that does not exist.
        code: The exit code expected.
        message: A fragment the ``error:`` line (or the problem line under it) must hold.
        lines: How many lines stderr holds: the error, plus one per problem for task and export files.
    """

    argv: str
    code: int
    message: str
    lines: int = 1


TASK = {"id": "add", "prompt": "What is 17 + 25? Reply as `Final: <n>`.", "answer": "42"}


def _task_files(folder: Path) -> None:
    def jsonl(name: str, *rows: object) -> None:
        (folder / name).write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))

    jsonl("tasks.jsonl", TASK)
    jsonl("solutions-unknown-id.jsonl", {"id": "nope", "files": {"solution.py": ""}})
    jsonl("solutions.jsonl", {"id": "add", "files": {"solution.py": ""}})
    jsonl("conflict.jsonl", {**TASK, "files": {"x": "a", "x/y": "b"}})
    jsonl("long-name.jsonl", {**TASK, "files": {"a" * 300 + ".py": ""}})
    jsonl("broken.jsonl", '{"id": "add", "prompt": ')
    jsonl("unknown-key.jsonl", {**TASK, "colour": "red"})
    jsonl("duplicate.jsonl", TASK, TASK)
    jsonl("escape.jsonl", {**TASK, "files": {"../up.py": ""}})
    jsonl("inactivity-zero.jsonl", {**TASK, "limits": {"inactivity_s": 0}})
    jsonl("inactivity-text.jsonl", {**TASK, "limits": {"inactivity_s": "long"}})
    (folder / "empty.jsonl").write_text("\n")
    latin1 = json.dumps({**TASK, "prompt": "caf\u00e9"}, ensure_ascii=False).encode("latin-1")
    (folder / "latin1.jsonl").write_bytes(latin1 + b"\n")
    (folder / "tasks.txt").write_text(json.dumps(TASK) + "\n")
    (folder / "bad.yaml").write_text("tasks:\n  - id: add\n    prompt: [unclosed\n")
    jsonl("golden.jsonl", {"id": "g1"})
    jsonl("replies.jsonl", {"prompt_contains": "17 + 25", "response": {"text": "Final: 42"}})
    (folder / "config.yaml").write_text("beta: 0.1\nbetta: 0.2\n")
    (folder / "not-a-store.duckdb").write_text("not a database\n")
    jsonl("feedback-bad.jsonl", {"run_id": "r1", "task_id": "add", "branch_index": 0, "turn": 0, "polarity": "bad"},
          {"run_id": "r1", "task_id": "add", "branch_index": 0, "turn": 0})


def _export_files(folder: Path, db: Path) -> None:
    from factory.export import export

    with Store.open(db, read_only=True) as store:
        for fmt in ("dpo", "kto"):
            export(store, fmt, ["r1"], folder / f"{fmt}.jsonl")
    (folder / "not-parquet.parquet").write_text("this is not a Parquet file\n")
    (folder / "bad-dpo.jsonl").write_text(json.dumps({"prompt": "p", "chosen": "a", "rejected": "b"}) + "\n"
                                          + json.dumps({"prompt": "p", "chosen": "", "rejected": "b"}) + "\n"
                                          + "not json\n")


def store_digest(db: Path) -> dict[str, str]:
    """sha256 of each table's rows, in a fixed order, read through the store."""
    with Store.open(db, read_only=True) as store:
        return {table: hashlib.sha256(repr(store.query(f'SELECT * FROM "{table}" ORDER BY ALL').rows()).encode())
                .hexdigest() for table in store.tables()}


@pytest.fixture(scope="module")
def world(exported_run: Path, tmp_path_factory) -> dict[str, Path]:
    """A copy of the real run's store, the input files, and a folder no case may write in."""
    root = tmp_path_factory.mktemp("bad-inputs")
    (root / "store").mkdir()
    db = root / "store" / "run.duckdb"
    shutil.copyfile(exported_run, db)
    files = root / "files"
    files.mkdir()
    _task_files(files)
    _export_files(files, db)
    out = root / "out"
    out.mkdir()
    return {"db": db, "files": files, "out": out, "missing": root / "missing"}


#: Every command, with input it must refuse.
CATALOGUE: dict[str, Case] = {
    # ---- fork: numbers finite and in range
    "fork-timeout-nan": Case("fork {files}/tasks.jsonl --db {db} --timeout nan", 2,
                             "Invalid value for '--timeout': 'nan' is not a finite number"),
    "fork-timeout-negative": Case("fork {files}/tasks.jsonl --db {db} --timeout -5", 2,
                                  "Invalid value for '--timeout': -5.0 is not in the range x>0"),
    "fork-timeout-zero": Case("fork {files}/tasks.jsonl --db {db} --timeout 0", 2, "'--timeout': 0.0"),
    "fork-timeout-inf": Case("fork {files}/tasks.jsonl --db {db} --timeout inf", 2,
                             "'--timeout': 'inf' is not a finite number"),
    "fork-branches-zero": Case("fork {files}/tasks.jsonl --db {db} --branches 0", 2, "'--branches' / '-n': 0"),
    "fork-concurrency-zero": Case("fork {files}/tasks.jsonl --db {db} -c 0", 2, "'--concurrency' / '-c'"),
    "fork-max-turns-zero": Case("fork {files}/tasks.jsonl --db {db} --max-turns 0", 2, "'--max-turns'"),
    "fork-max-tokens-negative": Case("fork {files}/tasks.jsonl --db {db} --max-tokens -1", 2, "'--max-tokens'"),
    "fork-threads-zero": Case("fork {files}/tasks.jsonl --db {db} --threads 0", 2, "'--threads': 0"),
    "fork-seed-not-a-number": Case("fork {files}/tasks.jsonl --db {db} --seed one", 2,
                                   "'--seed': 'one' is not a valid integer"),
    "fork-hack-penalty-over-1": Case("fork {files}/tasks.jsonl --db {db} --hack-penalty 1.5", 2,
                                     "'--hack-penalty': 1.5 is not in the range 0<=x<=1"),
    "fork-hack-penalty-nan": Case("fork {files}/tasks.jsonl --db {db} --hack-penalty nan", 2,
                                  "'--hack-penalty': 'nan' is not a finite number"),
    "fork-judge-samples-zero": Case("fork {files}/tasks.jsonl --db {db} --judge-samples 0", 2, "'--judge-samples'"),
    "fork-judge-budget-negative": Case("fork {files}/tasks.jsonl --db {db} --judge-budget -1", 2,
                                       "'--judge-budget'"),
    "fork-memory-k-zero": Case("fork {files}/tasks.jsonl --db {db} --memory-k 0", 2, "'--memory-k'"),
    "fork-temperatures-words": Case("fork {files}/tasks.jsonl --db {db} --temperatures hot", 2,
                                    "--temperatures: expected a list like 0.5,0.7"),
    "fork-temperatures-nan": Case("fork {files}/tasks.jsonl --db {db} --temperatures 0.5,nan", 2,
                                  "--temperatures: each temperature must be a finite number >= 0"),
    "fork-temperatures-negative": Case("fork {files}/tasks.jsonl --db {db} --temperatures=-1:2", 2,
                                       "--temperatures: each temperature must be a finite number >= 0"),
    "fork-temperatures-too-many": Case("fork {files}/tasks.jsonl --db {db} -n 2 --temperatures 0.1,0.2,0.3", 2,
                                       "--temperatures: 3 temperatures for 2 branch(es)"),
    "fork-request-timeout-zero": Case("fork {files}/tasks.jsonl --db {db} --request-timeout 0", 2,
                                      "'--request-timeout': 0.0 is not in the range x>0"),
    "fork-request-timeout-nan": Case("fork {files}/tasks.jsonl --db {db} --request-timeout nan", 2,
                                     "'--request-timeout': 'nan' is not a finite number"),
    # ---- fork: names, URLs, files
    "fork-base-url-without-scheme": Case(
        "fork {files}/tasks.jsonl --db {db} --model openai:m --base-url 127.0.0.1:8000/v1", 2,
        "'--base-url': base URL '127.0.0.1:8000/v1' is not an http(s) URL"),
    "fork-base-url-other-scheme": Case(
        "fork {files}/tasks.jsonl --db {db} --model openai:m --base-url ftp://127.0.0.1/v1", 2,
        "'--base-url': base URL 'ftp://127.0.0.1/v1' is not an http(s) URL"),
    "fork-unknown-sandbox": Case("fork {files}/tasks.jsonl --db {db} --sandbox nosuch", 2,
                                 "unknown sandbox 'nosuch'"),
    "fork-unknown-model": Case("fork {files}/tasks.jsonl --db {db} --model nosuch:x", 2,
                               "unknown model provider 'nosuch' in 'nosuch:x'"),
    "fork-unknown-judge": Case("fork {files}/tasks.jsonl --db {db} --model replay:{files}/replies.jsonl "
                               "--judge nosuch:x", 2, "unknown model provider 'nosuch'"),
    "fork-openai-without-key": Case("fork {files}/tasks.jsonl --db {db} --model openai:m", 2,
                                    "openai: set OPENAI_API_KEY, or pass --base-url"),
    "fork-unknown-embedder": Case("fork {files}/tasks.jsonl --db {db} --model replay:{files}/replies.jsonl "
                                  "--memory --embedder nosuch", 2, "unknown embedder 'nosuch'"),
    "fork-unknown-memory-backend": Case("fork {files}/tasks.jsonl --db {db} --model replay:{files}/replies.jsonl "
                                        "--memory --memory-backend nosuch", 2, "unknown memory backend 'nosuch'"),
    "fork-no-tasks": Case("fork --db {db}", 2, "give a TASKS file, or --resume RUN_ID"),
    "fork-run-id-and-resume": Case("fork {files}/tasks.jsonl --db {db} --run-id a --resume r1", 2,
                                   "--run-id and --resume are exclusive"),
    "fork-resume-unknown-run": Case("fork --db {db} --resume NOSUCH", 2, "no run NOSUCH in"),
    "fork-tasks-file-missing": Case("fork {missing}.jsonl --db {db}", 2, "cannot read file", lines=2),
    "fork-tasks-file-conflict": Case("fork {files}/conflict.jsonl --db {db}", 2,
                                     "files path 'x' is a file, but files path 'x/y' needs a folder there", lines=2),
    # ---- runs, query, db
    "runs-no-store": Case("runs --db {missing}.duckdb", 1, "no database at"),
    "runs-not-a-store": Case("runs --db {files}/not-a-store.duckdb", 1, "it is not a valid DuckDB database file"),
    "runs-compare-unknown-run": Case("runs --db {db} --compare r1 NOSUCH", 2, "--compare: no run 'NOSUCH'"),
    "query-syntax": Case("query 'SELEC 1' --db {db}", 2, "Parser Error"),
    "query-unknown-table": Case("query 'SELECT * FROM nosuch' --db {db}", 2, "Table with name nosuch does not exist"),
    "query-unknown-format": Case("query 'SELECT 1' --db {db} --format xml", 2, "'--format': 'xml' is not one of"),
    "query-no-sql": Case("query --db {db}", 2, "Missing argument 'SQL'"),
    "db-info-no-store": Case("db info --db {missing}.duckdb", 1, "no database at"),
    "db-migrate-no-folder": Case("db migrate --db {missing}/x.duckdb", 1, "directory"),
    "db-unknown-subcommand": Case("db nosuch", 2, "No such command 'nosuch'"),
    "unknown-command": Case("nosuch", 2, "No such command 'nosuch'"),
    # ---- tasks: every problem names its file, line and field
    "tasks-file-folder-conflict": Case("tasks validate {files}/conflict.jsonl", 2,
                                       "conflict.jsonl:1: files path 'x' is a file", lines=2),
    "tasks-name-too-long": Case("tasks validate {files}/long-name.jsonl", 2,
                                "long-name.jsonl:1: field 'files': file path 'aaaa", lines=2),
    "tasks-broken-json": Case("tasks validate {files}/broken.jsonl", 2, "broken.jsonl:1: invalid JSON", lines=2),
    "tasks-unknown-key": Case("tasks validate {files}/unknown-key.jsonl", 2,
                              "unknown-key.jsonl:1: field 'colour': unknown key", lines=2),
    "tasks-duplicate-id": Case("tasks validate {files}/duplicate.jsonl", 2,
                               "duplicate.jsonl:2: field 'id': duplicate id 'add'", lines=2),
    "tasks-path-escapes": Case("tasks validate {files}/escape.jsonl", 2,
                               "escape.jsonl:1: field 'files': file path '../up.py' must be relative", lines=2),
    "tasks-inactivity-zero": Case("tasks validate {files}/inactivity-zero.jsonl", 2,
                                  "inactivity-zero.jsonl:1: field 'limits.inactivity_s'", lines=2),
    "tasks-inactivity-not-a-number": Case("tasks validate {files}/inactivity-text.jsonl", 2,
                                          "inactivity-text.jsonl:1: field 'limits.inactivity_s'", lines=2),
    "tasks-empty": Case("tasks validate {files}/empty.jsonl", 2, "empty.jsonl: no tasks in file", lines=2),
    "tasks-not-utf8": Case("tasks validate {files}/latin1.jsonl", 2, "latin1.jsonl:1: file is not valid UTF-8",
                           lines=2),
    "tasks-unknown-extension": Case("tasks validate {files}/tasks.txt", 2, "unsupported task file type '.txt'",
                                    lines=2),
    "tasks-bad-yaml": Case("tasks validate {files}/bad.yaml", 2, "bad.yaml:4: invalid YAML: expected ',' or ']'",
                           lines=2),
    "tasks-missing-file": Case("tasks validate {missing}.jsonl", 2, "cannot read file", lines=2),
    "tasks-import-unknown-format": Case("tasks import nosuch {files}/tasks.jsonl --out {out}/t.jsonl", 2,
                                        "unknown task format 'nosuch'"),
    "tasks-import-missing-source": Case("tasks import gsm8k {missing}.jsonl --out {out}/t.jsonl", 2,
                                        "no such file or folder", lines=2),
    "tasks-import-bad-row": Case("tasks import gsm8k {files}/tasks.jsonl --out {out}/t.jsonl --no-check", 2,
                                 "tasks.jsonl:1: field 'question': required column is missing", lines=2),
    "view-no-store": Case("view --db {missing}.duckdb --bundle {out}/site", 1, "no database at"),
    "tasks-check-no-reference-solution": Case("tasks check {files}/tasks.jsonl", 2,
                                              "tasks.jsonl has a reference solution: add a `solution` field"),
    "tasks-check-solutions-unknown-id": Case(
        "tasks check {files}/tasks.jsonl --solutions {files}/solutions-unknown-id.jsonl", 2,
        "solutions-unknown-id.jsonl:1: field 'id': no task 'nope' in the task file", lines=2),
    "tasks-check-solutions-missing": Case("tasks check {files}/tasks.jsonl --solutions {missing}.jsonl", 2,
                                          "cannot read file", lines=2),
    "tasks-check-unknown-sandbox": Case(
        "tasks check {files}/tasks.jsonl --solutions {files}/solutions.jsonl --sandbox nosuch", 2,
        "--sandbox: unknown sandbox 'nosuch' (choose from: bwrap"),
    "tasks-check-timeout-nan": Case("tasks check {files}/tasks.jsonl --timeout nan", 2, "'--timeout'"),
    "tasks-check-jobs-zero": Case("tasks check {files}/tasks.jsonl --jobs 0", 2, "'--jobs': 0"),
    # ---- verify: unknown verifiers and runs are errors
    "verify-unknown-verifier": Case("verify run r1 --db {db} --verifier bogus", 2,
                                    "--verifier bogus: unknown verifier (choose from: answer"),
    "verify-judge-without-model": Case("verify run r1 --db {db} --verifier judge", 2,
                                       "--verifier judge: an opinion needs its model: give --judge MODEL"),
    "verify-unknown-run": Case("verify run NOSUCH --db {db}", 2, "no run NOSUCH in"),
    "verify-unknown-run-short-form": Case("verify NOSUCH --db {db}", 2, "no run NOSUCH in"),
    "verify-unknown-sandbox": Case("verify run r1 --db {db} --sandbox nosuch", 2,
                                   "--sandbox nosuch: unknown sandbox"),
    "verify-judge-samples-zero": Case("verify run r1 --db {db} --judge-samples 0", 2, "'--judge-samples'"),
    "verify-hack-penalty-nan": Case("verify run r1 --db {db} --hack-penalty nan", 2,
                                    "'--hack-penalty': 'nan' is not a finite number"),
    "verify-request-timeout-negative": Case("verify run r1 --db {db} --request-timeout=-1", 2,
                                            "'--request-timeout': -1.0 is not in the range x>0"),
    "calibrate-unknown-run": Case("verify calibrate NOSUCH --db {db}", 2, "no run NOSUCH in"),
    "golden-unknown-verifier": Case("verify golden --verifier bogus --correct {files}/golden.jsonl "
                                    "--exploits {files}/golden.jsonl", 2, "--verifier bogus: unknown verifier"),
    "golden-judge": Case("verify golden --verifier judge --correct {files}/golden.jsonl "
                         "--exploits {files}/golden.jsonl", 2, "--verifier judge: golden sets check objective"),
    "golden-missing-file": Case("verify golden --verifier tests --correct {missing}.jsonl "
                                "--exploits {files}/golden.jsonl", 2, "'--correct'"),
    "golden-bad-case": Case("verify golden --verifier answer --correct {files}/golden.jsonl "
                            "--exploits {files}/golden.jsonl --sandbox none", 2,
                            "golden.jsonl:1: field 'task': required field is missing", lines=2),
    # ---- rank and power
    "rank-unknown-run": Case("rank NOSUCH --db {db}", 2, "no run NOSUCH in"),
    "rank-judge-pairs-without-judge": Case("rank r1 --db {db} --judge-pairs 2", 2,
                                           "--judge-pairs needs --judge MODEL"),
    "rank-bootstrap-too-few": Case("rank r1 --db {db} --bootstrap 5", 2, "'--bootstrap': 5 is not in the range"),
    "rank-plot-not-an-image": Case("rank r1 --db {db} --plot {out}/plot.txt", 2, "cannot draw a .txt file"),
    "power-plot-not-an-image": Case("power --db {db} --runs r1 r1 --plot {out}/plot.txt", 2,
                                    "cannot draw a .txt file"),
    "rank-request-timeout-nan": Case("rank r1 --db {db} --judge-pairs 1 --judge openai:m --request-timeout nan", 2,
                                     "'--request-timeout': 'nan' is not a finite number"),
    "power-no-arms": Case("power --db {db}", 2, "give --runs R1 R2, or --by FIELD"),
    "power-unknown-run": Case("power --db {db} --runs r1 NOSUCH", 2, "no run NOSUCH in"),
    "power-unknown-field": Case("power --db {db} --run r1 --by colour --a 1 --b 2", 2, "unknown field 'colour'"),
    "power-alpha-out-of-range": Case("power --db {db} --runs r1 r1 --alpha 2", 2,
                                     "'--alpha': 2.0 is not in the range 0<x<1"),
    "power-target-delta-nan": Case("power --db {db} --runs r1 r1 --target-delta nan", 2,
                                   "'--target-delta': 'nan' is not a finite number"),
    "power-target-delta-over-100": Case("power --db {db} --runs r1 r1 --target-delta 150", 2,
                                        "'--target-delta': 150.0 is not in the range 0<x<=100"),
    "power-split-seed-not-a-number": Case("power --db {db} --run r1 --by temperature --select best-worst "
                                          "--split-seed x", 2, "'--split-seed': 'x' is not a valid integer"),
    # ---- export
    "export-unknown-run": Case("export dpo --db {db} --run NOSUCH --out {out}/a.jsonl", 1, "no run NOSUCH in"),
    "export-run-and-runs": Case("export dpo --db {db} --run r1 --runs r1 --out {out}/a.jsonl", 2,
                                "give exactly one of --run RUN or --runs"),
    "export-unknown-extension": Case("export dpo --db {db} --run r1 --out {out}/a.csv", 2,
                                     "export files end in .jsonl or .parquet"),
    "export-min-margin-nan": Case("export dpo --db {db} --run r1 --out {out}/a.jsonl --min-margin nan", 2,
                                  "'--min-margin': 'nan' is not a finite number"),
    "export-min-margin-negative": Case("export reward --db {db} --run r1 --out {out}/a.jsonl --min-margin=-1", 2,
                                       "'--min-margin': -1.0 is not in the range x>=0"),
    "export-top-confidence-zero": Case("export dpo --db {db} --run r1 --out {out}/a.jsonl --top-confidence 0", 2,
                                       "'--top-confidence': 0.0 is not in the range 0<x<=1"),
    "export-rolling-zero": Case("export dpo --db {db} --runs r1 --rolling 0 --out {out}/a.jsonl", 2,
                                "'--rolling': 0 is not in the range x>=1"),
    "export-unknown-strategy": Case("export dpo --db {db} --run r1 --out {out}/a.jsonl --strategy best", 2,
                                    "'--strategy': 'best' is not one of"),
    "export-option-of-another-format": Case("export kto --db {db} --run r1 --out {out}/a.jsonl --min-margin 1", 2,
                                            "No such option '--min-margin'"),
    "export-no-store": Case("export sft --db {missing}.duckdb --run r1 --out {out}/a.jsonl", 1, "no database at"),
    "export-out-is-a-file-path": Case("export sft --db {db} --run r1 --out {files}/tasks.jsonl/a.jsonl", 2,
                                      "--out: {files}/tasks.jsonl is not a folder"),
    "validate-broken-rows": Case("export validate {files}/bad-dpo.jsonl --format dpo", 2,
                                 "2 problems in {files}/bad-dpo.jsonl", lines=3),
    "validate-unknown-format": Case("export validate {files}/dpo.jsonl --format nosuch", 2,
                                    "'--format': 'nosuch' is not one of"),
    "validate-not-parquet": Case("export validate {files}/not-parquet.parquet --format dpo", 2,
                                 "{files}/not-parquet.parquet: cannot be read as Parquet: ", lines=2),
    "validate-not-utf8": Case("export validate {files}/latin1.jsonl --format dpo", 2,
                              "latin1.jsonl:1: not UTF-8 text", lines=2),
    "validate-missing-file": Case("export validate {missing}.jsonl --format dpo", 2, "does not exist"),
    "validate-wrong-format": Case("export validate {files}/kto.jsonl --format dpo", 2,
                                  "kto.jsonl:1: field 'chosen': missing", lines=25),
    "export-hints-nothing-accepted": Case("export hints --db {db} --run r1 --out {out}/h.jsonl", 1,
                                          "nothing to export: no accepted feedback with a hint in run(s) r1"),
    # ---- feedback: a target outside the branch, an unknown id, a bad file: nothing written
    "feedback-turn-out-of-range": Case("feedback add r1 fix-factorial 0 --turn 99 --polarity negative --db {db}",
                                       2, "has 2 assistant turn(s) (0-1); got 99"),
    "feedback-turn-and-span": Case("feedback add r1 add 0 --turn 0 --span 1:3 --polarity negative --db {db}", 2,
                                   "give exactly one of --turn N or --span A:B"),
    "feedback-empty-span": Case("feedback add r1 add 0 --span 3:2 --polarity negative --db {db}", 2,
                                "'--span': span 3:2 is empty or negative"),
    "feedback-unknown-run": Case("feedback add NOSUCH add 0 --turn 0 --polarity negative --db {db}", 2,
                                 "no run NOSUCH in"),
    "feedback-import-bad-lines": Case("feedback import {files}/feedback-bad.jsonl --db {db}", 2,
                                      "2 problems in {files}/feedback-bad.jsonl; nothing was imported", lines=3),
    "feedback-accept-unknown-id": Case("feedback accept fb-nosuch --db {db}", 2,
                                       "no feedback fb-nosuch in"),
    "feedback-override-nothing": Case("feedback override fb-nosuch --db {db}", 2,
                                      "give --polarity, --hint or --note to override"),
    "feedback-propose-unknown-teacher": Case("feedback propose r1 --teacher nosuch:x --db {db}", 2,
                                             "unknown model provider 'nosuch'"),
    "feedback-list-no-store": Case("feedback list r1 --db {missing}.duckdb", 1, "no database at"),
    # ---- train
    "train-missing-data": Case("train dpo --data {missing}.jsonl --output {out}/t", 2,
                               "--data {missing}.jsonl: no such file"),
    "train-wrong-format": Case("train dpo --data {files}/kto.jsonl --output {out}/t", 2,
                               "kto.jsonl: field 'format': the manifest says 'kto', this trainer reads 'dpo'"),
    "train-not-parquet": Case("train dpo --data {files}/not-parquet.parquet --output {out}/t", 2,
                              "{files}/not-parquet.parquet: cannot be read as Parquet: ", lines=2),
    "train-lr-nan": Case("train dpo --data {files}/dpo.jsonl --output {out}/t --lr nan", 2,
                         "'--lr': 'nan' is not a finite number"),
    "train-epochs-zero": Case("train dpo --data {files}/dpo.jsonl --output {out}/t --epochs 0", 2,
                              "'--epochs': 0.0 is not in the range x>0"),
    "train-max-length-too-small": Case("train dpo --data {files}/dpo.jsonl --output {out}/t --max-length 4", 2,
                                       "'--max-length': 4 is not in the range x>=8"),
    "train-batch-size-zero": Case("train sft --data {files}/dpo.jsonl --output {out}/t --batch-size 0", 2,
                                  "'--batch-size': 0"),
    "train-unknown-field": Case("train dpo --data {files}/dpo.jsonl --output {out}/t --set bogus=1", 2,
                                "--set 'bogus=1': field 'bogus': not a DPOConfig field"),
    "train-set-without-value": Case("train dpo --data {files}/dpo.jsonl --output {out}/t --set beta", 2,
                                    "--set 'beta': expected KEY=VALUE"),
    "train-config-unknown-key": Case("train dpo --data {files}/dpo.jsonl --output {out}/t "
                                     "--config {files}/config.yaml", 2, "config.yaml:2: field 'betta'"),
    "train-unknown-trainer": Case("train ppo --data {files}/dpo.jsonl --output {out}/t", 2,
                                  "No such command 'ppo'"),
    "train-detect-bad-line": Case("train detect {files}/tasks.jsonl", 2, "tasks.jsonl:1: field"),
    "train-detect-bad-mode": Case("train grpo --data {files}/dpo.jsonl --output {out}/t --hacking-detector loud", 2,
                                  "'loud' is not one of 'off', 'warn', 'stop'"),
    "train-output-is-a-file": Case("train dpo --data {files}/dpo.jsonl --output {files}/tasks.jsonl/t", 2,
                                   "--output: {files}/tasks.jsonl is not a folder"),
    # ---- memory
    "memory-add-unknown-run": Case("memory add NOSUCH --db {db} --embedder hashing", 2, "no run NOSUCH in"),
    "memory-unknown-embedder": Case("memory add r1 --db {db} --embedder nosuch", 2, "unknown embedder 'nosuch'"),
    "memory-search-k-zero": Case("memory search text -k 0 --db {db}", 2, "'-k': 0 is not in the range x>=1"),
    "memory-unknown-backend": Case("memory stats --db {db} --memory-backend nosuch", 2,
                                   "unknown memory backend 'nosuch'"),
    "memory-no-store": Case("memory stats --db {missing}.duckdb", 1, "no database at"),
    # ---- sandbox
    "sandbox-unknown-backend": Case("sandbox check NOSUCH", 2, "unknown sandbox 'NOSUCH'"),
    "sandbox-image-tag-uppercase": Case("sandbox build-image --tag Factory:1", 2,
                                        "'--tag': invalid image reference 'Factory:1'"),
    "sandbox-image-tag-whitespace": Case("sandbox build-image --tag 'a b'", 2, "must not contain whitespace"),
    "sandbox-image-browser-takes-no-value": Case("sandbox build-image --browser=yes", 2,
                                                 "Option '--browser' does not take a value"),
}


def _filled(text: str, places: dict[str, Path]) -> str:
    return text.format(**{k: str(v) for k, v in places.items()})


@pytest.fixture(scope="module")
def digest(world) -> dict[str, str]:
    return store_digest(world["db"])


def test_the_catalogue_covers_every_command():
    from factory.cli import COMMANDS

    assert len(CATALOGUE) >= 60
    commands = {case.argv.split()[0] for case in CATALOGUE.values()}
    assert set(COMMANDS) <= commands


@pytest.mark.parametrize("name", list(CATALOGUE))
def test_bad_input_is_one_clean_error_and_leaves_the_store_as_it_was(name, world, digest, monkeypatch):
    case = CATALOGUE[name]
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    store_folder = sorted(p.name for p in world["db"].parent.iterdir())

    result = CliRunner().invoke(main, shlex.split(_filled(case.argv, world)))

    assert result.exception is None or isinstance(result.exception, SystemExit), \
        f"{case.argv}: {type(result.exception).__name__}: {result.exception} (a traceback for the user)"
    assert "Traceback" not in result.output
    assert result.exit_code == case.code, result.output
    lines = [line for line in result.stderr.splitlines() if not line.startswith("WARNING:")]
    assert lines[0].startswith("error: "), result.stderr
    assert _filled(case.message, world) in result.stderr, result.stderr
    assert len(lines) == case.lines, result.stderr
    assert list(world["out"].iterdir()) == []  # nothing written where an output was asked for
    assert not world["missing"].exists()
    assert sorted(p.name for p in world["db"].parent.iterdir()) == store_folder  # no WAL or new file left
    assert store_digest(world["db"]) == digest


@pytest.mark.parametrize("path", [("fork",), ("verify", "run"), ("rank",)])
def test_every_command_that_calls_a_model_has_the_request_timeout_of_the_models(path):
    from factory.models import DEFAULT_REQUEST_TIMEOUT_S

    ctx = click.Context(main)
    command = main
    for name in path:
        command = command.get_command(ctx, name)
    [option] = [p for p in command.params if p.name == "request_timeout_s"]
    assert option.opts == ["--request-timeout"] and option.default == DEFAULT_REQUEST_TIMEOUT_S


# ---------------------------------------------------------------- a read-only folder


STORE_FOLDER = ("cannot write to {ro}/run.duckdb: its folder {ro} is not writable, and DuckDB keeps a write-ahead "
                "log beside the store (copy the store to a writable folder)")
READ_ONLY_CASES = {
    "export-out": Case("export sft --db {db} --run r1 --out {ro}/sft.jsonl", 2,
                       "--out: cannot write in {ro}: it is on a read-only file system"),
    "export-out-below": Case("export dpo --db {db} --run r1 --out {ro}/new/dpo.jsonl", 2,
                             "--out: cannot write in {ro}: it is on a read-only file system"),
    "train-output": Case("train dpo --data {files}/dpo.jsonl --output {ro}/model", 2,
                         "--output: cannot write in {ro}: it is on a read-only file system"),
    "rank-plot": Case("rank r1 --db {db} --plot {ro}/strengths.png", 2,
                      "--plot: cannot write in {ro}: it is on a read-only file system"),
    "power-plot": Case("power --db {db} --runs r1 r1 --plot {ro}/rates.png", 2,
                       "--plot: cannot write in {ro}: it is on a read-only file system"),
    # The store itself is writable, its folder is not: DuckDB's write-ahead log could not be made there.
    "store-rank": Case("rank r1 --db {ro}/run.duckdb", 1, STORE_FOLDER),
    "store-memory-add": Case("memory add r1 --db {ro}/run.duckdb --embedder hashing", 1, STORE_FOLDER),
    "store-migrate": Case("db migrate --db {ro}/run.duckdb", 1, STORE_FOLDER),
}


def _in_read_only_folder(ro: Path, argv: list[str], writable: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``factory ARGV`` with the folder ``ro`` read-only (all but the file ``writable`` in it).

    As root a folder's mode bits do not stop a write, so the folder is bound
    read-only in a mount namespace (bwrap) instead.
    """
    command = [sys.executable, "-m", "factory.cli", *argv]
    if os.geteuid() != 0:
        ro.chmod(0o555)
        try:
            return subprocess.run(command, capture_output=True, text=True, timeout=120)
        finally:
            ro.chmod(0o755)
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        pytest.skip("root without bwrap: no way to make a folder read-only here")
    binds = ["--ro-bind", str(ro), str(ro)] + (["--bind", str(writable), str(writable)] if writable else [])
    return subprocess.run([bwrap, "--dev-bind", "/", "/", *binds, *command], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("name", list(READ_ONLY_CASES))
def test_writing_in_a_read_only_folder_is_refused_before_any_work(name, world, digest, tmp_path):
    case = READ_ONLY_CASES[name]
    ro = tmp_path / "read-only"
    ro.mkdir()
    store = ro / "run.duckdb" if "{ro}/run.duckdb" in case.argv else None
    if store is not None:
        shutil.copyfile(world["db"], store)
    places = {**world, "ro": ro}

    done = _in_read_only_folder(ro, shlex.split(_filled(case.argv, places)), writable=store)

    expected = case.message if os.geteuid() == 0 else case.message.replace(
        "it is on a read-only file system", "permission denied")
    assert "Traceback" not in done.stderr
    assert done.returncode == case.code, done.stderr
    assert done.stderr.splitlines() == [f"error: {_filled(expected, places)}"]
    assert sorted(p.name for p in ro.iterdir()) == (["run.duckdb"] if store else [])
    assert store_digest(store or world["db"]) == digest


def test_a_store_in_a_read_only_folder_can_still_be_read(world, tmp_path):
    ro = tmp_path / "read-only"
    ro.mkdir()
    shutil.copyfile(world["db"], ro / "run.duckdb")

    done = _in_read_only_folder(ro, ["runs", "--db", str(ro / "run.duckdb"), "--json"], writable=ro / "run.duckdb")

    assert done.returncode == 0, done.stderr
    assert [run["run_id"] for run in json.loads(done.stdout)] == ["r1"]
