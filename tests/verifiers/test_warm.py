"""Warm trusted runners: one forked child per verification, nothing carried from one to the next."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from factory.sandbox import SandboxLimits, docker_image_status, drain_docker_pool, sandbox_folder
from factory.tasks import Task
from factory.verifiers import BranchOutput, Criterion, TestsVerifier, VerifyContext, _warm, run_verifier

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap is not installed")
DOCKER_OK, DOCKER_WHY = docker_image_status()  # no engine answers: not OK either, and it says so
needs_docker = pytest.mark.skipif(not DOCKER_OK, reason=f"docker: {DOCKER_WHY}")

# Each run leaves a file in its working directory (one in a folder it made read-only), its HOME, /tmp and
# /dev/shm, and a process behind; the next run of the same warm runner must find none of them (it would fail
# test_clean_start).
TESTS = textwrap.dedent("""
    import os, subprocess, sys
    from solution import value

    MARKS = ["left-by-a-run.txt", "read-only-folder/inside.txt", os.path.expanduser("~/left-in-home.txt"),
             "/tmp/left-in-tmp.txt", "/dev/shm/left-in-shm.txt"]

    def test_clean_start():
        assert [m for m in MARKS if os.path.exists(m)] == []
        alive = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as handle:
                    alive.append(handle.read())
            except OSError:
                pass
        assert not [args for args in alive if b"left-behind-sleeper" in args]

    def test_value():
        assert value() == 42

    def test_leave_traces():
        os.mkdir("read-only-folder")
        for mark in MARKS:
            with open(mark, "w") as handle:
                handle.write("x")
        os.chmod("read-only-folder", 0o555)
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "left-behind-sleeper"],
                         start_new_session=True)
""")
TASK = Task(id="warm", prompt="p", files={"solution.py": "def value():\n    return 0\n"},
            tests={"test_solution.py": TESTS})
LIMITS = SandboxLimits(timeout_s=60)


async def verify(verifier: TestsVerifier, task: Task, solution: str):
    criterion = Criterion("tests", "tests pass", "tests", task.effective_test_command)
    ctx = VerifyContext(task, BranchOutput("done"), criterion, None,
                        workspace={**task.tests, "solution.py": solution})
    return await run_verifier(verifier, ctx)


@pytest.mark.parametrize("backend", [pytest.param("bwrap", marks=needs_bwrap),
                                     pytest.param("docker", marks=needs_docker)])
def test_a_warm_runner_is_reused_and_each_run_starts_clean(backend):
    async def main():
        verifier = TestsVerifier(timeout_s=60, limits=LIMITS, reference_sandbox=backend)
        try:
            first = await verify(verifier, TASK, "def value():\n    return 42\n")
            second = await verify(verifier, TASK, "def value():\n    return 42\n")
            wrong = await verify(verifier, TASK, "def value():\n    return 41\n")
            pool = _warm._pool()
            runners = [r for idle in pool.idle.values() for r in idle]
            return first, second, wrong, runners
        finally:
            await verifier.aclose()

    first, second, wrong, runners = asyncio.run(main())
    assert first.status == "pass", first.details
    assert second.status == "pass", second.details  # no trace of the first run
    assert wrong.status == "fail" and wrong.details["failed"] == ["test_solution.py::test_value"], wrong.details
    assert len(runners) == 1 and runners[0].runs == 3 and runners[0].backend == backend
    if backend == "docker":  # the runner, its spare solution container and every run's are gone
        drain_docker_pool()
        assert _containers_of_this_process() == []


def _containers_of_this_process() -> list[str]:
    import docker

    client = docker.from_env()
    return [c.id for c in client.containers.list(
        all=True, filters={"label": [f"factory.sandbox.folder={sandbox_folder()}"]})]


@needs_docker
def test_a_warm_runner_that_cannot_start_leaves_the_verification_to_a_fresh_trusted_sandbox():
    # An image the engine lacks: the runner's container cannot start, so the fresh trusted sandbox is tried (and
    # fails the same way, saying why); the pool does not try this configuration again for a while.
    task = Task(id="no-image", prompt="p", files=TASK.files, tests=TASK.tests, image="factory-test-absent:none")

    async def main():
        verifier = TestsVerifier(timeout_s=60, limits=LIMITS, reference_sandbox="docker")
        try:
            verdict = await verify(verifier, task, "def value():\n    return 42\n")
            return verdict, dict(_warm._pool().failed)
        finally:
            await verifier.aclose()

    verdict, failed = asyncio.run(main())
    assert verdict.status == "error" and "factory-test-absent:none" in str(verdict.details), verdict.details
    assert [key[:2] for key in failed] == [("docker", "factory-test-absent:none")]


@needs_bwrap
def test_concurrent_verifications_of_one_task_get_runners_of_their_own():
    async def main():
        verifier = TestsVerifier(timeout_s=60, limits=LIMITS)
        try:
            verdicts = await asyncio.gather(verify(verifier, TASK, "def value():\n    return 42\n"),
                                            verify(verifier, TASK, "def value():\n    return 7\n"))
            runners = [r for idle in _warm._pool().idle.values() for r in idle]
            return verdicts, runners
        finally:
            await verifier.aclose()

    (right, wrong), runners = asyncio.run(main())
    assert right.status == "pass", right.details
    assert wrong.status == "fail" and wrong.details["failed"] == ["test_solution.py::test_value"], wrong.details
    assert len(runners) == 2


@needs_bwrap
def test_a_warm_run_past_its_time_limit_says_so_and_the_runner_serves_the_next():
    # The trusted side itself outlives the limit (a solution call that hangs is cut off sooner, by the call limit).
    task = Task(id="slow", prompt="p", files={"solution.py": ""}, tests={"test_slow.py": (
        "import time\nfrom solution import slow\n\ndef test_wait():\n    if slow():\n        time.sleep(60)\n")},
        limits={"timeout_s": 4})
    hang = "def slow():\n    return True\n"

    async def main():
        verifier = TestsVerifier(timeout_s=60, limits=LIMITS)
        try:
            slow = await verify(verifier, task, hang)
            quick = await verify(verifier, task, "def slow():\n    return False\n")
            return slow, quick
        finally:
            await verifier.aclose()

    slow, quick = asyncio.run(main())
    assert slow.status == "fail" and slow.details["limit"]["name"] == "time", slow.details
    assert quick.status == "pass", quick.details


@needs_bwrap
def test_a_runners_sweep_never_walks_a_read_only_bind_under_tmp(tmp_path):
    """A virtual environment under /tmp is bound read-only at its own path inside the sandbox's /tmp: the sweep
    after each verification empties /tmp but never enters that mount (it used to fail on each of its files, every
    run: three times slower verifications from a checkout under /tmp), and still removes what a run left."""
    venv = tmp_path / "venv"
    for folder in range(20):
        (venv / f"pkg{folder}").mkdir(parents=True)
        for name in range(20):
            (venv / f"pkg{folder}" / f"m{name}.py").write_text("")
    zygote = Path(__file__).resolve().parents[2] / "factory" / "verifiers" / "_zygote.py"
    source = zygote.read_text().split('\nif __name__ == "__main__":')[0]  # its functions, not its serving
    # The runner's source travels as text and the interpreter is the real one: a checkout or a venv under /tmp
    # (CI's) is hidden under the sandbox's own /tmp here.
    code = f"""
import json, os, types
zygote = types.ModuleType("__main__")  # as in the sandbox, where the sources it imports precede it
exec(compile({source!r}, "_zygote.py", "exec"), zygote.__dict__)
open("/tmp/left-by-a-run.txt", "w").close()
os.makedirs("/tmp/made/by/a/run")
os.mkdir("/tmp/deep")
os.chdir("/tmp/deep")
for _ in range(1100):  # deeper than Python's recursion limit
    os.mkdir("d")
    os.chdir("d")
open("leaf", "w").close()
os.chdir("/")
real = {{name: getattr(os, name) for name in ("unlink", "chmod", "rmdir", "listdir")}}
touched = []
def spy(name):
    def call(path, *args, **kwargs):
        touched.append(str(path))
        return real[name](path, *args, **kwargs)
    return call
for name in real:
    setattr(os, name, spy(name))
zygote.empty("/tmp")
print(json.dumps({{"left": sorted(real["listdir"]("/tmp")),
                  "walked": [path for path in touched if path.startswith("/tmp/ci/venv")]}}))
"""
    bwrap = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
             "--dir", "/tmp/ci", "--ro-bind", str(venv), "/tmp/ci/venv", "--unshare-pid", "--die-with-parent",
             os.path.realpath(sys.executable), "-I", "-c", code]
    result = subprocess.run(bwrap, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["walked"] == []
    assert report["left"] == ["ci"]  # the scaffold holding the mount point; everything the run left is gone
    assert len(list(venv.rglob("*.py"))) == 400
