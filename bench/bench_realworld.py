"""The real-world check as a report: each vendored library's own suite, bare pytest against the isolated verifier.

For every library under ``tests/data/realworld`` (see
``tests/verifiers/test_realworld.py``), this runs its own test suite twice
on this interpreter:

- bare pytest on a plain copy of the library and its tests (plugins not
  autoloaded, no cache, as the trusted runner runs pytest);
- the isolated ``tests`` verification (``run_isolated``, what the default
  ``TestsVerifier`` runs, with its default limits) of a task whose files are
  the library's source and whose solution is that same source, on bwrap.

It prints (and with ``--report FILE`` writes) a Markdown report: per library
the tests bare pytest judges, how many pass bare and isolated, the wall time
of each, and the isolated failures grouped by cause with one representative
message each. A test missing from the isolated run is counted under its
file's collection error, or under the run's own end (exit status, time limit)
when it never reported.

Usage::

    python bench/bench_realworld.py [--libraries NAME ...] [--report FILE] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: tests/ holds the harness

from _results import loadavg, print_table, record  # noqa: E402  (bench/ is on sys.path)

from factory.verifiers import TestsVerifier  # noqa: E402
from factory.verifiers._isolation import run_isolated, solution_files  # noqa: E402
from factory.verifiers._tests import _pytest_args  # noqa: E402
from tests.verifiers.test_realworld import (  # noqa: E402
    Library,
    bare_pytest,
    library_names,
    load_library,
    run_tests_verifier,
)

_QUOTED = re.compile(r"""'[^']*'|"[^"]*\"""")
_NUMBER = re.compile(r"\b0x[0-9a-fA-F]+\b|\b\d+(\.\d+)?\b")


def error_line(message: str) -> str:
    """The line of a pytest failure text that names the error (its last ``E`` line, else its last line)."""
    lines = [line.rstrip() for line in message.splitlines() if line.strip()]
    errors = [line[1:].strip() for line in lines if line.startswith("E ")]
    # the first E line naming an exception type says more than a trailing diff line
    for line in errors:
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Warning|Interrupt)\b", line) or line.startswith(
                ("Failed:", "assert ")):
            return line
    if errors:
        return errors[-1]
    return lines[-1] if lines else "(no message)"


def cause_key(line: str) -> str:
    """A failure's error line with its particulars (quoted values, numbers, addresses) blanked out."""
    key = _QUOTED.sub("'…'", line)
    key = _NUMBER.sub("N", key)
    # the head of the line names the mechanism; what follows names the case ("... for bump_major")
    return key[:72]


def isolated_outcomes(library: Library, verifier: TestsVerifier, extra_args: tuple[str, ...] = ()
                      ) -> tuple[dict, float]:
    """The isolated run's payload (outcomes, messages, ...) and its wall time."""
    task = library.task()
    args = _pytest_args(task.effective_test_command or "", task)
    assert args is not None
    args = [*extra_args, *args]
    started = time.perf_counter()
    run = asyncio.run(run_isolated(task, solution_files(task, library.source), args,
                                   sandbox=verifier.reference_sandbox or "bwrap", limits=verifier.limits,
                                   timeout_s=verifier.timeout_s, inactivity_s=verifier.inactivity_s))
    seconds = time.perf_counter() - started
    if run.payload is None:
        return {"unreported": True, "exit": run.exit_code, "timed_out": run.timed_out,
                "output_tail": run.output_tail, "outcomes": {}, "messages": {}}, seconds
    return {**run.payload, "timed_out": run.timed_out}, seconds


def in_process_verdict(library: Library) -> str:
    """The verdict of the same task with ``test_isolation: in-process`` (pass, or fail with its reason)."""
    task = library.task().model_copy(update={"test_isolation": "in-process"})
    verdict = run_tests_verifier(task, library.source)
    details = verdict.details
    if verdict.status == "pass":
        return f"pass {details.get('passed')}/{details.get('total')}"
    hacks = ", ".join(sorted({h.get("code", "?") for h in details.get("hacks", [])}))
    why = f"hack: {hacks}" if hacks else details.get("reason") or f"exit {details.get('exit_code')}"
    return f"{verdict.status} {details.get('passed', 0)}/{details.get('total', 0)} ({why})"


def compare(library: Library, folder: Path, verifier: TestsVerifier, in_process: bool = False) -> dict:
    """Bare and isolated runs of one library, and the causes of every difference."""
    bare = bare_pytest({**library.source, **library.tests}, library.test_command, folder)
    payload, isolated_s = isolated_outcomes(library, verifier)
    verdict_passed = {n for n, o in (payload.get("outcomes") or {}).items() if o == "passed"} & bare.judged
    verdict_exit = payload.get("exit")
    if payload.get("collection_errors"):
        # pytest runs nothing once a file fails to collect: run the files that do collect, for their causes
        payload, _ = isolated_outcomes(library, verifier, ("--continue-on-collection-errors",))
    outcomes: dict[str, str] = payload.get("outcomes") or {}
    messages: dict[str, str] = payload.get("messages") or {}
    passed_isolated = {n for n, o in outcomes.items() if o == "passed"}
    only_isolated = set(outcomes) - set(bare.outcomes) - set(payload.get("collection_errors") or [])
    causes: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for node in sorted(bare.judged - passed_isolated):
        if node in outcomes:
            message = messages.get(node, "")
            line = error_line(message) if message else f"outcome {outcomes[node]!r} (bare: {bare.outcomes[node]})"
        else:
            file = node.split("::", 1)[0]
            if file in messages:
                line = "collection error: " + error_line(messages[file])
                message = messages[file]
            elif any(other.split("::", 1)[0] == file for other in only_isolated):
                line = ("the test's node id is not in the isolated run, which has ids of its own in this file "
                        "(parameters whose order or ids differ between the two processes)")
                message = ""
            elif payload.get("stopped"):
                line, message = f"the run was stopped before it: {payload['stopped'].get('value')}", ""
            elif payload.get("unreported"):
                line = (f"the run did not report (exit {payload.get('exit')}"
                        f"{', timed out' if payload.get('timed_out') else ''})")
                message = payload.get("output_tail", "")
            else:
                line, message = "not run isolated", ""
        causes[cause_key(line)].append((node, line if len(line) > 20 else message[-300:] or line))
    different = sorted(node for node in bare.outcomes if bare.outcomes[node] != "passed"
                       and outcomes.get(node, bare.outcomes[node]) != bare.outcomes[node])
    return {"name": library.name, "version": library.version, "licence": library.licence,
            "patterns": library.patterns, "tests": len(bare.judged), "collected": len(bare.outcomes),
            "bare_passed": len(bare.passed), "isolated_passed": len(verdict_passed),
            "isolated_passed_continuing": len(passed_isolated & bare.judged),
            "bare_s": round(bare.seconds, 2), "isolated_s": round(isolated_s, 2),
            "isolated_exit": verdict_exit, "timed_out": bool(payload.get("timed_out")),
            # the longest stretch without a test finishing (what the inactivity window watches), and a stop by it
            "quiet_s": payload.get("quiet_s"), "stopped": (payload.get("stopped") or {}).get("value"),
            "solution_error": payload.get("solution_error"), "other_differences": different[:10],
            "only_isolated": sorted(only_isolated)[:5],
            "in_process": in_process_verdict(library) if in_process else None,
            "causes": sorted(([key, len(items), items[0][0], items[0][1]] for key, items in causes.items()),
                             key=lambda c: -c[1])}


def continuing(result: dict) -> str:
    """The count past collection errors, where it differs."""
    more = result["isolated_passed_continuing"]
    return f" ({more})" if more != result["isolated_passed"] else ""


def markdown(results: list[dict], elapsed: float) -> str:
    """The report."""
    total = sum(r["tests"] for r in results)
    lines = ["# Real-world check: vendored libraries' own suites, bare pytest vs the isolated verifier", "",
             f"Generated by `python bench/bench_realworld.py` in {elapsed:.0f} s (load average {loadavg()}), "
             f"interpreter {sys.version.split()[0]}, sandbox bwrap, the default `TestsVerifier` limits. "
             "Tests: what bare pytest judges (passed or failed; its own skips and xfails left out).", "",
             "Pass isolated: as the verifier runs the task's command; in brackets, where some test file failed to "
             "collect (pytest then runs no test at all), with `--continue-on-collection-errors` added, which is "
             "also the run the causes below come from.", "",
             "Quiet s: the isolated run's longest stretch without a test finishing (the inactivity window's measure; "
             "the slowest test, or collection).", "",
             "| library | version | licence | tests | pass bare | pass isolated | equal | bare s | isolated s "
             "| quiet s |",
             "|---|---|---|---:|---:|---:|---|---:|---:|---:|"]
    for r in results:
        equal = "yes" if r["isolated_passed"] == r["bare_passed"] == r["tests"] else "no"
        lines.append(f"| {r['name']} | {r['version']} | {r['licence']} | {r['tests']} | {r['bare_passed']} | "
                     f"{r['isolated_passed']}{continuing(r)} | {equal} | {r['bare_s']} | {r['isolated_s']} | "
                     f"{r['quiet_s'] if r['quiet_s'] is not None else '-'} |")
    equal_count = sum(r["isolated_passed"] == r["bare_passed"] == r["tests"] for r in results)
    if any(r["in_process"] for r in results):
        lines += ["", "With `test_isolation: in-process` (the old guarded run: pytest and the library in one process):",
                  ""] + [f"- {r['name']}: {r['in_process']}" for r in results]
    lines += ["", f"**{equal_count} of {len(results)} libraries** equal bare pytest isolated; "
              f"{sum(r['isolated_passed'] for r in results)} of {total} tests pass isolated "
              f"({sum(r['bare_passed'] for r in results)} bare).", "",
              "## Isolated failures by cause", ""]
    for r in results:
        if not r["causes"]:
            continue
        extra = []
        if r["timed_out"]:
            extra.append("the run hit its ceiling")
        if r["stopped"]:
            extra.append(f"stopped: {r['stopped']}")
        if r["solution_error"]:
            extra.append(f"solution_error: {str(r['solution_error'])[:200]}")
        lines += [f"### {r['name']} {r['version']}: {r['isolated_passed']}{continuing(r)}/{r['tests']} "
                  f"(exit {r['isolated_exit']}{'; ' + '; '.join(extra) if extra else ''})", "",
                  f"What its tests exercise: {r['patterns']}", ""]
        if r["only_isolated"]:
            lines.append(f"- tests only the isolated run has (first 5): {', '.join(r['only_isolated'])}")
        for key, count, node, example in r["causes"]:
            example = " ".join(example.split())[:300]
            lines.append(f"- **{count}** × `{key}`  \n  e.g. `{node}`: {example}")
        lines.append("")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--libraries", nargs="*", help="library names (default: every vendored one)")
    parser.add_argument("--report", type=Path, help="write the Markdown report to this file")
    parser.add_argument("--json", type=Path, help="write the per-library results as JSON to this file")
    parser.add_argument("--in-process", action="store_true", help="also verify each task with in-process isolation")
    options = parser.parse_args()
    names = options.libraries or library_names()
    verifier = TestsVerifier()
    started = time.perf_counter()
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-realworld-") as scratch:
        for name in names:
            result = compare(load_library(name), Path(scratch) / name, verifier, options.in_process)
            results.append(result)
            print(f"{name}: {result['isolated_passed']}/{result['tests']} isolated, {result['bare_passed']} bare "
                  f"({result['isolated_s']} s vs {result['bare_s']} s)", flush=True)
            record("realworld", f"{name} tests passing isolated", str(result["isolated_passed"]),
                   baseline=str(result["bare_passed"]), ok=result["isolated_passed"] == result["tests"])
    report = markdown(results, time.perf_counter() - started)
    print(report)
    print_table()
    if options.report:
        options.report.write_text(report)
    if options.json:
        options.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
