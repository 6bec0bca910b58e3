"""Sandbox backend costs: ``docker`` against ``bwrap`` (the default backend, the baseline), ``none`` for reference.

Every figure is wall time, measured in this process around the awaited call,
for each backend in ``--backends`` on the conformance suite's workspace
(``factory.sandbox.CONFORMANCE_SPEC``: a failing ``solution.py``, its
read-only ``test_solution.py`` and a data file; 20 s, 512 MB, 48 processes):

1. ``start+close``: ``async with create_sandbox(name, spec): pass``.
2. ``exec true``: one trivial command (``["true"]``) in a sandbox already
   started (its start and close are not timed).
3. ``exec pytest -q``: ``python -m pytest -q`` there, the interpreter and
   its pytest plugins as the backend finds them: bwrap and none run this
   venv's ``python`` (the plugins installed here autoload), docker the
   image's (``factory-sandbox:py3.11``, a different plugin set). The spec's
   solution is wrong on purpose, so the run must report ``1 failed``.
   ``exec pytest -q, plugins off`` is the same with
   ``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 -p no:cacheprovider`` (as the tests
   verifier runs pytest), which compares the backends rather than the
   plugin sets.
4. ``golden verification``: a whole isolated verification of one honest
   golden case (the first of ``examples/golden/tests-correct.jsonl``):
   ``run_golden("tests", VerificationPipeline({"tests":
   TestsVerifier(reference_sandbox=name)}), [case], [], name)``, as
   ``tests/verifiers/test_tests_verifier.py`` does: a fresh sandbox for the
   branch, then the verifier's solution sandbox, and the trusted pytest run
   forked from the pipeline's warm trusted runner (``factory.verifiers._warm``;
   started once, on the first round, which is not counted). It must come
   back clean (no false negative).
5. ``throughput xK``: ``--concurrency`` K start + ``pytest -q`` (as in 3)
   + close cycles gathered at once; the figure is the batch's wall time,
   and branches/s is K over its median.

The first round warms up and is not counted; then ``--repeats`` rounds, each
running every metric on every backend in turn (the backends' order rotates
from round to round), so drifts in machine load hit all of them alike. Per
metric and backend: median and p90 of the rounds, and the ratio of medians to
bwrap's (``docker/bwrap > 1`` means docker is slower). ``none`` is no
isolation at all (the code runs as this user on this host, with a warning):
a reference line for what isolation costs, never a contender.

``docker-nopool`` is ``docker`` with its pool of pre-started containers off
(``FACTORY_DOCKER_POOL=0`` around its probes): every start creates, starts
and seeds a container on the engine, as before the pool. ``docker`` takes a
container the pool pre-started (between two of its starts the rest of a round
runs, so the pool has refilled: the steady state of a fork whose branches
last longer than a container's start), seeds it and, on close, leaves the
engine's removal to a background thread (nothing of the host is mounted in
it); the verifier's two sandboxes share a folder with the host, so they are
made per verification and removed before close returns, pool or not.

A backend that cannot start is skipped with the reason (docker: no engine,
or the image missing: ``factory sandbox build-image``; bwrap: not installed,
or no user namespaces). Whole-machine CPU use during the run and the load
average are printed, so a run on a loaded machine can be told apart.

Usage: python bench/bench_sandbox.py [--repeats 10] [--backends docker,docker-nopool,bwrap,none] [--concurrency 2]
       [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import sys
import time
import warnings
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _results import cpu_busy_seconds, loadavg, print_table, record  # bench/ is on sys.path

from factory.sandbox import (
    CONFORMANCE_SPEC,
    NoSandboxWarning,
    Sandbox,
    create_sandbox,
    default_image_tag,
    docker_available,
    docker_image_status,
    drain_docker_pool,
)
from factory.verifiers import TestsVerifier, VerificationPipeline, load_golden, run_golden

GOLDEN = Path(__file__).resolve().parent.parent / "examples" / "golden" / "tests-correct.jsonl"
BASELINE = "bwrap"
NOT_ISOLATED = {"none"}
#: Pseudo-backends: a sandbox backend run with extra environment around its probes.
VARIANTS = {"docker-nopool": ("docker", {"FACTORY_DOCKER_POOL": "0"})}
PYTEST = ["python", "-m", "pytest", "-q"]
PYTEST_PLUGINS_OFF = ["env", "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1", "python", "-m", "pytest", "-q",
                      "-p", "no:cacheprovider"]
START, TRUE, PYTEST_M, PYTEST_OFF_M, GOLDEN_M = (
    "start+close", "exec true", "exec pytest -q", "exec pytest -q, plugins off", "golden verification")


def throughput_metric(k: int) -> str:
    return f"throughput x{k}"


# ------------------------------------------------------------------ machine






# ------------------------------------------------------------------ availability


def why_unavailable(backend: str) -> str | None:
    """Why ``backend`` cannot run here, from cheap checks (None: try it)."""
    backend = VARIANTS.get(backend, (backend, {}))[0]
    if backend == "docker":
        ok, why = docker_available()
        if not ok:
            return f"no Docker engine: {why}"
        ok, why = docker_image_status()
        if not ok:
            return f"image {default_image_tag()} missing: {why}"
    if backend == "bwrap" and shutil.which("bwrap") is None:
        return "bwrap is not installed"
    return None


# ------------------------------------------------------------------ probes


class ProbeError(RuntimeError):
    """A probe ran but its result was wrong."""


def check_pytest(backend: str, result: Any) -> None:
    # CONFORMANCE_SPEC's solution returns 41 where the test wants 42: one failure is the right answer.
    if result.exit_code != 1 or "1 failed" not in result.stdout:
        raise ProbeError(f"{backend}: pytest should report 1 failed, got: {result.describe()[-1500:]}")


@dataclass
class Backend:
    name: str
    case: Any  # the golden case
    probe: Sandbox | None = None  # the started sandbox of this round (metrics 2 and 3)
    times: dict[str, list[float]] = field(default_factory=dict)  # metric -> seconds per counted round
    error: str | None = None

    @property
    def sandbox(self) -> str:
        """The sandbox backend this row runs."""
        return VARIANTS.get(self.name, (self.name, {}))[0]

    @contextlib.contextmanager
    def environment(self) -> Any:
        """The variant's environment, set while its probes run (and put back after)."""
        extra = VARIANTS.get(self.name, (self.name, {}))[1]
        saved = {key: os.environ.get(key) for key in extra}
        os.environ.update(extra)
        try:
            yield
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    async def start_close(self) -> None:
        async with create_sandbox(self.sandbox, CONFORMANCE_SPEC):
            pass

    async def run(self, command: list[str], pytest: bool) -> None:
        assert self.probe is not None
        result = await self.probe.exec(command)
        if pytest:
            check_pytest(self.name, result)
        elif not result.ok:
            raise ProbeError(f"{self.name}: {command} failed: {result.describe()[-1500:]}")

    async def golden(self) -> None:
        pipeline = VerificationPipeline({"tests": TestsVerifier(reference_sandbox=self.sandbox)})
        report = await run_golden("tests", pipeline, [self.case], [], self.sandbox)
        if not report.clean or report.correct != 1:
            raise ProbeError(f"{self.name}: golden case {self.case.id} not clean: "
                             f"{json.dumps(report.to_dict(), default=str)[:1500]}")

    async def cycle(self) -> None:
        async with create_sandbox(self.sandbox, CONFORMANCE_SPEC) as sandbox:
            check_pytest(self.name, await sandbox.exec(PYTEST))

    async def batch(self, k: int) -> None:
        await asyncio.gather(*(self.cycle() for _ in range(k)))


def probes(b: Backend, k: int) -> dict[str, Callable[[], Awaitable[None]]]:
    return {
        START: b.start_close,
        TRUE: lambda: b.run(["true"], pytest=False),
        PYTEST_M: lambda: b.run(PYTEST, pytest=True),
        PYTEST_OFF_M: lambda: b.run(PYTEST_PLUGINS_OFF, pytest=True),
        GOLDEN_M: b.golden,
        throughput_metric(k): lambda: b.batch(k),
    }


async def measure(backends: list[Backend], repeats: int, k: int) -> None:
    """Round 0 warms up; then ``repeats`` counted rounds, every metric on every live backend in turn."""
    for round_no in range(repeats + 1):
        shift = round_no % len(backends)
        order = backends[shift:] + backends[:shift]  # rotate, so no backend always goes first
        started = time.perf_counter()
        for b in order:
            if b.error is None:
                try:
                    b.probe = create_sandbox(b.sandbox, CONFORMANCE_SPEC)
                    with b.environment():
                        await b.probe.start()
                except Exception as exc:  # noqa: BLE001 - reported, the backend dropped
                    b.error = f"round {round_no}: cannot start: {type(exc).__name__}: {exc}"
                    b.probe = None
        try:
            for metric in probes(backends[0], k):
                for b in order:
                    if b.error is not None:
                        continue
                    probe = probes(b, k)[metric]
                    t0 = time.perf_counter()
                    try:
                        with b.environment():
                            await probe()
                    except Exception as exc:  # noqa: BLE001 - reported, the backend dropped
                        b.error = f"round {round_no}, {metric}: {type(exc).__name__}: {exc}"
                        continue
                    if round_no:
                        b.times.setdefault(metric, []).append(time.perf_counter() - t0)
        finally:
            for b in order:
                if b.probe is not None:
                    with contextlib.suppress(Exception):
                        await b.probe.close()
                    b.probe = None
        label = "warm-up" if not round_no else f"round {round_no}/{repeats}"
        print(f"  {label} done in {time.perf_counter() - started:.1f} s (load {loadavg()})", flush=True)


# ------------------------------------------------------------------ report


def p90(values: Sequence[float]) -> float:
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=10, method="inclusive")[-1]


def label(backend: str) -> str:
    return f"{backend} (NOT isolated, reference)" if backend in NOT_ISOLATED else backend


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--repeats", type=int, default=10, help="counted rounds (after one warm-up round)")
    parser.add_argument("--backends", default="docker,docker-nopool,bwrap,none",
                        help=f"comma list of sandbox backends; ratios are against {BASELINE}")
    parser.add_argument("--concurrency", type=int, default=2, help="K: concurrent start+pytest+close cycles")
    parser.add_argument("--json", action="store_true",
                        help="print the figures as one JSON document on stdout (commentary and tables to stderr)")
    args = parser.parse_args()
    if args.repeats < 1 or args.concurrency < 1:
        parser.error("--repeats and --concurrency must be >= 1")
    commentary = contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext()
    with commentary:
        report = bench(args)
    if args.json:
        print(json.dumps(report, indent=2))
    if any(report["errors"].values()):
        raise SystemExit(1)


def bench(args: argparse.Namespace) -> dict[str, Any]:
    names = list(dict.fromkeys(b.strip() for b in args.backends.split(",") if b.strip()))
    k = args.concurrency
    case = load_golden(GOLDEN)[0]
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average at start {loadavg()}; "
          f"spec: CONFORMANCE_SPEC; golden case: {case.id}; {args.repeats} rounds (+1 warm-up), concurrency {k}")
    skipped: dict[str, str] = {}
    live: list[Backend] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NoSandboxWarning)
        for name in names:
            why = why_unavailable(name)
            if why is None:
                try:  # can it start at all? (a sandbox that cannot start says why here)
                    probe = Backend(name, case)
                    with probe.environment():
                        asyncio.run(probe.start_close())
                except Exception as exc:  # noqa: BLE001 - reported, the backend skipped
                    why = f"cannot start: {type(exc).__name__}: {exc}"
            if why is None:
                live.append(Backend(name, case))
            else:
                skipped[name] = why
                print(f"{name}: skipped: {why}")
        if not live:
            raise SystemExit("error: no backend can run here")
        busy0, wall0 = cpu_busy_seconds(), time.perf_counter()
        asyncio.run(measure(live, args.repeats, k))
        drain_docker_pool()  # the pool's spares and the background removals, inside the measured run
        busy1, wall = cpu_busy_seconds(), time.perf_counter() - wall0
    share = (f"{(busy1 - busy0) / (wall * (os.cpu_count() or 1)):.0%}" if busy0 is not None and busy1 is not None
             else "?")
    print(f"run: {wall:.0f} s; whole-machine CPU busy {share} of {os.cpu_count()} CPUs (this benchmark and anything "
          f"else running); load average at end {loadavg()}")

    by_name = {b.name: b for b in live}
    base = by_name.get(BASELINE)
    metrics = list(probes(live[0], k))
    rows: list[dict[str, Any]] = []
    for metric in metrics:
        for b in live:
            samples = b.times.get(metric)
            if not samples:
                continue
            median = statistics.median(samples)
            base_samples = base.times.get(metric) if base is not None else None
            ratio = median / statistics.median(base_samples) if base_samples and b is not base else None
            row: dict[str, Any] = {
                "metric": metric, "backend": b.name, "isolated": b.name not in NOT_ISOLATED,
                "runs": len(samples), "median_ms": median * 1000, "p90_ms": p90(samples) * 1000,
                "ratio_to_bwrap": 1.0 if b is base else ratio, "samples_ms": [s * 1000 for s in samples]}
            if metric == throughput_metric(k):
                row["branches_per_s"] = k / median
            rows.append(row)

    headers = ("metric", "backend", "median ms", "p90 ms", f"vs {BASELINE}", "note")
    cells = []
    for r in rows:
        note = f"{r['branches_per_s']:.2f} branches/s" if "branches_per_s" in r else ""
        if r["runs"] != args.repeats:
            note = (note + "; " if note else "") + f"{r['runs']} of {args.repeats} runs"
        ratio = "baseline" if r["backend"] == BASELINE else (
            f"{r['ratio_to_bwrap']:.2f}x" if r["ratio_to_bwrap"] is not None else "n/a")
        cells.append((r["metric"], label(r["backend"]), f"{r['median_ms']:.1f}", f"{r['p90_ms']:.1f}", ratio, note))
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(headers)]

    def line(row: Sequence[str]) -> str:
        return "  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip()

    print(f"\nwall time per operation, {args.repeats} rounds; vs {BASELINE} = median / {BASELINE}'s median "
          f"(> 1: slower than {BASELINE}); throughput x{k}: one batch of {k} concurrent start+pytest+close cycles")
    print(line(headers))
    print(line(["-" * w for w in widths]))
    previous = None
    for r, c in zip(rows, cells):
        if previous is not None and r["metric"] != previous:
            print()
        previous = r["metric"]
        print(line(c))
    print("none runs the code unconfined on this host: a reference for what isolation costs, not a contender. "
          "pytest -q uses the plugins each backend's python finds (bwrap/none: this venv's; docker: the image's); "
          "'plugins off' compares like with like.")
    for name, why in skipped.items():
        print(f"{name}: skipped: {why}")
    errors = {b.name: b.error for b in live}
    for name, error in errors.items():
        if error:
            print(f"error: {name}: dropped after {error}", file=sys.stderr)

    for r in rows:
        if r["backend"] == BASELINE:
            continue
        base_row = next((x for x in rows if x["metric"] == r["metric"] and x["backend"] == BASELINE), None)
        record(f"sandbox {label(r['backend'])}", f"{r['metric']} ms (median)", f"{r['median_ms']:.1f}",
               f"{base_row['median_ms']:.1f}" if base_row else "",
               f"{r['ratio_to_bwrap']:.2f}x" if r["ratio_to_bwrap"] is not None else "")
    for r in rows:
        if "branches_per_s" in r:
            record(f"sandbox {label(r['backend'])}", f"branches/s x{k}", f"{r['branches_per_s']:.2f}")
    print_table()
    return {
        "machine": {"python": sys.version.split()[0], "cpus": os.cpu_count(), "load_at_end": loadavg(),
                    "cpu_busy_share": share, "wall_s": wall},
        "config": {"repeats": args.repeats, "backends": names, "concurrency": k, "baseline": BASELINE,
                   "golden_case": case.id},
        "skipped": skipped, "errors": errors, "results": rows,
    }


if __name__ == "__main__":
    main()
