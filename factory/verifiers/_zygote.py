"""The warm trusted runner: pytest imported once per trusted sandbox, one fresh fork per verification.

Composed (after :mod:`._wire`, :mod:`._program_server`, :mod:`._boundary`
and :mod:`._trusted_runner`) into a script that ``python -I -B`` runs from
the shared directory of a *trusted* sandbox whose workspace starts empty: no
task file, no test, no file of any agent. It imports pytest and its built-in plugins, then
listens on a Unix socket in its shared directory, which no solution sandbox
ever sees (each solution sandbox gets only its own verification's channel
folder, a subfolder of it). Most of a short pytest run is importing pytest,
and this side never runs agent code, so the import is done once, here, and
every verification runs in a forked child:

- the host sends the verification's trusted files (the task's tests, its
  pristine data files, package markers, the bootstrap with this
  verification's settings) with the request, and this process writes them
  into its sandbox's workspace, empty between verifications, so they are
  where a fresh trusted sandbox has them (a test hands the solution absolute
  paths of its files and programs); the host makes its channel folder
  (socket, scratch area) in the shared directory;
- the child starts a session of its own and runs :func:`run_tests` (pytest) or
  :func:`launch` (any other command) exactly as the fresh runner and
  launcher scripts do, its output going to pipes this process reads;
- this process enforces the run's wall-clock and output limits (CPU, memory
  and process limits are the sandbox's rlimits, inherited by every fork;
  the CPU time of a fork starts at zero), kills every other process in the
  sandbox and empties the workspace, ``/tmp`` and ``/dev/shm``, so nothing
  one verification started or wrote outlives it, and then answers the host
  with the exit status and output. Memory is never shared:
  each child's writes are its own pages.

The host runs one verification at a time per warm runner (see
:mod:`._warm`); the solution sandbox of a verification shares this sandbox's
user (as a fresh trusted sandbox would), and each gets its own channel.
"""

from __future__ import annotations

import atexit
import json
import os
import resource
import select
import signal
import socket
import stat
import struct
import sys
import time
import traceback

if __name__ != "__main__":  # imported on the host (tests); in the sandbox the sources precede this
    from factory.verifiers._boundary import BOUNDARY_DIR, launch, prepare_runner
    from factory.verifiers._trusted_runner import run_tests

__all__ = ["ZYGOTE_SOCKET", "read_message", "serve", "write_message"]

#: The warm runner's socket, in its shared directory.
ZYGOTE_SOCKET = "zygote.sock"
_LENGTH = struct.Struct(">I")
_MAX_MESSAGE = 64 << 20


def write_message(sock, message):
    """Send one length-prefixed JSON message."""
    data = json.dumps(message).encode()
    sock.sendall(_LENGTH.pack(len(data)) + data)


def read_message(sock):
    """Receive one length-prefixed JSON message (None at end of stream)."""
    header = _recv_exact(sock, _LENGTH.size)
    if header is None:
        return None
    (size,) = _LENGTH.unpack(header)
    if size > _MAX_MESSAGE:
        raise ValueError("message too large")
    data = _recv_exact(sock, size)
    if data is None:
        raise ValueError("truncated message")
    return json.loads(data)


def _recv_exact(sock, size):
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def preload():
    """Import what every pytest run imports: pytest, its built-in plugins, ``unittest`` (unittest suites)."""
    import importlib

    import pytest  # noqa: F401
    from _pytest.config import default_plugins

    for name in default_plugins:
        try:
            importlib.import_module("_pytest." + name)
        except ImportError:  # a plugin of another pytest version
            pass
    import unittest  # noqa: F401


def _child(request):
    """The forked child: one verification, as the fresh runner or launcher script would run it (in the
    sandbox's workspace, which holds this verification's trusted files alone)."""
    sys.dont_write_bytecode = True
    settings = dict(request["settings"])
    nonce = settings.pop("nonce")
    if request["mode"] == "pytest":
        prepare_runner(os.path.join(os.getcwd(), BOUNDARY_DIR))
        payload = run_tests(settings, nonce)
    else:
        payload = launch(settings)
    import base64

    sys.stdout.flush()
    print("\n" + nonce + " " + base64.b64encode(json.dumps(payload).encode()).decode(), flush=True)


def _fork(request, listener, connection):
    """Fork the child for ``request``; returns (pid, stdout read end, stderr read end)."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid:
        os.close(out_w)
        os.close(err_w)
        return pid, out_r, err_r
    status = 70
    try:
        os.setsid()
        listener.close()
        connection.close()
        os.close(out_r)
        os.close(err_r)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        for fd in (null, out_w, err_w):
            os.close(fd)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as at interpreter start: a broken pipe is an OSError
        cpu = request.get("cpu_seconds")
        if cpu:  # the run's own CPU limit (the runner's sandbox has a generous one): as a fresh sandbox sets it
            resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        _child(request)
        status = 0
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    try:
        atexit._run_exitfuncs()  # what the interpreter runs at exit (tests' handlers, logging's flush)
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(status)


def _relay(pid, out_r, err_r, timeout, max_output):
    """Collect the child's output until it exits; kill its session at the deadline or past the output limit."""
    buffers = {out_r: bytearray(), err_r: bytearray()}
    open_fds = [out_r, err_r]
    deadline = time.monotonic() + timeout
    timed_out = truncated = False
    status = None
    exited_at = None
    while open_fds:
        now = time.monotonic()
        if status is None and now >= deadline:
            timed_out = True
            _kill_session(pid)
        if exited_at is not None and now - exited_at > 1.0:
            break  # orphans of the child still hold the pipes: they are swept after the run
        ready, _, _ = select.select(open_fds, [], [], 0.05)
        for fd in ready:
            data = os.read(fd, 1 << 16)
            if not data:
                open_fds.remove(fd)
                continue
            buffer = buffers[fd]
            room = max_output - len(buffer)
            buffer += data[:max(room, 0)]
            if len(data) > room and not truncated:
                truncated = True
                _kill_session(pid)
        if status is None:
            done, raw = os.waitpid(pid, os.WNOHANG)
            if done:
                status = os.waitstatus_to_exitcode(raw)
                exited_at = time.monotonic()
    if status is None:
        _kill_session(pid)
        status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    for fd in (out_r, err_r):
        os.close(fd)
    return {"exit": status, "stdout": buffers[out_r].decode("utf-8", "replace"),
            "stderr": buffers[err_r].decode("utf-8", "replace"), "timed_out": timed_out, "truncated": truncated}


def _kill_session(pid):
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


def _ancestors():
    chain, pid = set(), os.getpid()
    while pid > 0 and pid not in chain:
        chain.add(pid)
        try:
            with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
                pid = int(handle.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return chain


def place(files):
    """Write a verification's trusted files (``{path: base64}``, relative) into the empty workspace."""
    import base64

    for rel, data in files.items():
        parts = rel.split("/")
        if rel.startswith("/") or any(part in ("", ".", "..") for part in parts):
            raise ValueError(f"not a workspace path: {rel!r}")
        if len(parts) > 1:
            os.makedirs(os.path.dirname(rel), exist_ok=True)
        with open(rel, "xb") as handle:
            handle.write(base64.b64decode(data))


def sweep(sandboxed):
    """Empty the workspace (the next verification's files are written there); in a sandbox with a PID
    namespace of its own (``sandboxed``, the host says so), kill every process but this one and its
    ancestors and empty /tmp and /dev/shm too. Returns whether the workspace is empty.

    Processes this one may not signal are not the runs': another user's (docker's init and the root wrapper
    of each command; a run's processes are this user's, with no new privileges)."""
    keep = _ancestors()
    for _ in range(20 if sandboxed else 0):
        others = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in keep]
        if not others:
            break
        for pid in others:
            try:
                os.kill(pid, signal.SIGKILL)
            except PermissionError:
                keep.add(pid)
            except OSError:
                pass
        for pid in others:  # reap the ones that were ours (re-parented orphans are reaped by the sandbox's init)
            try:
                os.waitpid(pid, os.WNOHANG)
            except OSError:
                pass
        time.sleep(0.005)
    for folder in ("/tmp", "/dev/shm", ".") if sandboxed else (".",):
        empty(folder)
    return not os.listdir(".")


def empty(folder):
    """Remove everything in ``folder`` that is on its own filesystem; never enter another one.

    What the host binds into the sandbox (read-only: a virtual environment that lives under /tmp is mounted at
    its own path, inside this sandbox's /tmp) is a mount point here: walking it failed on every one of its
    files (tens of thousands in a virtual environment) after every verification. Nothing a run writes can be
    on another filesystem (it cannot mount), so skipping them leaves nothing of a run behind. A folder a test
    made read-only is made writable first. An explicit stack: a tree nested deeper than Python's recursion
    limit is emptied too.
    """
    try:
        device = os.lstat(folder).st_dev
        pending = [(os.path.join(folder, name), False) for name in os.listdir(folder)]
    except OSError:
        return
    while pending:
        path, emptied = pending.pop()
        if emptied:  # its entries are gone (or are mount points): the folder itself
            try:
                os.rmdir(path)
            except OSError:
                pass
            continue
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if info.st_dev != device:
            continue
        if stat.S_ISDIR(info.st_mode):
            try:
                os.chmod(path, 0o700)
            except OSError:
                pass
            pending.append((path, True))
            try:
                pending.extend((os.path.join(path, name), False) for name in os.listdir(path))
            except OSError:
                pass
            continue
        try:
            os.unlink(path)
        except PermissionError:  # in a folder a test made read-only
            try:
                os.chmod(os.path.dirname(path), 0o700)
                os.unlink(path)
            except OSError:
                pass
        except OSError:
            pass


def serve(settings):
    """Preload, listen on ``settings["socket"]``, run one verification per connection, until killed."""
    preload()
    import gc

    # Every child's garbage collections skip what is here now: no time spent walking pytest's objects, and
    # no write to their pages (which a fork would then copy).
    gc.collect()
    gc.freeze()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(settings["socket"])
    os.chmod(settings["socket"], 0o700)
    listener.listen(4)
    # The host's first connection is a lifeline: when it closes (the host's pool is gone), this runner exits.
    lifeline, _ = listener.accept()
    idle = float(settings.get("idle") or 0) or None
    while True:
        ready, _, _ = select.select([listener, lifeline], [], [], idle)
        if not ready or lifeline in ready:  # idle for too long, or the host let go
            os.unlink(settings["socket"])
            return
        connection, _ = listener.accept()
        try:
            request = read_message(connection)
            if request is None:
                continue
            place(request.get("files") or {})
            pid, out_r, err_r = _fork(request, listener, connection)
            result = _relay(pid, out_r, err_r, float(request["timeout"]), int(request["max_output"]))
            _kill_session(pid)
            # Before answering: the host writes the next verification's files as soon as it has the answer. A
            # workspace that could not be emptied retires this runner (nothing of one run may reach the next).
            result["retire"] = not sweep(bool(settings.get("sweep")))
            write_message(connection, result)
        except (OSError, ValueError, KeyError) as exc:
            sweep(bool(settings.get("sweep")))
            try:
                write_message(connection, {"error": f"{type(exc).__name__}: {exc}", "retire": True})
            except OSError:
                pass
        finally:
            connection.close()


if __name__ == "__main__":
    _settings = json.loads(sys.stdin.read())
    sys.stdin.close()
    serve(_settings)
