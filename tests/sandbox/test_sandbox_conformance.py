"""One conformance suite that every sandbox backend runs.

Each isolation check runs for every backend that claims the guarantee; a
backend that does not claim it is skipped with that reason (``none`` says
plainly that it has no network or filesystem isolation).
"""

from __future__ import annotations

import asyncio
import os
import time
import warnings

import pytest

from factory.errors import SandboxPathError
from factory.sandbox import (
    Guarantee,
    NoSandboxWarning,
    SandboxLimits,
    SandboxPool,
    SandboxSpec,
    create_sandbox,
    docker_available,
)

DOCKER_OK, DOCKER_WHY = docker_available()
BACKENDS = [
    pytest.param("bwrap", id="bwrap"),
    pytest.param("none", id="none"),
    pytest.param("docker", id="docker", marks=pytest.mark.skipif(not DOCKER_OK, reason=DOCKER_WHY or "no engine")),
]
SPEC = SandboxSpec(
    files={"solution.py": "def answer():\n    return 41\n", "pkg/data.txt": "hello\n"},
    readonly_files={
        "test_solution.py": "from solution import answer\n\ndef test_answer():\n    assert answer() == 42\n"},
    limits=SandboxLimits(timeout_s=20, memory_mb=512, max_processes=48, max_output_bytes=200_000),
)


def run(coro):
    return asyncio.run(coro)


async def with_sandbox(backend, body, spec=SPEC):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NoSandboxWarning)
        async with create_sandbox(backend, spec) as sandbox:
            return await body(sandbox)


def require(backend: str, guarantee: Guarantee) -> None:
    cls = type(create_sandbox(backend, SPEC))
    if guarantee not in cls.guarantees:
        pytest.skip(f"'{backend}' does not guarantee {guarantee.value}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_file_round_trip_and_listing(backend):
    async def body(sb):
        await sb.write_file("new/dir/note.txt", "über\n")
        assert await sb.read_file("new/dir/note.txt") == "über\n"
        assert await sb.read_file("solution.py") == SPEC.files["solution.py"]
        assert await sb.read_file("test_solution.py") == SPEC.readonly_files["test_solution.py"]
        listed = await sb.list_files()
        assert {"solution.py", "pkg/data.txt", "test_solution.py", "new/dir/note.txt"} <= set(listed)
        assert await sb.list_files("pkg") == ["pkg/data.txt"]
        seen = await sb.exec("cat new/dir/note.txt")
        assert seen.stdout == "über\n"
        with pytest.raises(SandboxPathError):
            await sb.read_file("../../etc/passwd")
        with pytest.raises(SandboxPathError):
            await sb.write_file("/etc/evil", "x")
        with pytest.raises(SandboxPathError):
            await sb.write_file("test_solution.py", "def test_answer(): pass\n")

    run(with_sandbox(backend, body))


@pytest.mark.parametrize("backend", BACKENDS)
def test_exit_codes_stdin_and_python_with_pytest(backend):
    async def body(sb):
        assert (await sb.exec("exit 3")).exit_code == 3
        assert (await sb.exec(["python", "-c", "print(6 * 7)"])).stdout == "42\n"
        echoed = await sb.exec("cat", stdin="from stdin\n")
        assert echoed.stdout == "from stdin\n" and echoed.ok
        failing = await sb.exec("python -m pytest -q")
        assert failing.exit_code == 1 and "1 failed" in failing.stdout
        await sb.write_file("solution.py", "def answer():\n    return 42\n")
        passing = await sb.exec("python -m pytest -q")
        assert passing.exit_code == 0 and "1 passed" in passing.stdout

    run(with_sandbox(backend, body))


@pytest.mark.parametrize("backend", BACKENDS)
def test_timeout_kills_runaway_process_and_children(backend):
    require(backend, Guarantee.TIMEOUT)

    async def body(sb):
        start = time.monotonic()
        result = await sb.exec("(sleep 3; echo late > late.txt) & (sleep 3; echo late2 > late2.txt) & sleep 60",
                               timeout=1)
        assert result.timed_out and not result.ok
        assert time.monotonic() - start < 10
        await asyncio.sleep(3.5)
        files = await sb.list_files()
        assert "late.txt" not in files and "late2.txt" not in files

    run(with_sandbox(backend, body))


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_network(backend):
    require(backend, Guarantee.NETWORK)

    async def body(sb):
        code = ("import socket\n"
                "try:\n    socket.create_connection(('1.1.1.1', 53), timeout=3)\n    print('connected')\n"
                "except OSError as e:\n    print('blocked', e.errno)\n"
                "print(sorted(n for _, n in socket.if_nameindex()))\n")
        result = await sb.exec(["python", "-c", code])
        assert "blocked" in result.stdout, result.describe()
        assert result.stdout.strip().splitlines()[-1] in ("['lo']", "[]")

    run(with_sandbox(backend, body))


@pytest.mark.parametrize("backend", BACKENDS)
def test_host_secret_is_not_visible(backend, monkeypatch):
    require(backend, Guarantee.ENVIRONMENT)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-host-value")
    monkeypatch.setenv("FACTORY_TEST_SECRET", "do-not-leak")

    async def body(sb):
        result = await sb.exec("env; cat /proc/self/environ 2>/dev/null | tr '\\0' '\\n'")
        assert "sk-secret-host-value" not in result.stdout + result.stderr
        assert "do-not-leak" not in result.stdout + result.stderr
        assert "OPENAI_API_KEY" not in result.stdout
        ppid = await sb.exec("cat /proc/1/environ 2>&1 | tr '\\0' '\\n'")
        assert "do-not-leak" not in ppid.stdout

    run(with_sandbox(backend, body))


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_writes_outside_workspace_and_tests_read_only(backend, tmp_path):
    require(backend, Guarantee.FILESYSTEM)
    outside = tmp_path / "outside.txt"

    async def body(sb):
        for target in (str(outside), "/usr/factory-evil", "/etc/factory-evil", "/factory-evil"):
            result = await sb.exec(f"echo pwned > {target}")
            assert result.exit_code != 0, target
        for attack in ("echo 'def test_answer(): pass' > test_solution.py",
                       "rm -f test_solution.py", "mv test_solution.py moved.py",
                       "chmod 666 test_solution.py && echo x >> test_solution.py"):
            await sb.exec(attack)
        assert await sb.read_file("test_solution.py") == SPEC.readonly_files["test_solution.py"]
        assert (await sb.exec("python -m pytest -q")).exit_code == 1

    run(with_sandbox(backend, body))
    assert not outside.exists()
    assert not os.path.exists("/usr/factory-evil") and not os.path.exists("/factory-evil")


@pytest.mark.parametrize("backend", BACKENDS)
def test_read_only_tests_cannot_be_modified(backend):
    require(backend, Guarantee.READONLY_TESTS)

    async def body(sb):
        result = await sb.exec("echo 'def test_answer(): pass' > test_solution.py")
        assert result.exit_code != 0
        assert await sb.read_file("test_solution.py") == SPEC.readonly_files["test_solution.py"]

    run(with_sandbox(backend, body))


@pytest.mark.parametrize("backend", BACKENDS)
def test_fork_bomb_is_contained(backend):
    require(backend, Guarantee.PROCESSES)
    bomb = ("import os, time\nn = 0\ntry:\n    while n < 5000:\n        if os.fork() == 0:\n"
            "            time.sleep(20)\n            os._exit(0)\n        n += 1\n"
            "except OSError:\n    print('contained at', n)\n")

    async def body(sb):
        result = await sb.exec(["python", "-c", bomb], timeout=15)
        assert "contained at" in result.stdout, result.describe()
        assert int(result.stdout.split()[-1]) <= SPEC.limits.max_processes
        # the sandbox still works afterwards, and nothing from the bomb survives
        assert (await sb.exec("echo alive")).stdout == "alive\n"

    run(with_sandbox(backend, body))


@pytest.mark.parametrize("backend", BACKENDS)
def test_memory_hog_is_contained(backend):
    require(backend, Guarantee.MEMORY)

    async def body(sb):
        result = await sb.exec(["python", "-c", "x = bytearray(2 * 1024 ** 3); print('allocated')"])
        assert result.exit_code != 0 and "allocated" not in result.stdout
        assert "MemoryError" in result.stderr or result.exit_code < 0

    run(with_sandbox(backend, body))


@pytest.mark.parametrize("backend", BACKENDS)
def test_output_flood_is_contained(backend):
    require(backend, Guarantee.OUTPUT)

    async def body(sb):
        start = time.monotonic()
        result = await sb.exec("yes 'flood flood flood flood'", timeout=15)
        assert result.output_truncated and not result.timed_out
        assert len(result.stdout.encode()) <= SPEC.limits.max_output_bytes
        assert time.monotonic() - start < 10

    run(with_sandbox(backend, body))


def test_none_backend_warns_and_says_what_it_lacks():
    with pytest.warns(NoSandboxWarning, match="WITHOUT isolation"):
        async def body():
            async with create_sandbox("none", SPEC) as sb:
                return (await sb.exec("echo hi")).stdout
        assert run(body()) == "hi\n"
    none = type(create_sandbox("none", SPEC))
    assert Guarantee.NETWORK not in none.guarantees and Guarantee.FILESYSTEM not in none.guarantees


def test_missing_bubblewrap_names_the_install_command(monkeypatch):
    from factory.errors import SandboxUnavailableError

    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(SandboxUnavailableError, match="apt-get install bubblewrap"):
        run(create_sandbox("bwrap", SPEC).start())


def test_pool_bounds_live_sandboxes_and_disposes_all():
    peak = 0

    async def main():
        nonlocal peak
        pool = SandboxPool(lambda: create_sandbox("bwrap", SPEC), max_concurrent=3)

        async def use(i):
            nonlocal peak
            sb = await pool.acquire(f"b{i}")
            peak = max(peak, pool.live)
            assert (await sb.exec(f"echo {i}")).stdout == f"{i}\n"
            if i % 2:
                await pool.release(f"b{i}")

        holders = [asyncio.create_task(use(i)) for i in range(3)]
        await asyncio.gather(*holders)
        assert pool.live == 2  # the even ones are still held
        waiter = asyncio.create_task(use(10))
        await asyncio.sleep(0.2)
        assert pool.live == 3
        await pool.aclose()
        await waiter
        await pool.aclose()
        assert pool.live == 0

    run(main())
    assert peak <= 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_private_tmp_is_writable(backend):
    async def body(sb):
        result = await sb.exec("echo scratch > \"${TMPDIR:-/tmp}/scratch.txt\" && cat \"${TMPDIR:-/tmp}/scratch.txt\"")
        assert result.stdout == "scratch\n", result.describe()

    run(with_sandbox(backend, body))
