"""What is specific to the docker backend, on a real engine: the container's lifetime and what the agent can do to it.

The conformance suite (every guarantee, bwrap's included) and the escape tests
run on docker elsewhere; these pin the rest: a container never outlives its
process (closed, crashed or ``kill -9``'d), the agent cannot end its own
container nor leave a process or shared memory behind, and a missing image is
a clean error that says how to build one. They skip, with the reason, where no
engine or no image is at hand.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from factory.errors import SandboxUnavailableError
from factory.sandbox import (
    CONFORMANCE_SPEC,
    DockerSandbox,
    SandboxLimits,
    SandboxSpec,
    create_sandbox,
    default_image_tag,
    docker_image_status,
    drain_docker_pool,
    sandbox_folder,
    sweep_docker_containers,
)

DOCKER_OK, DOCKER_WHY = docker_image_status()  # no engine answers: not OK either, and it says so
pytestmark = pytest.mark.skipif(not DOCKER_OK, reason=f"docker: {DOCKER_WHY}")
LIMITS = SandboxLimits(timeout_s=20, memory_mb=512, max_processes=48, max_output_bytes=200_000)


def run(coro):
    return asyncio.run(coro)


def containers(**labels: str) -> list:
    import docker

    filters = ["factory.sandbox=1"] + [f"factory.sandbox.{k}={v}" for k, v in labels.items()]
    return docker.from_env().containers.list(all=True, filters={"label": filters})


def test_a_closed_sandbox_leaves_no_container():
    folder = str(sandbox_folder())
    before = {c.id for c in containers(folder=folder)}

    async def body():
        async with create_sandbox("docker", CONFORMANCE_SPEC) as sb:
            assert (await sb.exec("echo up")).stdout == "up\n"
            await asyncio.to_thread(drain_docker_pool)  # the pre-started spare the start asked for goes
            return {c.id for c in containers(folder=folder)} - before

    started = run(body())
    assert len(started) == 1
    drain_docker_pool()  # the removal runs off the closer's path (no host folder mounted): wait for it
    assert not started & {c.id for c in containers(folder=folder)}


def test_pooled_containers_are_fresh_and_never_reused():
    """A pre-started container is handed out once, seeded with its own sandbox's files, and gone after its close."""

    async def body():
        seen = []
        for n in range(3):
            spec = replace(CONFORMANCE_SPEC, files={**CONFORMANCE_SPEC.files, "mark.txt": f"run {n}"})
            async with create_sandbox("docker", spec) as sb:
                seen.append(sb._container.id)
                result = await sb.exec("cat mark.txt; ls /tmp | wc -l; touch /tmp/left-behind")
                assert result.stdout == f"run {n}0\n", result.describe()
            await asyncio.sleep(0.5)
        return seen

    try:
        seen = run(body())
    finally:
        drain_docker_pool()
    assert len(set(seen)) == 3
    assert not set(seen) & {c.id for c in containers()}


CHILD = """
import asyncio, sys
from factory.sandbox import create_sandbox, drain_docker_pool, CONFORMANCE_SPEC

async def main():
    sandbox = create_sandbox("docker", CONFORMANCE_SPEC)
    await sandbox.start()
    await asyncio.to_thread(drain_docker_pool)  # only the sandbox's own container is left
    print("ready", flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


def test_a_killed_process_leaves_no_container():
    """kill -9 runs no cleanup: PID 1's stdin closes with the process's connection, and the engine removes it."""
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        mine = [c for c in containers(host=socket.gethostname())
                if c.labels.get("factory.sandbox.folder", "").endswith(f"-{child.pid}")]
        assert len(mine) == 1
        # Another process's sweep could remove it too; this is the mechanism that does not need one.
        assert mine[0].attrs["Config"]["StdinOnce"] and mine[0].attrs["Config"]["OpenStdin"]
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(c.id == mine[0].id for c in containers()):
            time.sleep(0.5)
        assert not any(c.id == mine[0].id for c in containers()), "the container outlived its process"
    finally:
        child.kill()
        child.wait()


def test_sweep_removes_containers_of_gone_processes_and_keeps_live_ones():
    import docker

    client = docker.from_env()
    host = socket.gethostname()
    dead = client.containers.create(default_image_tag(), ["sleep", "300"], network_mode="none", labels={
        "factory.sandbox": "1", "factory.sandbox.host": host, "factory.sandbox.folder": "/nonexistent/run-1"})
    live = client.containers.create(default_image_tag(), ["sleep", "300"], network_mode="none", labels={
        "factory.sandbox": "1", "factory.sandbox.host": host, "factory.sandbox.folder": str(sandbox_folder())})
    try:
        removed = sweep_docker_containers()
        assert dead.id in removed and live.id not in removed
        ids = {c.id for c in containers()}
        assert dead.id not in ids and live.id in ids
    finally:
        for container in (dead, live):
            try:
                container.remove(force=True)
            except docker.errors.NotFound:
                pass


def test_the_agent_cannot_end_its_own_container():
    """Killing every process it can, PID 1 included, leaves the sandbox working: no infra error to hide behind."""
    async def body():
        async with create_sandbox("docker", CONFORMANCE_SPEC) as sb:
            attack = await sb.exec("kill -9 1; kill -9 -1; echo survived")
            again = await sb.exec("echo alive && id -u")
            return attack, again

    attack, again = run(body())
    assert again.stdout == "alive\n65534\n", again.describe()


def test_agent_processes_do_not_outlive_a_command():
    async def body():
        async with create_sandbox("docker", CONFORMANCE_SPEC) as sb:
            await sb.exec("nohup sh -c 'sleep 2; echo late > late.txt' >/dev/null 2>&1 &")
            await asyncio.sleep(3)
            return await sb.list_files()

    assert "late.txt" not in run(body())


def test_killing_everything_else_it_can_leaves_no_process_behind():
    """The command kills every process around it but one it hid in a session of its own: the wrapper is not its."""
    attack = ("setsid sh -c 'sleep 2.5 && echo late > late.txt' </dev/null >/dev/null 2>&1 & hidden=$!; sleep 0.3; "
              "for pid in $(ps -eo pid=); do case \" $$ $hidden $(ps -o pid= --ppid $hidden) \" in *\" $pid \"*) ;; "
              "*) kill -9 \"$pid\" 2>/dev/null;; esac; done; ps -eo user=,args=")

    async def body():
        async with create_sandbox("docker", CONFORMANCE_SPEC) as sb:
            seen = await sb.exec(attack)
            await asyncio.sleep(3)
            left = await sb.exec("ps -eo user=,args= | grep -v 'ps -eo' | grep nobody || true")
            return seen, await sb.list_files(), left

    seen, listed, left = run(body())
    assert "timeout" in seen.stdout and "sleep 2.5" in seen.stdout, seen.describe()  # both outlived the attack
    assert "late.txt" not in listed
    assert "sleep 2.5" not in left.stdout, left.describe()


def test_shared_memory_and_message_queues_do_not_outlive_a_command():
    """SysV IPC outlives the processes that made it: segments must go with them, and queues are off."""
    hold = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "libc.shmat.restype = ctypes.c_void_p\n"
            "ids = [libc.shmget(0, 32 << 20, 0o1600) for _ in range(4)]\n"
            "for i in ids:\n    address = libc.shmat(i, None, 0)\n    ctypes.memset(address, 1, 32 << 20)\n"
            "    libc.shmdt(ctypes.c_void_p(address))\n"
            "print('queue', libc.msgget(0, 0o1600))\n")

    async def body():
        async with create_sandbox("docker", CONFORMANCE_SPEC) as sb:
            made = await sb.exec(["python", "-c", hold])
            left = await sb.exec("tail -n +2 /proc/sysvipc/shm | wc -l")
            return made, left

    made, left = run(body())
    assert "queue -1" in made.stdout, made.describe()
    assert left.stdout.strip() == "0", left.describe()


def test_a_missing_image_is_a_clean_error_that_says_how_to_build_one():
    missing = "factory-no-such-image:never"
    present, why = docker_image_status(missing)
    assert not present and "factory sandbox build-image" in why
    folder = str(sandbox_folder())
    drain_docker_pool()  # earlier tests' spares and removals under way are not this test's
    before = {c.id for c in containers(folder=folder)}
    with pytest.raises(SandboxUnavailableError, match="not present: build it offline"):
        run(DockerSandbox(SandboxSpec(image=missing)).start())
    assert {c.id for c in containers(folder=folder)} == before


def test_tests_are_root_owned_in_sticky_folders_and_the_rest_is_the_agents():
    spec = SandboxSpec(files={"src/app.py": "x = 1\n"}, readonly_files={"tests/test_app.py": "def test(): pass\n"},
                       limits=LIMITS)

    async def body():
        async with create_sandbox("docker", spec) as sb:
            listing = await sb.exec("stat -c '%U %a %n' . tests tests/test_app.py src src/app.py")
            attempts = await sb.exec("mv tests t2; mv tests/test_app.py x.py; touch tests/conftest.py && echo added")
            return listing.stdout.splitlines(), attempts.stdout, await sb.read_file("tests/test_app.py")

    listing, attempts, test = run(body())
    assert listing == ["root 1777 .", "root 1777 tests", "root 444 tests/test_app.py", "nobody 755 src",
                       "nobody 644 src/app.py"]
    assert attempts == "added\n"  # the agent may add files beside the tests, never move them
    assert test == "def test(): pass\n"


def test_the_container_has_no_host_file_and_no_capability():
    async def body():
        async with create_sandbox("docker", CONFORMANCE_SPEC) as sb:
            return await sb.exec("grep -E '^Cap(Eff|Prm|Inh|Amb)' /proc/self/status; grep NoNewPrivs /proc/self/status;"
                                 f" test -e {os.getcwd()} && echo host-visible")

    result = run(body())
    lines = dict(line.split(":\t") for line in result.stdout.splitlines() if ":\t" in line)
    assert all(lines[key].strip("0") == "" for key in ("CapEff", "CapPrm", "CapInh", "CapAmb")), lines
    assert lines["NoNewPrivs"].strip() == "1"
    assert "host-visible" not in result.stdout


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _fork(tmp_path: Path, tasks: Path, sandbox: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "factory.cli", "fork", str(tasks), "--model",
         f"replay:{EXAMPLES / 'code-agent.replay.jsonl'}", "--branches", "3", "--max-turns", "4", "--seed", "1",
         "--sandbox", sandbox, "--db", str(tmp_path / f"{sandbox}.duckdb")],
        capture_output=True, text=True, timeout=600)


def _verdicts(db: Path) -> dict:
    import duckdb

    with duckdb.connect(str(db), read_only=True) as connection:
        rows = connection.execute("SELECT task_id, branch_index, verifier, ok, status, score, details "
                                  "FROM verdicts").fetchall()
    # An error verdict's code and exception are part of what is compared, so a mismatch says what went wrong.
    return {(task, branch, verifier): (ok, status, round(score or 0, 6), *(json.loads(details).get(key) for key in (
        "passed", "total", "hack_detected", "code", "exception"))) for task, branch, verifier, ok, status, score,
            details in rows}


def test_fork_on_docker_verifies_code_tasks_as_bwrap_does(tmp_path):
    """The same scripted agent (a correct fix, a wrong one, a conftest hack per task) gets the same verdicts."""
    lines = [line for line in (EXAMPLES / "tasks.jsonl").read_text().splitlines() if '"fix-factorial"' in line]
    lines += [line for line in (EXAMPLES / "humaneval-style.jsonl").read_text().splitlines()
              if '"he-close-elements"' in line]  # hidden tests: the fitted solution passes only the visible ones
    tasks = tmp_path / "code.jsonl"
    tasks.write_text("\n".join(lines) + "\n")
    runs = {sandbox: _fork(tmp_path, tasks, sandbox) for sandbox in ("bwrap", "docker")}
    for sandbox, done in runs.items():
        assert done.returncode == 0, f"{sandbox}: {done.stderr[-2000:]}"
    bwrap, docker = _verdicts(tmp_path / "bwrap.duckdb"), _verdicts(tmp_path / "docker.duckdb")
    assert len(bwrap) == 6 and docker == bwrap
    assert sorted((v[0], bool(v[5])) for v in docker.values()) == [(False, False)] * 2 + [(False, True)] * 2 + [
        (True, False)] * 2  # per task: one correct pass, one wrong fail, one hack caught


def test_fork_with_a_missing_image_fails_before_writing_anything(tmp_path):
    task = json.loads((EXAMPLES / "tasks.jsonl").read_text().splitlines()[0])
    task["image"] = "factory-no-such-image:never"
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(task) + "\n")
    done = _fork(tmp_path, tasks, "docker")
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1].startswith("error: the docker image factory-no-such-image:never is "
                                                           "not present: build it offline")
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "docker.duckdb").exists()


def test_a_workspace_of_many_long_names_is_collected_truncated_never_an_error():
    """Names cost bytes the collection's answer must bound: past its budget the walk is truncated (the agent's
    loss), never an oversized answer the host would have to call an infrastructure error."""
    make = ("import os\nname = 'n' * 200\nfor i in range(300):\n    os.makedirs(f'd{i:03}')\n"
            "    for j in range(100):\n        open(f'd{i:03}/{name}{j:03}', 'w').close()\n")
    spec = SandboxSpec(files={"solution.py": "x = 1\n"}, limits=LIMITS)

    async def body():
        async with create_sandbox("docker", spec) as sb:
            made = await sb.exec(["python", "-c", make], timeout=60)
            assert made.ok, made.describe()
            return await sb.collect_workspace()

    collected = run(body())
    assert collected.truncated
    assert 1000 < len(collected.files) < 30_000
