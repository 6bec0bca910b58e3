"""The browser verifier: seconds per verification, and whether a judge tells honest pages from broken ones.

Two parts (run on demand, never in the suite):

``python -m bench.bench_browser [--runs N] [--sandbox bwrap]`` (timing): one front-end fixture (the
counter) verified N times with replay planner and judge, so the figures are the browser's alone, split
into browser start (sandbox, runner, Chromium), open, execute and judge seconds. *Cold*: a fresh
sandbox and browser per verification (what a fork does, one per branch). *Warm*: the verifier keeps
one sandbox and browser for the branch between verifications (``keep_warm``: re-verifying the same
files; never shared between branches, whose files differ), so the later verifications skip the start.

``python -m bench.bench_browser --measure --half dev|held --planner scripted|judge [--judge local]``
(item 5 of issue 34): every fixture task of the half (``metadata.split`` in
``examples/frontend/tasks.jsonl``) verified with its honest and its subtly broken page; the judge is
the embedded offline model by default (slow: minutes per verification on 2 cores). ``--planner
scripted`` plays the hand-written plans (``examples/frontend/plans.replay.jsonl``) so only judging is
measured; ``--planner judge`` lets the judge model plan too. Prints the pairwise accuracy (honest
score strictly above broken; ties count as misses, and are counted), its Wilson interval, the mean score
gap, and a JSON line per page.
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

from factory.models import ModelOptions, create_model
from factory.ranking._stats import wilson_interval
from factory.tasks import load_tasks
from factory.verifiers import BranchOutput, BrowserVerifier, Criterion, VerifyContext, find_chromium, run_verifier

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "examples" / "frontend"
GOLDEN = ROOT / "examples" / "golden"


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


async def measure(half: str, planner: str, judge: str, sandbox: str, k: int) -> None:
    tasks = [t for t in load_tasks(FIXTURES / "tasks.jsonl") if t.metadata.get("split") == half]
    judge_model = create_model(judge, ModelOptions(context=8192))
    planner_model = (create_model(f"replay:{FIXTURES / 'plans.replay.jsonl'}", ModelOptions())
                     if planner == "scripted" else None)
    wins = ties = 0
    gaps = []
    with tempfile.TemporaryDirectory() as artifacts:
        verifier = BrowserVerifier(judge_model, planner=planner_model, k=k, sandbox=sandbox,
                                   artifact_dir=Path(artifacts), time_limit_s=600)
        for task in tasks:
            scores = {}
            for variant in ("honest", "broken"):
                verdict, seconds = await _verify(verifier, task, _page(task.id, variant))
                scores[variant] = verdict.score * 10
                print(json.dumps({"task": task.id, "variant": variant, "status": verdict.status,
                                  "code": verdict.details.get("code"), "score_10": round(verdict.score * 10, 2),
                                  "items": {i["id"]: i["pass"] for i in verdict.details.get("items", [])},
                                  "reason": verdict.details.get("reason"), "seconds": round(seconds, 1)}), flush=True)
            wins += scores["honest"] > scores["broken"]
            ties += scores["honest"] == scores["broken"]
            gaps.append(scores["honest"] - scores["broken"])
        await verifier.aclose()
    low, high = wilson_interval(wins, len(tasks))
    print(f"half {half}, planner {planner}, judge {judge_model.spec}, k={k}: honest > broken on {wins}/{len(tasks)} "
          f"pairs (ties {ties}), pairwise accuracy {wins / len(tasks):.2f}, Wilson 95% [{float(low):.2f}, "
          f"{float(high):.2f}], mean score gap {statistics.mean(gaps):+.2f} (0-10), gaps {gaps}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--sandbox", default="bwrap")
    parser.add_argument("--measure", action="store_true")
    parser.add_argument("--half", choices=("dev", "held"), default="dev")
    parser.add_argument("--planner", choices=("scripted", "judge"), default="scripted")
    parser.add_argument("--judge", default="local")
    parser.add_argument("--k", type=int, default=1)
    args = parser.parse_args()
    if find_chromium() is None:
        sys.exit("no chromium here: install Debian's chromium package (make setup does)")
    if args.measure:
        asyncio.run(measure(args.half, args.planner, args.judge, args.sandbox, args.k))
    else:
        asyncio.run(timing(args.runs, args.sandbox))


if __name__ == "__main__":
    main()
