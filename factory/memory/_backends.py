"""Memory backends by name (``--memory-backend``): a registry beside the :class:`MemoryBackend` protocol.

- ``duckdb`` (default): the run store's ``memory`` table, exact cosine search.
- ``lance[:DIR]``: an embedded LanceDB table (the ``memory-ann`` extra) with an
  ANN index past 100,000 memories; ``DIR`` defaults to ``<store>.memory.lance``
  beside the DuckDB file, so the memories stay with the runs they came from.

A spec is ``NAME`` or ``NAME:ARGUMENT``; the factory receives the open store
and the argument (or None).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from factory.errors import ConfigError
from factory.memory._store import DuckDBMemoryBackend, MemoryBackend
from factory.outputs import refuse_protected
from factory.registry import Registry
from factory.store import Store

__all__ = ["MEMORY_BACKENDS", "create_memory_backend", "memory_backend_names", "register_memory_backend"]

#: A backend factory: (the open run store, the spec's argument or None) -> backend.
BackendFactory = Callable[[Store, "str | None"], MemoryBackend]


def _duckdb(store: Store, argument: str | None) -> MemoryBackend:
    if argument:
        raise ConfigError("the duckdb memory backend lives in the run store and takes no argument (use --db)")
    return DuckDBMemoryBackend(store)


def _lance(store: Store, argument: str | None) -> MemoryBackend:
    from factory.memory._lance import LanceMemoryBackend

    path = Path(argument).expanduser() if argument else store.path.with_suffix(".memory.lance")
    refuse_protected(path, {"the store (--db)": store.path})  # the index is written into this folder
    return LanceMemoryBackend(path)


#: Memory backends by name (``--memory-backend``); :func:`register_memory_backend` adds one.
MEMORY_BACKENDS: Registry[BackendFactory] = Registry("memory backend")
MEMORY_BACKENDS.register("duckdb", _duckdb)
MEMORY_BACKENDS.register("lance", _lance)


def register_memory_backend(name: str, factory: BackendFactory) -> None:
    """Register a backend factory under ``name`` (e.g. a vector database's client)."""
    MEMORY_BACKENDS.register(name, factory)


def memory_backend_names() -> list[str]:
    """Registered backend names."""
    return MEMORY_BACKENDS.names()


def create_memory_backend(spec: str | None, store: Store) -> MemoryBackend:
    """The backend named by ``spec`` (``duckdb`` when None).

    Raises:
        ConfigError: Unknown name, bad argument, or the backend's extra is not installed.
    """
    name, _, argument = (spec or "duckdb").partition(":")
    return MEMORY_BACKENDS.get(name)(store, argument or None)
