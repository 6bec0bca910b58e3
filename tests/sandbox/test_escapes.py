"""Escapes a policy under optimisation pressure tries, beyond the conformance suite, and the APIs they shaped.

The conformance suite (``factory/sandbox/_conformance.py``) holds every
backend to the holes it closes; these tests pin what is specific to bwrap,
docker and none: the shared directory, binary files, how the workspace is
collected, the syscall filter's program, the quota's namespace holder. The
docker cases skip, with the reason, where no engine or image is at hand.
"""

from __future__ import annotations

import asyncio
import os
import stat
import struct
import time
import warnings
from pathlib import Path

import pytest

from factory.errors import SandboxPathError, SandboxUnavailableError
from factory.sandbox import (
    CONFORMANCE_SPEC,
    BwrapSandbox,
    NoSandbox,
    NoSandboxWarning,
    Sandbox,
    SandboxLimits,
    SandboxSpec,
    WorkspaceFiles,
    create_sandbox,
    docker_image_status,
    host_file_call,
)
from factory.sandbox._seccomp import BLOCKED_SYSCALLS, seccomp_program

LIMITS = SandboxLimits(timeout_s=20, memory_mb=512, max_processes=48, max_output_bytes=200_000)
DOCKER_OK, DOCKER_WHY = docker_image_status()  # no engine answers: not OK either, and it says so
DOCKER = pytest.param("docker", marks=pytest.mark.skipif(not DOCKER_OK, reason=f"docker: {DOCKER_WHY}"))
BACKENDS = ["bwrap", "none", DOCKER]


def run(coro):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NoSandboxWarning)
        return asyncio.run(coro)


# ------------------------------------------------------------------ shared directory

SERVER = """
import os, socket
path = '/shared/echo.sock'
server = socket.socket(socket.AF_UNIX)
server.bind(path)
os.chmod(path, 0o777)  # the other sandbox runs as another uid
server.listen(1)
conn, _ = server.accept()
conn.sendall(b'echo: ' + conn.recv(100))
conn.close()
"""
CLIENT = """
import socket, time
for _ in range(200):
    try:
        client = socket.socket(socket.AF_UNIX)
        client.connect('/shared/echo.sock')
        break
    except OSError:
        time.sleep(0.05)
client.sendall(b'hello across sandboxes')
print(client.recv(100).decode())
"""


@pytest.mark.parametrize("backend", ["bwrap", DOCKER])
def test_two_sandboxes_talk_through_a_unix_socket_in_the_shared_dir(tmp_path, backend):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    spec = SandboxSpec(limits=LIMITS, shared_dir=str(shared))

    async def body():
        async with create_sandbox(backend, spec) as server, create_sandbox(backend, spec) as client:
            assert server.shared_path == client.shared_path == "/shared"
            served, answered = await asyncio.gather(server.exec(["python", "-c", SERVER], timeout=15),
                                                    client.exec(["python", "-c", CLIENT], timeout=15))
            return served, answered

    served, answered = run(body())
    assert served.ok, served.describe()
    assert answered.stdout == "echo: hello across sandboxes\n", answered.describe()
    assert stat.S_ISSOCK((shared / "echo.sock").lstat().st_mode)  # the host sees it too


@pytest.mark.parametrize("backend", ["bwrap", DOCKER])
def test_a_folder_of_one_sandboxs_shared_dir_is_anothers_whole_shared_dir_at_the_same_path(tmp_path, backend):
    outer = tmp_path / "outer"
    (outer / "run").mkdir(parents=True)
    (outer / "private.txt").write_text("not for the inner sandbox")
    for folder in (outer, outer / "run"):
        folder.chmod(0o1777)

    async def body():
        async with create_sandbox(backend, SandboxSpec(limits=LIMITS, shared_dir=str(outer))) as wide, \
                create_sandbox(backend, SandboxSpec(limits=LIMITS, shared_dir=str(outer / "run"),
                                                    shared_mount="/shared/run")) as narrow:
            assert narrow.shared_path == "/shared/run"
            wrote = await narrow.exec("echo from-narrow > /shared/run/note.txt; ls -a /shared")
            read = await wide.exec("cat /shared/run/note.txt")
            peek = await narrow.exec("cat /shared/private.txt")
            return wrote, read, peek

    wrote, read, peek = run(body())
    assert wrote.ok and wrote.stdout.split() == [".", "..", "run"], wrote.describe()  # its parent: ours, empty
    assert read.stdout == "from-narrow\n", read.describe()
    assert not peek.ok  # the rest of the wide sandbox's shared directory is not there


def test_none_uses_the_shared_dir_in_place(tmp_path):
    spec = SandboxSpec(limits=LIMITS, shared_dir=str(tmp_path))

    async def body():
        async with create_sandbox("none", spec) as sb:
            assert sb.shared_path == str(tmp_path)
            return await sb.exec(f"echo from-none > {sb.shared_path}/note.txt")

    assert run(body()).ok
    assert (tmp_path / "note.txt").read_text() == "from-none\n"


def test_no_shared_dir_means_no_shared_path_and_a_backend_without_one_refuses_it(tmp_path):
    assert BwrapSandbox(SandboxSpec()).shared_path is None
    assert NoSandbox(SandboxSpec()).shared_path is None

    class Plain(NoSandbox):  # a backend that does not say where a shared dir would appear
        shared_path = Sandbox.shared_path

    with pytest.raises(SandboxUnavailableError, match="cannot share a directory"):
        Plain(SandboxSpec(shared_dir=str(tmp_path)))
    with pytest.raises(Exception, match="not a directory"):
        run(BwrapSandbox(SandboxSpec(shared_dir=str(tmp_path / "missing"))).start())


# ------------------------------------------------------------------ binary files and collection

BLOB = bytes(range(256)) * 4


@pytest.mark.parametrize("backend", BACKENDS)
def test_binary_files_round_trip(backend):
    spec = SandboxSpec(files={"data/blob.bin": BLOB, "text.txt": "plain\n"},
                       readonly_files={"fixtures/ro.bin": BLOB[::-1]}, limits=LIMITS)

    async def body():
        async with create_sandbox(backend, spec) as sb:
            digest = await sb.exec(["python", "-c", "import hashlib, sys; print(hashlib.sha256("
                                    "open('data/blob.bin', 'rb').read() + open('fixtures/ro.bin', 'rb').read())"
                                    ".hexdigest())"])
            await sb.write_file("written.bin", BLOB[:100])
            return digest.stdout.strip(), await sb.collect_workspace()

    import hashlib

    digest, collected = run(body())
    assert digest == hashlib.sha256(BLOB + BLOB[::-1]).hexdigest()
    assert collected.files == {"data/blob.bin": BLOB, "text.txt": b"plain\n", "fixtures/ro.bin": BLOB[::-1],
                               "written.bin": BLOB[:100]}


MAKE_ODDITIES = """
import os, socket
os.makedirs('deep/er')
os.mkfifo('deep/er/fifo')
socket.socket(socket.AF_UNIX).bind('sock')
os.symlink('/etc/shadow', 'out-link')
os.symlink('../..', 'deep/er/up')
os.symlink('dangling-target', 'dangling')
open('big.bin', 'wb').write(b'x' * 5000)
open('deep/small.txt', 'w').write('small')
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_collect_workspace_names_links_and_special_files_and_bounds_the_bytes(backend):
    spec = SandboxSpec(files={"solution.py": "x = 1\n"}, limits=LIMITS)

    async def body():
        async with create_sandbox(backend, spec) as sb:
            made = await sb.exec(["python", "-c", MAKE_ODDITIES])
            assert made.ok, made.describe()
            return await sb.collect_workspace(max_bytes=1000)

    collected = run(body())
    assert collected == WorkspaceFiles(
        files={"deep/small.txt": b"small", "solution.py": b"x = 1\n"},
        symlinks={"dangling": "dangling-target", "deep/er/up": "../..", "out-link": "/etc/shadow"},
        special={"deep/er/fifo": "fifo", "sock": "socket"},
        oversized=("big.bin",),
    )


def test_collect_workspace_default_reads_through_the_file_tools():
    class Plain(NoSandbox):  # a backend with only the abstract methods
        collect_workspace = Sandbox.collect_workspace

    spec = SandboxSpec(files={"a.txt": "aaa", "b/c.txt": "über"}, limits=LIMITS)

    async def body():
        async with Plain(spec) as sb:
            return await sb.collect_workspace(max_bytes=6)

    collected = run(body())
    assert collected.files == {"a.txt": b"aaa"} and collected.oversized == ("b/c.txt",)


@pytest.mark.parametrize("backend", BACKENDS)
def test_names_that_are_not_exact_paths_are_collected_as_themselves_and_kept_out_of_verification(backend):
    """'main.py ' is not main.py: collected apart (never over it), never an error, and left out of a new sandbox."""
    from factory.sandbox import files_spec, snapshot_of
    from factory.tasks import Task

    spec = SandboxSpec(files={"main.py": "real\n"}, limits=LIMITS)
    make = "printf evil > 'main.py '; printf evil2 > \"$(printf 'main.py\\t')\"; touch ' '; mkdir -p d && touch 'd/.. '"

    async def body():
        async with create_sandbox(backend, spec) as sb:
            made = await sb.exec(make)
            assert made.ok, made.describe()
            collected = await sb.collect_workspace()
        task = Task(id="t", prompt="p", files={"main.py": "real\n"}, tests={"test_main.py": "def test(): pass\n"})
        async with create_sandbox(backend, files_spec(task, collected.files, LIMITS)) as fresh:
            listed = await fresh.list_files()
        return collected, snapshot_of(collected, task), listed

    collected, snapshot, listed = run(body())
    assert collected.files["main.py"] == b"real\n"
    assert collected.files["main.py "] == b"evil" and collected.files["main.py\t"] == b"evil2"
    assert {" ", "d/.. "} <= set(collected.files)
    assert {"main.py ", "main.py\t", " ", "d/.. "} <= set(snapshot.skipped) and "main.py" not in snapshot.files
    assert listed == ["main.py", "test_main.py"]


def test_a_walk_that_stops_at_its_depth_limit_says_it_is_truncated(tmp_path):
    from factory.sandbox._fdtree import FdTree

    deep = tmp_path.joinpath(*["d"] * 70)
    deep.mkdir(parents=True)
    (deep / "far.txt").write_text("far")
    (tmp_path / "near.txt").write_text("near")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        found = FdTree(fd).collect(1_000_000)
    finally:
        os.close(fd)
    assert found.files == {"near.txt": b"near"} and found.truncated


# ------------------------------------------------------------------ host-side file operations

def test_host_file_operations_run_off_the_event_loop_under_a_timeout():
    async def body():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.05)
                ticks += 1

        task = asyncio.ensure_future(ticker())
        started = time.monotonic()
        with pytest.raises(SandboxPathError, match="timed out"):
            await host_file_call(lambda: time.sleep(3), "a stuck read", timeout=0.5)
        elapsed = time.monotonic() - started
        task.cancel()
        return ticks, elapsed

    ticks, elapsed = run(body())
    assert elapsed < 2 and ticks >= 5  # the loop kept running while the operation hung


@pytest.mark.parametrize("backend", BACKENDS)
def test_fifo_in_place_of_a_file_fails_the_tool_call_at_once(backend):
    async def body():
        async with create_sandbox(backend, SandboxSpec(files={"out.txt": "old"}, limits=LIMITS)) as sb:
            await sb.exec("rm out.txt && mkfifo out.txt")
            started = time.monotonic()
            for attempt in (sb.write_file("out.txt", "new"), sb.read_file("out.txt")):
                with pytest.raises(SandboxPathError, match="fifo"):
                    await attempt
            return time.monotonic() - started

    assert run(body()) < 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_path_component_is_followed_even_inside_the_workspace(backend):
    async def body():
        async with create_sandbox(backend, SandboxSpec(files={"real/f.txt": "f"}, limits=LIMITS)) as sb:
            await sb.exec("ln -s real alias && ln -s real/f.txt flink")
            for attempt in (sb.read_file("alias/f.txt"), sb.write_file("alias/g.txt", "g"), sb.read_file("flink"),
                            sb.write_file("flink", "x"), sb.list_files("alias")):
                with pytest.raises(SandboxPathError):
                    await attempt
            await sb.write_file("real/../real/g.txt", "g")  # lexical .. inside the workspace is fine
            return await sb.list_files(), await sb.read_file("real/f.txt")

    listed, content = run(body())
    assert listed == ["real/f.txt", "real/g.txt"] and content == "f"


# ------------------------------------------------------------------ bwrap specifics

def test_bwrap_etc_is_readable_and_generated_for_the_sandbox_user():
    async def body():
        async with create_sandbox("bwrap", CONFORMANCE_SPEC) as sb:
            return await sb.exec("stat -c %a /etc; id -un; cat /etc/passwd; ls /etc")

    result = run(body())
    lines = result.stdout.splitlines()
    assert result.ok and lines[0] == "755", result.describe()
    assert lines[1] == ("root" if os.geteuid() != 0 else "sandbox")
    assert "postgres" not in result.stdout and "shadow" not in lines[2:]


def test_bwrap_tests_stay_in_place_when_their_folder_is_replaced():
    spec = SandboxSpec(files={"solution.py": "def answer():\n    return 41\n"},
                       readonly_files={"tests/test_solution.py": "from solution import answer\n\n\n"
                                                                 "def test_answer():\n    assert answer() == 42\n"},
                       limits=LIMITS)

    async def body():
        async with create_sandbox("bwrap", spec) as sb:
            moved = await sb.exec("mv tests old && mkdir tests && echo 'def test_answer(): pass' > tests/"
                                  "test_solution.py && python -m pytest -q tests | tail -1")
            after = await sb.exec("python -m pytest -q tests | tail -1")
            return moved, after, await sb.read_file("tests/test_solution.py")

    moved, after, host_view = run(body())
    assert "1 passed" in moved.stdout  # within one command a rename works ...
    assert "1 failed" in after.stdout, after.describe()  # ... the next command sees the real tests again
    assert host_view == "def test_answer(): pass\n"  # and the tamper stays visible to the verifier's scan


def test_bwrap_quota_mount_lives_on_descriptors_only_and_is_gone_after_close():
    sandbox = BwrapSandbox(SandboxSpec(files={"a.txt": "a"}, limits=LIMITS))

    def namespaces_held() -> set[str]:
        held = set()
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except FileNotFoundError:  # the listing's own descriptor
                continue
            if target.startswith("mnt:"):
                held.add(target)
        return held

    def children() -> list[str]:
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == os.getpid():
                found.append(pid)
        return found

    before = namespaces_held()

    async def body():
        async with sandbox:
            mount, private = sandbox._mount, sandbox._workspace.private
            held = namespaces_held() - before
            assert len(held) == 1  # the tmpfs's namespace, with no holder process behind it
            assert (await sandbox.exec("cat a.txt")).stdout == "a"
            assert children() == []
        return mount.mountpoint, private

    mountpoint, private = run(body())
    assert not mountpoint.exists() and not private.exists()
    assert namespaces_held() == before


def test_seccomp_program_is_well_formed_for_each_known_machine():
    for machine in ("x86_64", "aarch64", "amd64", "arm64"):
        program = seccomp_program(machine)
        assert len(program) % 8 == 0
        instructions = [struct.unpack("=HBBI", program[i:i + 8]) for i in range(0, len(program), 8)]
        for index, (code, jt, jf, _) in enumerate(instructions):
            if code & 0x07 == 0x05:  # a jump lands inside the program
                assert index + 1 + max(jt, jf) < len(instructions)
        assert instructions[-3][0] == 0x06  # it ends in returns
    assert len(BLOCKED_SYSCALLS) >= 19
    with pytest.raises(SandboxUnavailableError, match="riscv64"):
        seccomp_program("riscv64")
