"""The child process of :class:`~factory.models.ChildEngineModel`: one engine, served over a pipe.

Run as ``python -m factory.models._engine_host``. The first line on stdin
names the spec and its options; the host creates the model in process
(``ModelOptions.in_process``), generates one token (the preflight) and
answers one hello line: ``{"spec": ..., "info": {...}}`` or ``{"error":
{...}}``. Then every stdin line is a chat request ``{"id", "messages",
"tools", "temperature", "seed", "max_tokens"}`` answered, in any order, by
``{"id", "ok": ChatResponse.to_dict()}`` or ``{"id", "error": {"type",
"message", "retryable"}}``. The host exits when stdin closes.

File descriptor 1 is the protocol's alone: it is duplicated for replies and
then pointed at stderr before any engine is imported, so whatever native
code prints goes to stderr.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
from typing import Any, BinaryIO

__all__ = ["main"]


def _reply_channel() -> BinaryIO:
    channel = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return channel


def _error(exc: BaseException) -> dict[str, Any]:
    from factory.errors import ModelConfigError

    return {"type": type(exc).__name__, "message": str(exc) or type(exc).__name__,
            "retryable": bool(getattr(exc, "retryable", False)), "config": isinstance(exc, ModelConfigError)}


async def _serve(model: Any, channel: BinaryIO) -> None:
    from factory.models import ToolSpec

    loop = asyncio.get_running_loop()
    write_lock = threading.Lock()
    tasks: set[asyncio.Task[None]] = set()

    def send(message: dict[str, Any]) -> None:
        data = (json.dumps(message) + "\n").encode()
        with write_lock:
            channel.write(data)

    async def answer(request: dict[str, Any]) -> None:
        try:
            tools = [ToolSpec(**tool) for tool in request.get("tools") or ()] or None
            response = await model.chat(request["messages"], tools, temperature=request["temperature"],
                                        seed=request["seed"], max_tokens=request["max_tokens"])
            send({"id": request["id"], "ok": response.to_dict()})
        except Exception as exc:  # every failure goes back to the caller as its error
            send({"id": request["id"], "error": _error(exc)})

    while True:
        line = await loop.run_in_executor(None, sys.stdin.buffer.readline)
        if not line:
            break
        task = asyncio.create_task(answer(json.loads(line)))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)
    await model.aclose()


async def _start(header: dict[str, Any], channel: BinaryIO) -> None:
    from factory.models import ModelOptions, create_model

    try:
        options = ModelOptions(**{**header.get("options", {}), "in_process": True})
        model = create_model(header["spec"], options)
        # The preflight: a model that cannot generate here fails now, before the fork writes anything.
        await model.chat([{"role": "user", "content": "Hi"}], temperature=0.0, seed=0, max_tokens=1)
    except Exception as exc:
        channel.write((json.dumps({"error": _error(exc)}) + "\n").encode())
        return
    channel.write((json.dumps({"spec": model.spec, "info": {"pid": os.getpid()}}) + "\n").encode())
    await _serve(model, channel)


def _die_with_parent() -> None:
    """On Linux, have the kernel kill this process when the fork's process dies (even by ``kill -9``)."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass  # stdin closing still ends the host


def main() -> None:
    """Serve one engine on stdin/stdout until stdin closes."""
    _die_with_parent()
    channel = _reply_channel()
    header = json.loads(sys.stdin.buffer.readline() or b"{}")
    asyncio.run(_start(header, channel))


if __name__ == "__main__":
    main()
