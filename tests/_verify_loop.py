"""One event loop for a test module's verifications, so one warm trusted runner serves test after test.

Warm trusted runners are pooled per event loop (``factory.verifiers._warm``): with ``asyncio.run`` per test each
verification starts a runner (a sandbox importing pytest: about a second on two cores) and closes it again. A
module's one-off verifications run on this loop instead, as a fork's do on its own; ``tests/verifiers/conftest.py``
closes the loop and its runners when the module is done, so no runner outlives the module that started it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from factory.verifiers import TestsVerifier

T = TypeVar("T")

_loop: asyncio.AbstractEventLoop | None = None


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coroutine)``, on the module's shared loop (made on first use)."""
    global _loop
    if _loop is None:
        _loop = asyncio.new_event_loop()
    return _loop.run_until_complete(coroutine)


def close() -> None:
    """Close the shared loop as ``asyncio.run`` closes its own: the warm runners, what is left of its tasks, its
    async generators and default executor. A no-op when no verification ran."""
    global _loop
    loop, _loop = _loop, None
    if loop is None:
        return
    try:
        loop.run_until_complete(TestsVerifier(reference_sandbox=None).aclose())  # the loop's idle warm runners
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.run_until_complete(loop.shutdown_default_executor())
    finally:
        loop.close()
