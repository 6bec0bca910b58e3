"""A throwaway Ray cluster on this host (loopback): a head and worker nodes, each a ``ray start`` process group.

For trying ``--backend ray`` on one machine, and for the tests and benchmarks
that need a real cluster: :class:`LocalRayCluster` starts the head (no
dashboard, no usage report, its own temp folder and free ports), adds worker
nodes, and stops all of it, killing each node's process group (every Ray
daemon and worker process a ``ray start`` leaves is in its group), so nothing
is left behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from factory.errors import ConfigError

__all__ = ["LocalRayCluster"]

#: Seconds a ``ray start`` may take (a loaded 2-core host needs tens of them).
START_TIMEOUT_S = 180.0
#: Tries of a ``ray start`` whose node did not register in Ray's own 30 s (a host busy with other work).
START_TRIES = 3


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _ray_cli() -> str:
    """The ``ray`` command next to this interpreter (a venv's), else on PATH."""
    beside = Path(sys.executable).with_name("ray")
    found = str(beside) if beside.exists() else shutil.which("ray")
    if found is None:
        raise ConfigError("the `ray` command is not installed: pip install 'factory-rlaif[ray]'")
    return found


class LocalRayCluster:
    """A Ray head on 127.0.0.1 and ``workers`` more node processes; a context manager.

    It listens on loopback, without token authentication: for one machine, never a shared network.

    Args:
        workers: Worker nodes besides the head.
        head_cpus: CPUs the head offers to tasks and actors (0: it only coordinates).
        cpus_per_worker: CPUs each worker node offers.

    Attributes:
        address: ``127.0.0.1:PORT``, what ``--ray-address`` takes (set once started).
    """

    def __init__(self, workers: int = 1, head_cpus: int = 1, cpus_per_worker: int = 1):
        self.workers = workers
        self.head_cpus = head_cpus
        self.cpus_per_worker = cpus_per_worker
        self.address = ""
        self.temp_dir: Path | None = None
        self._groups: list[int] = []  # process group of each node's `ray start`, head first

    def _env(self) -> dict[str, str]:
        # Token authentication off, for every node alike: Ray turns it on for a head when a token file
        # exists (~/.ray/auth_token, which a plain ray.init() writes) but not for a joining node.
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
        env.pop("RAY_ADDRESS", None)
        return env

    def _start(self, args: Callable[[], list[str]]) -> None:
        """``ray start`` with ``args()`` (fresh ports each try), tried again when its node was slow to register."""
        for attempt in range(1, START_TRIES + 1):
            # Its own session: the node's daemons share its process group, which stop() kills.
            proc = subprocess.Popen(
                [_ray_cli(), "start", *args(), "--disable-usage-stats", "--include-log-monitor=false"],
                env=self._env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                start_new_session=True)
            try:
                output, _ = proc.communicate(timeout=START_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                output, _ = proc.communicate()
                _kill_groups([proc.pid])
                raise ConfigError(f"ray start took over {START_TIMEOUT_S:.0f}s") from None
            if proc.returncode == 0:
                self._groups.append(proc.pid)
                return
            _kill_groups([proc.pid])
            if "timed out during startup" not in output or attempt == START_TRIES:
                raise ConfigError(f"ray start failed ({proc.returncode}): {output.strip()[-800:]}")

    def start(self) -> LocalRayCluster:
        """Start the head and the worker nodes (each ``ray start`` returns once its node is up).

        Raises:
            ConfigError: Ray is not installed, or a node did not start (with Ray's own words).
        """
        # Short: Ray's unix sockets live under it, and a socket path has at most 107 characters.
        self.temp_dir = Path(tempfile.mkdtemp(prefix="fray-"))

        def head() -> list[str]:
            port = _free_port()
            self.address = f"127.0.0.1:{port}"
            return ["--head", "--node-ip-address=127.0.0.1", f"--port={port}", f"--num-cpus={self.head_cpus}",
                    "--include-dashboard=false", f"--temp-dir={self.temp_dir}",
                    f"--ray-client-server-port={_free_port()}", f"--dashboard-agent-listen-port={_free_port()}"]

        try:
            self._start(head)
            for _ in range(self.workers):
                self.add_worker()
        except BaseException:
            self.stop()
            raise
        return self

    def add_worker(self, cpus: int | None = None) -> None:
        """Start one more worker node joining the head."""
        self._start(lambda: [f"--address={self.address}", "--node-ip-address=127.0.0.1",
                             f"--num-cpus={self.cpus_per_worker if cpus is None else cpus}",
                             f"--dashboard-agent-listen-port={_free_port()}"])

    def stop(self, grace_s: float = 5.0) -> None:
        """Kill every node's process group and the workers its raylet started; remove the temp folder.

        Each group is terminated, then killed once ``grace_s`` has passed. Ray's worker processes
        run in sessions of their own (they end with their raylet); they are killed too, whatever state
        their raylet was in.
        """
        groups, self._groups = self._groups, []
        _kill_groups(groups[::-1], grace_s)
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            self.temp_dir = None

    def __enter__(self) -> LocalRayCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _kill_groups(groups: list[int], grace_s: float = 5.0) -> None:
    """Terminate the process groups, kill what is left after ``grace_s``, and kill their workers."""
    workers = _descendants(groups)
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for group in groups:
        while time.monotonic() < deadline and _alive(group):
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
    for pid in workers:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _descendants(groups: list[int]) -> set[int]:
    """Processes outside ``groups`` descended from a process in one of them (Linux ``/proc``; else none)."""
    parents: dict[int, tuple[int, int]] = {}  # pid -> (parent, group)
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = entry.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parents[int(entry.parent.name)] = (int(fields[1]), int(fields[2]))
    found = {pid for pid, (_, group) in parents.items() if group in groups}
    grew = True
    while grew:
        more = {pid for pid, (parent, _) in parents.items() if parent in found and pid not in found}
        found |= more
        grew = bool(more)
    return {pid for pid in found if parents[pid][1] not in groups}


def _alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True
