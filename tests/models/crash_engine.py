"""A registered engine that runs in a child process and can die there by a real signal (tests only).

Loaded through ``FACTORY_PLUGINS=tests.models.crash_engine``, in the fork's
process and in the engine's child. ``crashtest:NAME`` answers every prompt
with ``Final: 4``; with ``CRASHTEST_SIGNAL_AT=N`` in the environment, call
number ``N`` (the child's one-token preflight is call 1) kills the child with
``CRASHTEST_SIGNAL`` (default ``SIGILL``), as a native engine running an
instruction the CPU refuses would.
"""

from __future__ import annotations

import os
import resource
import signal

from factory.models import ChatResponse, Usage, register_model


class CrashingModel:
    def __init__(self, name: str):
        self.spec = f"crashtest:{name}"
        self.calls = 0

    async def chat(self, messages, tools=None, *, temperature=0.7, seed=None, max_tokens=1024):
        self.calls += 1
        if str(self.calls) == os.environ.get("CRASHTEST_SIGNAL_AT"):
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file left behind
            os.kill(os.getpid(), getattr(signal, os.environ.get("CRASHTEST_SIGNAL", "SIGILL")))
        return ChatResponse(text="Final: 4", usage=Usage(10, 3, 0.0), finish_reason="stop")

    async def aclose(self):
        return None


@register_model("crashtest", child_process=True)
def _create(name, options):
    return CrashingModel(name)
