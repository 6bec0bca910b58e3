"""``factory tasks import`` + its check on a 500-row set: rows/s, and the share of time spent verifying.

The set is generated from the real rows' shapes (tests/data/imports): each format's fixture rows repeated
with fresh ids (HumanEval's ``task_id``, MBPP's ``task_id``) until there are ``--rows`` of them, so every
row is a real benchmark row and a distinct task. For each format it times:

- the import alone (read, convert, validate, write), as rows/s;
- for code formats, the check the import runs by default (each reference isolated and bare, each starter
  isolated, ``--jobs`` at once, bwrap), as tasks/s, and the check's share of the whole import.

Usage::

    python bench/bench_import.py [--rows 500] [--formats humaneval mbpp gsm8k math] [--jobs 2] [--no-check]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import loadavg, print_table, record  # noqa: E402  (bench/ is on sys.path)

from factory.tasks import import_tasks, write_tasks  # noqa: E402
from factory.verifiers import check_tasks  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "imports"
SOURCES = {"humaneval": DATA / "humaneval" / "HumanEval.jsonl", "mbpp": DATA / "mbpp" / "mbpp.jsonl",
           "gsm8k": DATA / "gsm8k" / "gsm8k.jsonl", "math": DATA / "math" / "math.jsonl"}


def generate(fmt: str, rows: int, folder: Path) -> Path:
    """``rows`` rows of ``fmt``: the fixture's real rows, cycled, each with its own id."""
    real = [json.loads(line) for line in SOURCES[fmt].read_text().splitlines() if line.strip()]
    out = folder / f"{fmt}-{rows}.jsonl"
    with out.open("w") as handle:
        for index, row in zip(range(rows), itertools.cycle(real)):
            row = dict(row)
            if fmt == "humaneval":
                row["task_id"] = f"HumanEval/{index}"
            elif fmt == "mbpp":
                row["task_id"] = 10_000 + index
            handle.write(json.dumps(row) + "\n")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=500)
    parser.add_argument("--formats", nargs="+", default=list(SOURCES), choices=list(SOURCES))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--no-check", action="store_true", help="time the import alone")
    args = parser.parse_args()
    print(f"load before: {loadavg()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for fmt in args.formats:
            source = generate(fmt, args.rows, folder)
            start = time.perf_counter()
            report = import_tasks(fmt, source)
            write_tasks(report.tasks, folder / f"{fmt}-tasks.jsonl")
            imported_s = time.perf_counter() - start
            rate = len(report.tasks) / imported_s
            record("import", f"{fmt}: {len(report.tasks)} rows imported", f"{rate:.0f} rows/s", f"{imported_s:.2f} s")
            checkable = [task for task in report.tasks if task.all_tests]
            if args.no_check or not checkable:
                continue
            start = time.perf_counter()
            checks = asyncio.run(check_tasks(checkable, jobs=args.jobs, starter=True))
            checked_s = time.perf_counter() - start
            passed = sum(c.kind == "same" for c in checks)
            stub_failed = sum(c.starter is not None and c.starter.status == "fail" for c in checks)
            record("import", f"{fmt}: check of {len(checks)} tasks ({args.jobs} at once)",
                   f"{len(checks) / checked_s:.2f} tasks/s", f"{checked_s:.1f} s",
                   f"verification {checked_s / (checked_s + imported_s):.1%} of the import")
            record("import", f"{fmt}: references pass / starters fail", f"{passed} / {stub_failed}",
                   f"of {len(checks)}", ok=passed == stub_failed == len(checks))
            print(f"{fmt}: done ({loadavg()})", flush=True)
    print(f"load after: {loadavg()}")
    print_table()


if __name__ == "__main__":
    main()
