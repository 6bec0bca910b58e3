"""The solution sandbox's front door: one listener, a fresh solution process per trusted connection.

Sent as source (after :mod:`._wire` and :mod:`._solution_server`) to
``python -I -B -c`` in the *solution* sandbox. It listens on the Unix socket
in the directory shared with the trusted sandbox and never imports or runs
agent code itself. Every connection from the trusted side is one of two
kinds, told apart by its first frame:

- ``{"op": "program", "argv": [...], "cwd": ..., "env": {...}}``: a test ran
  one of the solution's files as a program (``python cli.py``, ``python -m
  pkg``). A forked child starts it here, in the same working directory (the
  workspace and the scratch area have the same paths in both sandboxes),
  with the environment the test gave it, and relays its standard input,
  output, error and exit status over the connection as tagged binary frames
  (:data:`STREAM_FRAME`).
- anything else is the import boundary's first request: a forked child puts
  the workspace on ``sys.path`` (last) and serves that connection with a
  :class:`SolutionServer`, so every trusted Python process (pytest, a
  ``unittest`` run under ``make``, a helper script) imports the solution's
  modules into a process of its own, as it would import them bare.

Nothing here is trusted: agent code in a child can rewrite this process's
memory no more than any other process's (the children are forks; the
listener is the parent), but it can send the trusted side whatever bytes it
likes. The trusted side treats them as the output of a program and the
answers of a module: never as a verdict.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import threading

if __name__ != "__main__":  # imported on the host (tests); in the sandbox the sources precede this
    from factory.verifiers._solution_server import serve_connection
    from factory.verifiers._wire import Channel, WireError, cwd_from_wire

__all__ = ["STREAM_FRAME", "ReplayChannel", "read_stream_frame", "serve_forever", "write_stream_frame"]

#: The solution workspace, where this server started (a test's working directory is mapped onto it).
_PROGRAM_ROOT = os.getcwd()

#: A relay frame: one tag byte and a 4-byte big-endian length, then the data. Tags from the trusted side:
#: ``i`` standard input, ``I`` its end; from the solution side: ``o`` output, ``e`` error output, ``x`` the
#: exit status (4-byte signed: negative is a signal), ``E`` the program could not start (a message).
STREAM_FRAME = struct.Struct(">cI")
MAX_CHUNK = 1 << 20


def write_stream_frame(sock, tag, data=b""):
    """Send one relay frame."""
    sock.sendall(STREAM_FRAME.pack(tag, len(data)) + data)


def _read_exact(sock, size):
    chunks = []
    while size:
        chunk = sock.recv(min(size, MAX_CHUNK))
        if not chunk:
            raise EOFError("the other side closed the relay")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def read_stream_frame(sock):
    """One relay frame as ``(tag, data)``.

    Raises:
        EOFError: The connection closed.
        WireError: A frame over :data:`MAX_CHUNK` bytes.
    """
    tag, size = STREAM_FRAME.unpack(_read_exact(sock, STREAM_FRAME.size))
    if size > MAX_CHUNK:
        raise WireError(f"relay frame of {size} bytes is over the {MAX_CHUNK}-byte limit")
    return tag, _read_exact(sock, size)


class ReplayChannel(Channel):
    """A channel whose first frame was already read (to tell a program run from an import)."""

    def __init__(self, sock, first):
        super().__init__(sock)
        self._first = [first]

    def receive(self):
        if self._first:
            return self._first.pop()
        return super().receive()


def _run_program(sock, request, python):
    """Start the program ``request`` names and relay its streams until it exits."""
    argv = [str(a) for a in request.get("argv", [])][:4096]
    env = {str(k): str(v) for k, v in (request.get("env") or {}).items()}
    cwd = cwd_from_wire(str(request.get("cwd") or "@ws"), _PROGRAM_ROOT)
    lock = threading.Lock()

    def send(tag, data=b""):
        with lock:
            write_stream_frame(sock, tag, data)

    try:
        os.makedirs(cwd, exist_ok=True)  # a folder of the tests' that the solution sandbox lacks
        process = subprocess.Popen([python, *argv], cwd=cwd, env=env, stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as exc:
        send(b"E", f"cannot start the solution's program: {exc}".encode())
        return

    def feed():
        try:
            while True:
                tag, data = read_stream_frame(sock)
                if tag == b"I":
                    break
                if tag == b"i":
                    process.stdin.write(data)
                    process.stdin.flush()
        except (EOFError, OSError, WireError):
            pass
        try:
            process.stdin.close()
        except OSError:
            pass

    def pump(stream, tag):
        try:
            while True:
                data = os.read(stream.fileno(), 65536)
                if not data:
                    return
                send(tag, data)
        except OSError:
            return

    threading.Thread(target=feed, daemon=True).start()
    pumps = [threading.Thread(target=pump, args=(process.stdout, b"o")),
             threading.Thread(target=pump, args=(process.stderr, b"e"))]
    for thread in pumps:
        thread.start()
    for thread in pumps:
        thread.join()
    code = process.wait()
    send(b"x", struct.pack(">i", code))


def _child(connection, paths, python):
    """One connection, in a forked child: a program run, or an import boundary served from here."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the parent ignores it; subprocess must reap its own
    channel = Channel(connection)
    try:
        first = channel.receive_exact()  # (a program's stream frames may follow it on the raw socket)
    except (EOFError, OSError, WireError):
        return
    if type(first) is dict and first.get("op") == "program":
        _run_program(connection, first, python)
        return
    serve_connection(ReplayChannel(connection, first), paths)  # in this child only


def listen(path):
    """A Unix socket listening at ``path``, connectable by the trusted side's user."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    listener.bind(path)
    os.chmod(path, 0o666)  # the trusted side may run as another uid
    listener.listen(64)
    return listener


def serve_forever(settings, listener=None):
    """Listen on ``settings["socket"]`` and fork a child per connection, until this process is killed.

    ``listener``: that socket, already listening (the launch prelude binds it before this module's imports).
    """
    scratch = settings.get("scratch")
    if scratch:
        os.environ["TMPDIR"] = scratch  # the one folder both sandboxes see: the tests' temporary files
    os.umask(0o000)  # files the solution writes in the scratch area stay the trusted side's to use
    if listener is None:
        listener = listen(settings["socket"])
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    python = sys.executable
    while True:
        connection, _ = listener.accept()
        pid = os.fork()
        if pid == 0:
            listener.close()
            try:
                _child(connection, settings.get("paths", ["."]), python)
            except BaseException:  # noqa: BLE001 - a child never returns into the accept loop
                pass
            finally:
                os._exit(0)
        connection.close()


if __name__ == "__main__":
    import json

    sys.dont_write_bytecode = True
    _settings = json.loads(sys.stdin.read())
    sys.stdin.close()
    serve_forever(_settings)
