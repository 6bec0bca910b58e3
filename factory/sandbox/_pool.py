"""A bounded pool of live sandboxes, acquired and released by id."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from factory.errors import SandboxError
from factory.sandbox._base import Sandbox

__all__ = ["SandboxPool"]


class SandboxPool:
    """At most ``max_concurrent`` started sandboxes at a time.

    ``acquire(id)`` waits for a free slot, starts a sandbox from ``factory``
    and keeps it under ``id``; ``release(id)`` closes it and frees the slot;
    ``aclose()`` disposes of every sandbox still held.

    Args:
        factory: Builds a new, not yet started sandbox.
        max_concurrent: Upper bound on live sandboxes.
    """

    def __init__(self, factory: Callable[[], Sandbox], max_concurrent: int):
        if max_concurrent < 1:
            raise ValueError("max_concurrent must be at least 1")
        self._factory = factory
        self._slots = asyncio.Semaphore(max_concurrent)
        self._live: dict[str, Sandbox] = {}
        self.max_concurrent = max_concurrent

    @property
    def live(self) -> int:
        """Number of sandboxes currently held."""
        return len(self._live)

    async def acquire(self, sandbox_id: str) -> Sandbox:
        """Start a sandbox for ``sandbox_id`` once a slot frees up.

        Raises:
            SandboxError: If the id is already held, or the sandbox fails to start.
        """
        if sandbox_id in self._live:
            raise SandboxError(f"sandbox {sandbox_id} is already acquired")
        await self._slots.acquire()
        sandbox = self._factory()
        try:
            await sandbox.start()
        except BaseException:
            self._slots.release()
            await sandbox.close()
            raise
        self._live[sandbox_id] = sandbox
        return sandbox

    async def release(self, sandbox_id: str) -> None:
        """Close the sandbox held under ``sandbox_id`` and free its slot (idempotent)."""
        sandbox = self._live.pop(sandbox_id, None)
        if sandbox is None:
            return
        try:
            await sandbox.close()
        finally:
            self._slots.release()

    async def aclose(self) -> None:
        """Close every sandbox still held."""
        await asyncio.gather(*(self.release(sandbox_id) for sandbox_id in list(self._live)), return_exceptions=True)

    async def __aenter__(self) -> SandboxPool:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
