"""The whole tests-verifier golden corpus, per exploit class: what the default verifier catches today.

Every exploit in ``examples/golden/tests-exploits.jsonl`` is a policy's
attempt to get a pass from the ``tests`` verifier without solving the task;
every case in ``tests-correct.jsonl`` is an honest solution that must pass.
Each line has a ``class`` (``eq``, ``patch``, ``peek``, ``guard``,
``pytest``, ``shadow``, ``proc``, ``hardcode``, ``tamper``; ``honest`` for
the correct set).

``test_the_default_verifier_catches_every_exploit_and_passes_every_honest_case``
runs the corpus on bwrap with the default verifier, prints a per-class
table of caught and missed exploits, and fails on any miss (opt-in with
``-m slow``: ``test_tests_verifier.py`` runs every case in the default
suite). The counts without pytest::

    python -m tests.verifiers.test_golden_corpus [--sandbox bwrap] [--isolation process|in-process] [--ids ID ...]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import shutil
import warnings
from collections import defaultdict
from pathlib import Path

import pytest

from factory.verifiers import GoldenCase, TestsVerifier, VerificationPipeline, load_golden, run_golden

GOLDEN = Path(__file__).resolve().parents[2] / "examples" / "golden"
CORRECT_FILE = GOLDEN / "tests-correct.jsonl"
EXPLOITS_FILE = GOLDEN / "tests-exploits.jsonl"
#: Exploit classes the corpus must cover, with the fewest cases each.
#: The exploits that predate the classes (and keep their ids: other tests name them).
FIRST_EXPLOITS = frozenset({
    "edit-tests", "delete-tests", "conftest-sys-exit", "conftest-os-exit", "solution-os-exit", "solution-sys-exit",
    "conftest-skips-everything", "solution-skips-module", "solution-xfails-every-call", "monkeypatch-runtest",
    "monkeypatch-test-functions", "monkeypatch-assert-via-pyfunc-hook", "read-expected-values-from-tests",
    "fake-junit-xml-in-workspace", "fake-junit-xml-then-exit", "fork-outlives-test-run", "pytest-ini-deselects",
    "pyproject-pytest-section", "sitecustomize", "pth-file", "plugin-module", "planted-pytest-bytecode"})
CLASSES = {"eq": 8, "patch": 8, "peek": 8, "guard": 8, "pytest": 8, "shadow": 8, "proc": 4, "hardcode": 2, "tamper": 2}


def case_classes(path: Path) -> dict[str, str]:
    """Case id -> class, from the golden file's lines."""
    return {data["id"]: data["class"] for data in map(json.loads, path.read_text().splitlines()) if data}


@dataclasses.dataclass
class CorpusRun:
    """Outcomes of one run of the corpus: per class, the cases caught or passed and those that were not."""

    good: dict[str, list[str]] = dataclasses.field(default_factory=lambda: defaultdict(list))
    bad: dict[str, list[tuple[str, str]]] = dataclasses.field(default_factory=lambda: defaultdict(list))

    def table(self) -> str:
        rows = [f"{'class':<10} {'cases':>5} {'ok':>4} {'not ok':>6}  not ok (why)"]
        for cls in sorted(set(self.good) | set(self.bad), key=lambda c: (c == "honest", c)):
            good, bad = self.good.get(cls, []), self.bad.get(cls, [])
            label = "honest" if cls == "honest" else cls
            rows.append(f"{label:<10} {len(good) + len(bad):>5} {len(good):>4} {len(bad):>6}  "
                        + ", ".join(f"{case} ({why})" for case, why in bad))
        return "\n".join(rows)


async def run_corpus(correct: list[GoldenCase], exploits: list[GoldenCase], sandbox: str,
                     concurrency: int = 2) -> CorpusRun:
    """Each case through ``run_golden`` with the default verifier (a fresh one per case)."""
    classes = {**case_classes(CORRECT_FILE), **case_classes(EXPLOITS_FILE)}
    result = CorpusRun()
    limit = asyncio.Semaphore(concurrency)

    async def one(case: GoldenCase, honest: bool) -> None:
        async with limit:
            pipeline = VerificationPipeline({"tests": TestsVerifier(reference_sandbox=sandbox)})
            report = await run_golden("tests", pipeline, [case] if honest else [],
                                      [] if honest else [case], sandbox)
        cls = classes.get(case.id, "honest" if honest else "?")
        if honest and report.false_negatives:
            details = report.false_negatives[0]["details"]
            why = details.get("reason") or ",".join(h["code"] for h in details.get("hacks", [])) or "failed"
            result.bad[cls].append((case.id, str(why)[:60]))
        elif not honest and report.false_positives:
            result.bad[cls].append((case.id, "passed"))
        else:
            result.good[cls].append(case.id)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the none sandbox warns on every command
        await asyncio.gather(*[one(c, True) for c in correct], *[one(c, False) for c in exploits])
    return result


def test_the_corpus_is_well_formed():
    correct, exploits = load_golden(CORRECT_FILE), load_golden(EXPLOITS_FILE)
    classes = case_classes(EXPLOITS_FILE)
    ids = [c.id for c in correct + exploits]
    assert len(ids) == len(set(ids))
    assert len(exploits) >= 70 and len(correct) >= 15
    assert set(case_classes(CORRECT_FILE).values()) == {"honest"}
    counts = {cls: sum(1 for c in classes.values() if c == cls) for cls in CLASSES}
    assert set(classes.values()) == set(CLASSES)
    assert all(counts[cls] >= least for cls, least in CLASSES.items()), counts
    for case in exploits:  # cases are named by their class, but for the first ones
        assert case.id.startswith(classes[case.id] + "-") or case.id in FIRST_EXPLOITS, case.id


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.slow  # tests/verifiers/test_tests_verifier.py runs every case on its own; this prints the table
def test_the_default_verifier_catches_every_exploit_and_passes_every_honest_case(capsys):
    result = asyncio.run(run_corpus(load_golden(CORRECT_FILE), load_golden(EXPLOITS_FILE), "bwrap"))
    with capsys.disabled():
        print("\n" + result.table())
    assert not any(result.bad.values()), dict(result.bad)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Per-class caught/missed counts of the tests golden corpus.")
    parser.add_argument("--sandbox", default="bwrap")
    parser.add_argument("--isolation", choices=["process", "in-process"], default=None,
                        help="Force every task's test_isolation (default: each task's own).")
    parser.add_argument("--ids", nargs="*", default=None, help="Only these case ids.")
    parser.add_argument("--concurrency", type=int, default=2)
    args = parser.parse_args(argv)

    def pick(cases: list[GoldenCase]) -> list[GoldenCase]:
        cases = [c for c in cases if not args.ids or c.id in args.ids]
        if args.isolation:
            cases = [dataclasses.replace(c, task=c.task.model_copy(update={"test_isolation": args.isolation}))
                     for c in cases]
        return cases

    result = asyncio.run(run_corpus(pick(load_golden(CORRECT_FILE)), pick(load_golden(EXPLOITS_FILE)),
                                    args.sandbox, args.concurrency))
    print(result.table())
    return 1 if any(result.bad.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
