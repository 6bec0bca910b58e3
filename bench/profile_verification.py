"""Where one isolated verification's time goes, per sandbox backend (a profile for ``bench_sandbox.py``'s ratio).

Usage: python bench/profile_verification.py [--backends bwrap,docker] [--rounds 5]

Runs the golden verification ``bench_sandbox.py`` times (the first honest case
of ``examples/golden/tests-correct.jsonl``, one pipeline per backend, so the
warm trusted runner is reused as in a fork) and times its phases by wrapping
the real methods on the path (no part is replaced):

- ``branch sandbox``: the branch's own sandbox started, the solution written
  and collected (what ``run_golden`` does before verifying);
- ``runner acquire``: a warm trusted runner handed out (started on the first
  round);
- ``solution start``: the verification's solution sandbox started and seeded;
- ``trusted run``: the trusted child's whole run, from the request to its
  answer (it waits for the solution's server, then runs pytest);
- ``verification``: the whole isolated run; ``round``: the golden case end to end.

The first round warms up and is not counted; medians of the rest are printed
in ms with their share of the round, and the backends' ratio per phase.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import statistics
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from factory.sandbox import Sandbox
from factory.verifiers import TestsVerifier, VerificationPipeline, _warm, load_golden, run_golden

GOLDEN = Path(__file__).resolve().parent.parent / "examples" / "golden" / "tests-correct.jsonl"


class Phases:
    """Durations by phase name for the round under way."""

    def __init__(self) -> None:
        self.current: dict[str, float] = defaultdict(float)

    def timed(self, name: str, function: Any) -> Any:
        @functools.wraps(function)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return await function(*args, **kwargs)
            finally:
                self.current[name] += time.perf_counter() - started

        return wrapper


@contextlib.contextmanager
def instrumented(phases: Phases):
    """Wrap the verification's steps in timers (the methods themselves run unchanged), and put them back after."""
    saved = [(_warm._Pool, "acquire"), (_warm.WarmRunner, "run"), (_warm, "create_sandbox"), (_warm, "run_warm")]
    originals = [getattr(owner, name) for owner, name in saved]

    def create_sandbox(*args: Any, **kwargs: Any) -> Sandbox:
        box = originals[2](*args, **kwargs)
        box.start = phases.timed("solution start", box.start)  # type: ignore[method-assign]
        return box

    _warm._Pool.acquire = phases.timed("runner acquire", originals[0])
    _warm.WarmRunner.run = phases.timed("trusted run", originals[1])
    _warm.create_sandbox = create_sandbox
    _warm.run_warm = phases.timed("verification", originals[3])
    try:
        yield
    finally:
        for (owner, name), original in zip(saved, originals, strict=True):
            setattr(owner, name, original)


async def profile(backend: str, rounds: int) -> list[dict[str, float]]:
    case = load_golden(GOLDEN)[0]
    pipeline = VerificationPipeline({"tests": TestsVerifier(reference_sandbox=backend)})
    phases = Phases()
    out = []
    try:
        with instrumented(phases):
            for _ in range(rounds + 1):
                phases.current = defaultdict(float)
                started = time.perf_counter()
                report = await run_golden("tests", pipeline, [case], [], backend)
                total = time.perf_counter() - started
                if not report.clean:
                    raise SystemExit(f"{backend}: the golden case did not come back clean: {report.to_dict()}")
                row = dict(phases.current)
                row["round"] = total
                row["branch sandbox"] = total - row.get("verification", 0.0)
                out.append(row)
    finally:
        await pipeline.aclose()
    return out[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="bwrap,docker")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    medians: dict[str, dict[str, float]] = {}
    print(f"load {os.getloadavg()[0]:.1f}; {args.rounds} rounds (+1 warm-up) per backend, one after the other")
    for backend in backends:
        rows = asyncio.run(profile(backend, args.rounds))
        medians[backend] = {k: statistics.median(r.get(k, 0.0) for r in rows) * 1000 for k in rows[0]}
    names = ["round", "branch sandbox", "verification", "runner acquire", "solution start", "trusted run"]
    print(f"{'phase (median ms)':20s}" + "".join(f"{b:>12s}" for b in backends)
          + (f"{backends[1] + '/' + backends[0]:>14s}" if len(backends) == 2 else ""))
    for name in names:
        values = [medians[b].get(name, 0.0) for b in backends]
        ratio = f"{values[1] / values[0]:13.2f}x" if len(values) == 2 and values[0] else ""
        print(f"{name:20s}" + "".join(f"{v:12.0f}" for v in values) + ratio)
    print(f"load {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
