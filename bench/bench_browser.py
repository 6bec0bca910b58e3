"""The browser verifier: seconds per verification, and whether a judge tells honest pages from broken ones.

Two parts (run on demand, never in the suite):

``python -m bench.bench_browser [--runs N] [--sandbox bwrap]`` (timing): one front-end fixture (the
counter) verified N times with replay planner and judge, so the figures are the browser's alone, split
into browser start (sandbox, runner, Chromium), open, execute and judge seconds. *Cold*: a fresh
sandbox and browser per verification (what a fork does, one per branch). *Warm*: the verifier keeps
one sandbox and browser for the branch between verifications (``keep_warm``: re-verifying the same
files; never shared between branches, whose files differ), so the later verifications skip the start.

``python -m bench.bench_browser --measure --half dev|held [--planner scripted|embedded|both] [--judge local]
[--k 1] [--json PATH]`` (item 5 of issue 34): every fixture task of the half (``metadata.split`` in
``examples/frontend/tasks.jsonl``) verified with its honest and its subtly broken page; the judge is
the embedded offline model by default (slow: minutes per verification on 2 cores). ``scripted`` plays
the hand-written plans (``examples/frontend/plans.replay.jsonl``) so only judging is measured;
``embedded`` lets the judge model plan too (a reply repaired where unambiguous, else the checklist's
default exploration, as the verifier does). Prints a JSON line per page and, per planner, the pairwise
accuracy (honest score strictly above broken; ties count as misses, and are counted), its Wilson
interval, the mean score gap, how many plans parsed, were repaired, partly failed or failed, wall time
and load; ``--json`` writes the same.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench._results import cpu_busy_seconds, loadavg
from factory.models import ModelOptions, create_model
from factory.ranking._stats import wilson_interval
from factory.tasks import load_tasks
from factory.verifiers import BranchOutput, BrowserVerifier, Criterion, VerifyContext, find_chromium, run_verifier

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "examples" / "frontend"
GOLDEN = ROOT / "examples" / "golden"
PLAN_STATUSES = ("parsed", "repaired", "partial", "failed")


def _page(task_id: str, variant: str) -> dict[str, bytes]:
    return {"index.html": (FIXTURES / task_id.removeprefix("fe-") / variant / "index.html").read_bytes()}


async def _verify(verifier: BrowserVerifier, task, files):
    ctx = VerifyContext(task, BranchOutput(None), Criterion("browser", "", "browser", task.rubric), None, files)
    started = time.perf_counter()
    verdict = await run_verifier(verifier, ctx)
    return verdict, time.perf_counter() - started


async def timing(runs: int, sandbox: str) -> None:
    task = load_tasks(FIXTURES / "tasks.jsonl")["fe-counter"]
    files = _page("fe-counter", "honest")
    with tempfile.TemporaryDirectory() as artifacts:
        results = {}
        for mode in ("cold", "warm"):
            verifier = BrowserVerifier(
                create_model(f"replay:{GOLDEN / 'browser-judge.replay.jsonl'}", ModelOptions()),
                planner=create_model(f"replay:{GOLDEN / 'browser-planner.replay.jsonl'}", ModelOptions()),
                k=1, sandbox=sandbox, artifact_dir=Path(artifacts), keep_warm=mode == "warm")
            rows = []
            for _ in range(runs):
                verdict, seconds = await _verify(verifier, task, files)
                assert verdict.status == "pass", verdict.details
                rows.append((seconds, verdict.details["timings"]))
            await verifier.aclose()
            results[mode] = rows
    print(f"browser verifier, {sandbox}, {runs} verifications of the counter fixture per mode (replay models)")
    print(f"{'mode':<6}{'total s (median)':>18}{'first s':>10}{'start':>8}{'open':>8}{'execute':>9}{'judge':>8}")
    for mode, rows in results.items():
        later = rows[1:] or rows
        parts = {key: statistics.median(r[1].get(key, 0.0) for r in later)
                 for key in ("browser_start_s", "open_s", "execute_s", "judge_s")}
        print(f"{mode:<6}{statistics.median(r[0] for r in later):>18.2f}{rows[0][0]:>10.2f}"
              f"{parts['browser_start_s']:>8.2f}{parts['open_s']:>8.2f}{parts['execute_s']:>9.2f}{parts['judge_s']:>8.2f}")
    cold = statistics.median(r[0] for r in results["cold"][1:] or results["cold"])
    warm = statistics.median(r[0] for r in results["warm"][1:] or results["warm"])
    print(f"warm / cold (median of verifications after the first): {warm / cold:.2f}")


def _summary(half: str, planner: str, rows: list[dict], seconds: float, load: tuple[str, str],
             cpu_s: float | None) -> dict:
    """The figures of one half and one planner, from its per-page rows."""
    score = {(row["task"], row["variant"]): row["score_10"] for row in rows}
    pairs = sorted({task for task, _ in score if (task, "honest") in score and (task, "broken") in score})
    unfinished = sorted({task for task, _ in score} - set(pairs))
    gaps = [round(score[(task, "honest")] - score[(task, "broken")], 3) for task in pairs]
    wins, ties = sum(gap > 0 for gap in gaps), sum(gap == 0 for gap in gaps)
    low, high = wilson_interval(wins, len(pairs)) if pairs else (0.0, 1.0)
    plans = {status: sum(row["plan"] == status for row in rows) for status in PLAN_STATUSES}
    return {"half": half, "planner": planner, "pairs": len(pairs), "tasks": pairs, "unfinished": unfinished,
            "honest_above_broken": wins, "ties": ties,
            "pairwise_accuracy": round(wins / len(pairs), 3) if pairs else None,
            "wilson95": [round(float(low), 3), round(float(high), 3)],
            "mean_gap_10": round(statistics.mean(gaps), 3) if gaps else None,
            "gaps_10": gaps, "plans": plans, "failed_plan_steps": sum(row["failed_steps"] for row in rows),
            "error_verdicts": sum(row["status"] == "error" for row in rows), "wall_s": round(seconds, 1),
            "loadavg_start": load[0], "loadavg_end": load[1],
            "cpu_busy_s_all_processes": None if cpu_s is None else round(cpu_s, 1)}


def _print_summary(summary: dict) -> None:
    accuracy, gap = summary["pairwise_accuracy"], summary["mean_gap_10"]
    print(f"half {summary['half']}, planner {summary['planner']}, judge {summary.get('judge')}, k={summary.get('k')}: "
          f"honest > broken on {summary['honest_above_broken']}/{summary['pairs']} pairs {summary['tasks']} (ties "
          f"{summary['ties']}), pairwise accuracy {'-' if accuracy is None else f'{accuracy:.2f}'}, Wilson 95% "
          f"[{summary['wilson95'][0]:.2f}, {summary['wilson95'][1]:.2f}], mean score gap "
          f"{'-' if gap is None else f'{gap:+.2f}'} (0-10), gaps {summary['gaps_10']}; unfinished pairs "
          f"{summary['unfinished']}; plans {summary['plans']}, failed plan steps {summary['failed_plan_steps']}, "
          f"error verdicts {summary['error_verdicts']}; wall {summary['wall_s']:.0f} s, load "
          f"{summary['loadavg_start']} -> {summary['loadavg_end']}", flush=True)


def summarize(paths: list[Path]) -> list[dict]:
    """Summaries from the per-page JSON lines that ``--measure`` printed (a run cut short counts its whole pairs)."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            if line.startswith("{") and '"variant"' in line:
                row = json.loads(line)
                groups.setdefault((row["half"], row["planner"]), []).append(row)
    summaries = []
    for (half, planner), rows in sorted(groups.items()):
        summary = _summary(half, planner, rows, sum(row["seconds"] for row in rows), ("?", "?"), None)
        summary.update(rows=rows, sources=[str(path) for path in paths])
        summaries.append(summary)
        _print_summary(summary)
    return summaries


async def measure(half: str, planners: list[str], judge: str, sandbox: str, k: int, context: int) -> list[dict]:
    """Verify every fixture of ``half`` with its honest and broken page, once per planner; the summaries."""
    tasks = [t for t in load_tasks(FIXTURES / "tasks.jsonl") if t.metadata.get("split") == half]
    judge_model = create_model(judge, ModelOptions(context=context))
    summaries = []
    with tempfile.TemporaryDirectory() as artifacts:
        for planner in planners:
            # scripted: the hand-written plans, so only judging is measured; embedded: the judge model plans too
            planner_model = (create_model(f"replay:{FIXTURES / 'plans.replay.jsonl'}", ModelOptions())
                             if planner == "scripted" else None)
            verifier = BrowserVerifier(judge_model, planner=planner_model, k=k, sandbox=sandbox,
                                       artifact_dir=Path(artifacts), time_limit_s=600)
            rows, load, cpu, started = [], loadavg(), cpu_busy_seconds(), time.perf_counter()
            for task in tasks:
                for variant in ("honest", "broken"):
                    verdict, seconds = await _verify(verifier, task, _page(task.id, variant))
                    plan = verdict.details.get("plan") or {}
                    row = {"half": half, "planner": planner, "task": task.id, "variant": variant,
                           "status": verdict.status, "code": verdict.details.get("code"),
                           "score_10": round(verdict.score * 10, 3),
                           "items": {i["id"]: i["pass"] for i in verdict.details.get("items", [])},
                           "plan": plan.get("status", "none"), "exploration": plan.get("exploration"),
                           "repairs": len(plan.get("repairs") or []),
                           "failed_steps": len(plan.get("failed_steps") or []),
                           "actions_ok": f"{sum(bool(a.get('ok')) for a in verdict.details.get('actions', []))}"
                                         f"/{len(verdict.details.get('actions', []))}",
                           "ran": [a.get("action") for a in verdict.details.get("actions", [])],
                           "reason": verdict.details.get("reason"), "seconds": round(seconds, 1),
                           "timings": verdict.details.get("timings")}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
            await verifier.aclose()
            after = cpu_busy_seconds()
            summary = _summary(half, planner, rows, time.perf_counter() - started, (load, loadavg()),
                               None if cpu is None or after is None else after - cpu)
            summary.update(judge=judge_model.spec, k=k, context=context, rows=rows)
            summaries.append(summary)
            _print_summary(summary)
    if hasattr(judge_model, "aclose"):
        await judge_model.aclose()
    return summaries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--sandbox", default="bwrap")
    parser.add_argument("--measure", action="store_true")
    parser.add_argument("--half", choices=("dev", "held"), default="dev")
    parser.add_argument("--planner", choices=("scripted", "embedded", "both"), default="both",
                        help="embedded: the judge model plans too")
    parser.add_argument("--judge", default="local")
    parser.add_argument("--k", type=int, default=1)
    parser.add_argument("--context", type=int, default=8192)
    parser.add_argument("--json", type=Path, help="write the summaries (with every page's row) here")
    parser.add_argument("--summarize", type=Path, nargs="+", metavar="OUT",
                        help="summarize the per-page lines earlier --measure runs printed (no browser, no model)")
    args = parser.parse_args()
    if args.summarize:
        summaries = summarize(args.summarize)
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({"summaries": summaries}, indent=1) + "\n")
        return
    if find_chromium() is None:
        sys.exit("no chromium here: install Debian's chromium package (make setup does)")
    if args.measure:
        planners = ["scripted", "embedded"] if args.planner == "both" else [args.planner]
        summaries = asyncio.run(measure(args.half, planners, args.judge, args.sandbox, args.k, args.context))
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({"summaries": summaries}, indent=1) + "\n")
    else:
        asyncio.run(timing(args.runs, args.sandbox))


if __name__ == "__main__":
    main()
