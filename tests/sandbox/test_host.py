"""The host-side machinery under the process backends: the confined workspace, limited processes, clean env.

The conformance suite (test_sandbox_conformance.py) checks these through whole
backends; here each piece is checked on its own, with the edge cases a backend
would hide.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

import pytest

from factory.errors import SandboxError, SandboxPathError
from factory.sandbox import (
    ExecResult,
    HostWorkspace,
    SandboxLimits,
    default_sandbox_name,
    processes_of,
    run_limited,
    sandbox_environment,
)


@pytest.fixture
def workspace():
    ws = HostWorkspace("factory-test-")
    ws.create({"src/app.py": "print('hi')\n", "notes.txt": "n\n"}, {"tests/test_app.py": "def test(): pass\n"})
    yield ws
    ws.remove()


# ------------------------------------------------------------------ ExecResult


@pytest.mark.parametrize(("result", "ok"), [
    (ExecResult(0, "out", ""), True),
    (ExecResult(1, "", "boom"), False),
    (ExecResult(0, "", "", timed_out=True), False),
    (ExecResult(0, "", "", output_truncated=True), False),
])
def test_exec_result_is_ok_only_for_a_clean_zero_exit(result, ok):
    assert result.ok is ok


def test_exec_result_describes_output_then_status():
    assert ExecResult(2, "out\n", "err\n").describe() == "out\nerr\n[exit code 2]"
    assert ExecResult(0, "", "").describe() == "[exit code 0]"
    assert ExecResult(-9, "partial", "", timed_out=True, duration_s=3.04).describe() == \
        "partial\n[timed out after 3.0s; process tree killed]"
    assert ExecResult(-9, "x" * 3, "", output_truncated=True).describe() == \
        "xxx\n[output limit exceeded; process tree killed]"


# ------------------------------------------------------------------ HostWorkspace


def test_workspace_is_seeded_and_lists_files_sorted(workspace):
    assert workspace.root is not None and workspace.root.is_dir()
    assert workspace.list() == ["notes.txt", "src/app.py", "tests/test_app.py"]
    assert workspace.list("src") == ["src/app.py"]
    assert workspace.list("src/app.py") == ["src/app.py"]
    assert workspace.read("src/app.py") == "print('hi')\n"


def test_workspace_paths_may_be_written_as_under_slash_workspace(workspace):
    assert workspace.read("/workspace/src/app.py") == "print('hi')\n"
    assert workspace.list("/workspace") == workspace.list()


@pytest.mark.parametrize("path", ["/etc/passwd", "../outside", "src/../../outside", "", "  ", "a\x00b"])
def test_paths_that_escape_or_are_not_relative_are_refused(workspace, path):
    with pytest.raises(SandboxPathError):
        workspace.read(path)
    with pytest.raises(SandboxPathError):
        workspace.write(path, "x")
    assert not (workspace.root.parent / "outside").exists()


def test_a_symlink_pointing_out_is_refused(workspace, tmp_path):
    (tmp_path / "secret.txt").write_text("host secret")
    os.symlink(tmp_path / "secret.txt", workspace.root / "link.txt")
    with pytest.raises(SandboxPathError):
        workspace.read("link.txt")
    with pytest.raises(SandboxPathError):
        workspace.write("link.txt", "overwrite")
    assert (tmp_path / "secret.txt").read_text() == "host secret"


def test_writes_create_parents_and_take_bytes(workspace):
    workspace.write("deep/er/file.bin", b"\x00\x01")
    workspace.write("deep/text.txt", "über")
    assert (workspace.root / "deep/er/file.bin").read_bytes() == b"\x00\x01"
    assert workspace.read("deep/text.txt") == "über"


def test_read_only_files_and_the_root_cannot_be_written(workspace):
    with pytest.raises(SandboxPathError, match="read-only"):
        workspace.write("tests/test_app.py", "def test(): assert False\n")
    with pytest.raises(SandboxPathError, match="read-only"):
        workspace.write(".", "x")
    assert oct((workspace.root / "tests/test_app.py").stat().st_mode & 0o777) == "0o444"


def test_writing_where_a_directory_is_fails_cleanly(workspace):
    with pytest.raises(SandboxPathError, match="src"):
        workspace.write("src", "a file where a directory is")
    with pytest.raises(SandboxPathError, match="notes.txt"):
        workspace.write("notes.txt/child", "under a file")
    assert workspace.read("notes.txt") == "n\n"


def test_missing_files_and_directories_are_path_errors(workspace):
    with pytest.raises(SandboxPathError, match="no such file: absent.py"):
        workspace.read("absent.py")
    with pytest.raises(SandboxPathError, match="src"):
        workspace.read("src")
    with pytest.raises(SandboxPathError, match="no such directory: nowhere"):
        workspace.list("nowhere")


def test_undecodable_bytes_are_replaced_and_pycache_is_not_listed(workspace):
    (workspace.root / "bad.txt").write_bytes(b"ok \xff\xfe end")
    (workspace.root / "src/__pycache__").mkdir()
    (workspace.root / "src/__pycache__/app.cpython.pyc").write_bytes(b"\x00")
    assert workspace.read("bad.txt") == "ok \ufffd\ufffd end"
    assert "src/__pycache__/app.cpython.pyc" not in workspace.list()


def test_remove_deletes_the_directory_and_is_idempotent():
    ws = HostWorkspace()
    root = ws.create({"a.txt": "a"}, {"t.txt": "t"})
    ws.remove()
    assert not root.exists() and ws.root is None
    ws.remove()
    with pytest.raises(SandboxError, match="not started"):
        ws.read("a.txt")


# ------------------------------------------------------------------ environment


def test_the_sandbox_environment_holds_nothing_of_the_host(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    env = sandbox_environment("/work/home", "/opt/py/bin")
    assert "OPENAI_API_KEY" not in env and "sk-secret" not in "".join(env.values())
    assert env["HOME"] == "/work/home"
    assert env["PATH"].split(":") == ["/opt/py/bin", "/usr/local/bin", "/usr/bin", "/bin"]
    assert env["PYTHONHASHSEED"] == "0" and env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert sandbox_environment("/h", None)["PATH"] == "/usr/local/bin:/usr/bin:/bin"


def test_processes_of_counts_this_users_processes():
    mine = processes_of(os.getuid())
    assert mine >= 1  # this test runner at least
    assert processes_of(2**31 - 7) == 0  # a uid nobody has


def test_default_backend_is_bwrap_on_linux():
    assert default_sandbox_name() == ("bwrap" if sys.platform.startswith("linux") else "none")


# ------------------------------------------------------------------ run_limited

LIMITS = SandboxLimits(timeout_s=20, memory_mb=512, max_output_bytes=10_000)


def run(argv, tmp_path, *, timeout=20.0, stdin=None, limits=LIMITS, env=None):
    return asyncio.run(run_limited(argv, cwd=str(tmp_path), env=env or sandbox_environment(str(tmp_path), None),
                                   limits=limits, timeout=timeout, stdin=stdin, nproc=None))


def test_run_limited_captures_exit_code_output_and_stdin(tmp_path):
    result = run(["sh", "-c", "cat; echo err >&2; exit 4"], tmp_path, stdin=b"fed\n")
    assert (result.exit_code, result.stdout, result.stderr) == (4, "fed\n", "err\n")
    assert not result.timed_out and not result.output_truncated and result.duration_s > 0


def test_run_limited_runs_in_the_given_directory_with_only_the_given_environment(tmp_path):
    result = run(["sh", "-c", "pwd; echo ${OPENAI_API_KEY:-unset}"], tmp_path,
                 env={"PATH": "/usr/bin:/bin", "OPENAI_API_KEY": "only-this"})
    assert result.stdout.split() == [str(tmp_path), "only-this"]


def test_run_limited_kills_the_tree_on_timeout(tmp_path):
    start = time.monotonic()
    result = run(["sh", "-c", "(sleep 2; touch late) & sleep 30"], tmp_path, timeout=0.5)
    assert result.timed_out and not result.ok and time.monotonic() - start < 10
    time.sleep(2.5)
    assert not (tmp_path / "late").exists()


def test_run_limited_caps_output_and_kills_a_flood(tmp_path):
    result = run(["sh", "-c", "yes flood"], tmp_path, limits=SandboxLimits(max_output_bytes=5000))
    assert result.output_truncated and not result.timed_out
    assert len(result.stdout.encode()) == 5000 and result.stdout.startswith("flood\n")


def test_run_limited_applies_the_file_size_limit(tmp_path):
    result = run(["sh", "-c", "head -c 3000000 /dev/zero > big.bin"], tmp_path,
                 limits=SandboxLimits(max_file_mb=1))
    assert result.exit_code != 0
    assert (tmp_path / "big.bin").stat().st_size <= 1024 * 1024
