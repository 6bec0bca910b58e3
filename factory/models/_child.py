"""Engines that run native code, in a child process: a crash there never takes the fork down.

llama.cpp, torch and vLLM execute native code that can die in ways Python
cannot catch: ``SIGILL`` when a build uses instructions the CPU or the
hypervisor refuses (a ``-march=native`` llama.cpp on a CPU that advertises
AMX), ``SIGSEGV``, the kernel's OOM killer. In the fork's own process that
would end the run with no word of why and leave its store behind. So
:func:`~factory.models.create_model` starts such an engine in a child
(:mod:`._engine_host`) and :class:`ChildEngineModel` talks to it over a pipe,
one JSON line per request and per reply. Concurrent calls are in flight
together (vLLM batches them; llama.cpp serializes them in the child).

The child loads the model and generates one token before it says it is
ready (the preflight), so a model that cannot run here fails at
:func:`create_model` — before a fork writes anything. If the child dies
later, every call in flight and every later call raises
:class:`~factory.errors.EngineCrashedError` naming the signal and what to do;
the runner then stops the run (those branches are infrastructure failures,
the rest stay pending for ``--resume``).

The pipe is the only channel: the child's own stdout is moved to its stderr
before anything is loaded, so native code that prints cannot corrupt the
protocol; the last lines of its stderr are kept for error messages. The
child exits when its stdin closes, so it never outlives the fork (``kill -9``
of the fork included).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from factory.errors import EngineCrashedError, ModelConfigError, ModelError
from factory.models._base import ChatResponse, Message, ModelOptions, ToolSpec

__all__ = ["ChildEngineModel", "crash_message"]

#: Seconds a child may take to load its model and generate the preflight token.
LOAD_TIMEOUT_S = 900.0
_STDERR_LINES = 40

_SIGNAL_HINTS = {
    "SIGILL": ("illegal instruction: the engine's native build uses CPU instructions this machine refuses "
               "(a -march=native build on a CPU that advertises AMX or AVX-512 the hypervisor does not allow). "
               "Rebuild it portably: `make llama-wheel` then `make setup` in the repository (LLAMA_BUILD=portable, "
               "the default), or CMAKE_ARGS=\"-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON "
               "-DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF\" pip install "
               "--force-reinstall --no-cache-dir llama-cpp-python==0.3.36"),
    "SIGSEGV": ("segmentation fault in the engine's native code: try FACTORY_THREADS=1, a smaller --context, or "
                "another build of the engine"),
    "SIGBUS": "bus error in the engine's native code (often a model file changed or truncated while mapped)",
    "SIGABRT": "the engine aborted (a failed assertion in its native code); its last output is below",
    "SIGKILL": ("killed, most often by the kernel's OOM killer: the model needs more memory than is free; "
                "lower --concurrency or --context, or use a smaller model"),
    "SIGFPE": "arithmetic fault in the engine's native code",
}


def crash_message(spec: str, returncode: int, stderr_tail: str = "", *, phase: str = "during the run") -> str:
    """One line saying how an engine's child process ended and what to do.

    Args:
        spec: The model spec (``local``, ``hf:DIR``).
        returncode: The child's return code (negative: killed by that signal).
        stderr_tail: The child's last output, appended when it explains an exit.
        phase: When it happened (``while loading``, ``during the run``).
    """
    name = _signal_name(returncode)
    if name is not None:
        hint = _SIGNAL_HINTS.get(name, "killed by a signal")
        text = f"{spec}: the engine's process died with {name} {phase}: {hint}"
    else:
        text = f"{spec}: the engine's process exited with status {returncode} {phase}"
    last = [line for line in stderr_tail.splitlines() if line.strip()][-3:]
    if last and (returncode >= 0 or -returncode not in (signal.SIGILL, signal.SIGKILL)):
        text += " — last output: " + " | ".join(line.strip()[:200] for line in last)
    return text


def _signal_name(returncode: int) -> str | None:
    if returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


class ChildEngineModel:
    """A chat model whose engine runs in a child process (see the module docstring).

    Args:
        spec: The model spec, e.g. ``local`` or ``hf:./out/model``.
        options: Provider settings; sent to the child, which creates the model in process.
        load_timeout_s: Longest wait for the child to load and generate its preflight token.

    Attributes:
        spec: The spec the engine reports (``local`` for the embedded default).
        pid: The child's process id.

    Raises:
        ModelConfigError: The model cannot be set up (the child says why).
        EngineCrashedError: The child died while loading or generating its preflight token.
    """

    def __init__(self, spec: str, options: ModelOptions, *, load_timeout_s: float = LOAD_TIMEOUT_S):
        self.spec = spec
        self._requested = spec
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future[Any]]] = {}
        self._lock = threading.Lock()  # guards _pending, _dead and writes to the child's stdin
        self._dead: EngineCrashedError | None = None
        self._closing = False
        self._stderr: collections.deque[str] = collections.deque(maxlen=_STDERR_LINES)
        self._ready = threading.Event()
        self._hello: dict[str, Any] | None = None
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "factory.models._engine_host"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, env=env, close_fds=True)
        self.pid = self._proc.pid
        threading.Thread(target=self._read_stderr, name=f"engine-{self.pid}-stderr", daemon=True).start()
        threading.Thread(target=self._read_replies, name=f"engine-{self.pid}-replies", daemon=True).start()
        settings = {k: v for k, v in asdict(options).items() if k != "in_process"}
        settings["extra"] = dict(options.extra)
        try:
            self._send({"spec": spec, "options": settings})
        except EngineCrashedError:
            pass  # the reader thread reports how it died
        if not self._ready.wait(load_timeout_s):
            self._kill()
            raise ModelConfigError(f"{spec}: the engine did not load within {load_timeout_s:g} s")
        hello = self._hello or {}
        if "error" in hello:
            self._kill()
            error = hello["error"]
            kind = ModelConfigError if error.get("config", True) else ModelError
            raise kind(error.get("message") or f"{spec}: the engine failed to start")
        if self._dead is not None:
            raise EngineCrashedError(
                crash_message(spec, self._dead.returncode or 0, self._stderr_text(), phase="while loading the model "
                              "(before the run started: nothing was written)"),
                signal=self._dead.signal, returncode=self._dead.returncode)
        self.spec = hello.get("spec", spec)
        self.info: dict[str, Any] = hello.get("info", {})

    # ----------------------------------------------------------- plumbing

    def _stderr_text(self) -> str:
        return "".join(self._stderr)

    def _read_stderr(self) -> None:
        assert self._proc.stderr is not None
        for raw in self._proc.stderr:
            line = raw.decode("utf-8", errors="replace")
            self._stderr.append(line)
            if os.environ.get("FACTORY_ENGINE_LOG"):
                sys.stderr.write(line)

    def _read_replies(self) -> None:
        assert self._proc.stdout is not None
        for raw in self._proc.stdout:
            try:
                reply = json.loads(raw)
            except json.JSONDecodeError:
                continue  # never produced by the host; ignored rather than trusted
            if "id" not in reply:
                self._hello = reply
                self._ready.set()
                continue
            with self._lock:
                waiter = self._pending.pop(reply["id"], None)
            if waiter is not None:
                loop, future = waiter
                loop.call_soon_threadsafe(_settle, future, reply)
        returncode = self._proc.wait()
        crash = None
        if not self._closing:
            crash = EngineCrashedError(crash_message(self.spec, returncode, self._stderr_text()),
                                       signal=_signal_name(returncode), returncode=returncode)
        with self._lock:
            self._dead = crash or EngineCrashedError(f"{self.spec}: the engine was closed", returncode=returncode)
            waiters, self._pending = list(self._pending.values()), {}
        for loop, future in waiters:
            loop.call_soon_threadsafe(_fail, future, self._dead)
        self._ready.set()

    def _send(self, message: dict[str, Any]) -> None:
        data = (json.dumps(message) + "\n").encode()
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(data)
            self._proc.stdin.flush()
        except (BrokenPipeError, ValueError, OSError):
            raise self._dead or EngineCrashedError(f"{self.spec}: the engine's process is gone") from None

    def _kill(self) -> None:
        self._closing = True
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()

    # ----------------------------------------------------------- ChatModel

    async def preflight(self) -> None:
        """The child generated a token before it said it was ready; here only a death since then is reported."""
        if self._dead is not None:
            raise self._dead

    async def chat(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec] | None = None,
        *,
        temperature: float = 0.7,
        seed: int | None = None,
        max_tokens: int = 1024,
    ) -> ChatResponse:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        request = {
            "id": next(self._ids), "messages": list(messages),
            "tools": [asdict(tool) for tool in tools] if tools else None,
            "temperature": temperature, "seed": seed, "max_tokens": max_tokens,
        }
        with self._lock:
            if self._dead is not None:
                raise self._dead
            self._pending[request["id"]] = (loop, future)
            try:
                self._send(request)
            except EngineCrashedError:
                self._pending.pop(request["id"], None)
                raise
        try:
            reply = await future
        except asyncio.CancelledError:
            with self._lock:
                self._pending.pop(request["id"], None)
            raise
        return reply

    async def aclose(self) -> None:
        """Ask the child to exit (closing its stdin), and kill it if it does not within 10 s."""
        self._closing = True
        try:
            if self._proc.stdin is not None:
                self._proc.stdin.close()
        except OSError:
            pass
        try:
            await asyncio.to_thread(self._proc.wait, 10)
        except subprocess.TimeoutExpired:
            self._kill()


def _settle(future: asyncio.Future[Any], reply: dict[str, Any]) -> None:
    if future.done():
        return
    if "ok" in reply:
        future.set_result(ChatResponse.from_dict(reply["ok"]))
        return
    error = reply.get("error") or {}
    future.set_exception(_rebuilt_error(error))


def _fail(future: asyncio.Future[Any], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)


def _rebuilt_error(error: dict[str, Any]) -> ModelError:
    """The child's model error, as the same class of the ``factory.errors`` tree where there is one."""
    import factory.errors as errors

    cls = getattr(errors, str(error.get("type", "")), None)
    message = str(error.get("message") or "the engine failed")
    if isinstance(cls, type) and issubclass(cls, ModelError) and cls.__init__ is ModelError.__init__:
        return cls(message)
    failure = ModelError(message)
    failure.retryable = bool(error.get("retryable"))
    return failure
