"""Cost of one crossing of the import boundary: µs per round trip, both ends real, no sandbox, no pytest.

The trusted end (:class:`SolutionClient` with its :class:`SolutionFinder`)
runs in this process; the solution end (:func:`serve_connection`) in a
forked child serving a temporary workspace over a socket pair, as the
solution sandbox's front door does for each connection. What a suite does
tens of thousands of times, each repeated ``--n`` times (figures: median of
``--rounds`` rounds, µs per crossing -- one call, one ``next()``, ...):

- ``call f(1)``: a module function returning an int;
- ``attr read``: a module attribute holding an int;
- ``method call``: a method of an object of the solution's class;
- ``short generator``: ``list(gen(n))`` of a 3-item generator (what
  ``more_itertools``' ``test_cross_check`` does with 8000 ``factor()`` calls), per generator;
- ``long generator item``: one item of a 2000-item generator, consumed by ``list()`` (run ahead);
- ``lazy 20-item generator``: ``all(map(abs, gen(20)))``, per generator (consumed lazily: run ahead by a copy
  of the solution's process, or item by item where the iterators consumed there were short);
- ``key callback``: ``sorted(list, key=test_lambda)`` on 50 items inside the solution, per callback.

Each pattern prints wall µs per crossing and the CPU µs each end spent on it (the trusted end's from
``time.process_time``, the solution's from its process's ``/proc`` times): on a loaded machine the wall figure
is mostly waiting for the other end to be scheduled, the CPU figures are what a crossing costs.

``--parts`` prints the parts of a crossing's CPU, each measured alone in this process (min of repeats):
the JSON of a call request and its decoding, both channel ends' work for a request and its reply (JSON and
system calls, no waiting), the bare system calls of that (with and without Python's poll-before-read
timeout), and the turn taking (locks). What a crossing costs beyond them is the boundary's dispatch.

``--profile DIR`` writes cProfile statistics of both ends there (``trusted.prof``, ``solution.prof``).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import socket
import statistics
import sys
import tempfile
import time
import timeit

from factory.verifiers._solution_server import serve_connection
from factory.verifiers._trusted_runner import SolutionClient, SolutionFinder
from factory.verifiers._wire import Channel, Endpoint

SOLUTION = '''
def f(x):
    return x + 1

VALUE = 42

class Box:
    def __init__(self, v):
        self.v = v
    def get(self):
        return self.v

def gen(n):
    for i in range(n):
        yield i

def ones(n):
    for i in range(n):
        yield i + 1

def sort_by(items, key):
    return sorted(items, key=key)

def rebind(factor):
    global f
    f = lambda x: x * factor
'''


def serve(sock: socket.socket, workspace: str, profile: str | None) -> None:
    """The solution end, in the forked child: serve until the trusted end hangs up."""
    os.chdir(workspace)
    profiler = cProfile.Profile() if profile else None
    try:
        if profiler:
            profiler.enable()
        serve_connection(Channel(sock), ["."])
    except BaseException:  # noqa: BLE001 -- the peer hanging up ends the child either way
        pass
    finally:
        if profiler:
            profiler.disable()
            profiler.dump_stats(os.path.join(profile, "solution.prof"))
        os._exit(0)


def _cpu_of(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(n: int, rounds: int, profile: str | None) -> dict[str, tuple[float, float, float]]:
    """Median µs per crossing of each pattern (see the module docstring): wall, trusted CPU, solution CPU."""
    workspace = tempfile.mkdtemp(prefix="bench-crossing-")
    with open(os.path.join(workspace, "solution.py"), "w") as handle:
        handle.write(SOLUTION)
    left, right = socket.socketpair()
    child = os.fork()
    if child == 0:
        left.close()
        serve(right, workspace, profile)
    right.close()
    client = SolutionClient(Channel(left), 60)
    finder = SolutionFinder(client, ["solution"])
    sys.meta_path.insert(0, finder)
    profiler = cProfile.Profile() if profile else None
    try:
        import solution  # noqa: PLC0415 -- served by the child, through the finder
        box = solution.Box(5)
        items = list(range(50, 0, -1))
        patterns = {
            "call f(1)": (n, lambda: [solution.f(1) for _ in range(n)]),
            "attr read": (n, lambda: [solution.VALUE for _ in range(n)]),
            "method call": (n, lambda: [box.get() for _ in range(n)]),
            "short generator (per generator)": (n, lambda: [list(solution.gen(3)) for _ in range(n)]),
            "long generator item": (2000 * max(1, n // 2000), lambda: [
                list(solution.gen(2000)) for _ in range(max(1, n // 2000))]),
            "lazy 20-item generator (per gen.)": (max(1, n // 20), lambda: [
                all(map(abs, solution.ones(20))) for _ in range(max(1, n // 20))]),
            "key callback": (50 * max(1, n // 50), lambda: [
                solution.sort_by(items, key=lambda x: x) for _ in range(max(1, n // 50))]),
        }
        results = {}
        for name, (count, run) in patterns.items():
            run()  # warm: classes, handles, descriptions
            times, trusted_cpu, solution_cpu = [], [], []
            for _ in range(rounds):
                if profiler:
                    profiler.enable()
                start, cpu, child_cpu = time.perf_counter(), time.process_time(), _cpu_of(child)
                run()
                times.append((time.perf_counter() - start) / count * 1e6)
                trusted_cpu.append((time.process_time() - cpu) / count * 1e6)
                solution_cpu.append((_cpu_of(child) - child_cpu) / count * 1e6)
                if profiler:
                    profiler.disable()
            results[name] = (statistics.median(times), statistics.median(trusted_cpu),
                             statistics.median(solution_cpu))
        return results
    finally:
        sys.meta_path.remove(finder)
        sys.modules.pop("solution", None)
        left.close()
        os.waitpid(child, 0)
        if profiler:
            profiler.dump_stats(os.path.join(profile, "trusted.prof"))


def parts(n: int) -> dict[str, float]:
    """CPU µs of each part of a crossing, measured alone (see the module docstring)."""
    def best(run) -> float:
        return min(timeit.repeat(run, number=n, repeat=7, timer=time.process_time)) / n * 1e6

    request, reply = {"op": "call", "h": {"h": 2}, "a": [{"i": "1"}], "k": []}, {"ok": {"i": "2"}}
    body = json.dumps(request, separators=(",", ":")).encode()
    left, right = socket.socketpair()
    near, far = Channel(left), Channel(right)
    endpoint = Endpoint(None)

    def frames() -> None:
        near.send(request)
        far.receive()
        far.send(reply)
        near.receive()

    def raw() -> None:
        left.sendall(b"\0\0\0\5hello")
        right.recv(65536)
        right.sendall(b"\0\0\0\5hello")
        left.recv(65536)

    def turn() -> None:
        endpoint._pop(endpoint._ask_turn())

    try:
        figures = {
            "JSON of a call request": best(lambda: json.dumps(request, separators=(",", ":")).encode()),
            "its decoding": best(lambda: json.loads(body.decode())),
            "request + reply, both ends' channels": best(frames),
            "  their 4 system calls": best(raw),
        }
        left.settimeout(60)
        right.settimeout(60)
        figures["  with Python's poll-before-read timeout"] = best(raw)
        figures["turn taking (locks)"] = best(turn)
        return figures
    finally:
        left.close()
        right.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=2000, help="crossings per pattern and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", help="write cProfile statistics of both ends to this folder")
    parser.add_argument("--parts", action="store_true", help="also the CPU of a crossing's parts, measured alone")
    args = parser.parse_args()
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
    with open("/proc/loadavg") as handle:
        print(f"load average {handle.read().split()[0]}; µs per crossing: wall, trusted CPU, solution CPU")
    for name, (wall, trusted, solution) in measure(args.n, args.rounds, args.profile).items():
        print(f"{name:34s} {wall:9.1f} {trusted:9.1f} {solution:9.1f}")
    if args.parts:
        print("parts of a crossing, CPU µs:")
        for name, micros in parts(10_000).items():
            print(f"{name:40s} {micros:7.2f}")


if __name__ == "__main__":
    main()
