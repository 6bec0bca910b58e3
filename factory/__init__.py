"""factory: an RLAIF rollout and data-factory toolkit.

Fork N agent branches per task in sandboxes, verify and judge them, rank them
with power checks, keep winners in memory, and export TRL-ready datasets.

The top level stays import-light (no DuckDB, no torch) so that the CLI starts
fast; :func:`open` imports the store when called.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from factory._version import __version__
from factory.errors import FactoryError

if TYPE_CHECKING:
    from factory.store import Store

__all__ = ["FactoryError", "__version__", "open"]


def open(path: str | Path | None = None, *, read_only: bool = False) -> Store:  # noqa: A001
    """Open a `factory` DuckDB store.

    Args:
        path: The database file; default ``$FACTORY_DB`` or ``./factory.duckdb``.
        read_only: Open without the write lock (the file must exist).

    Returns:
        A :class:`factory.store.Store`; e.g. ``factory.open(db).branches(run_id)``
        is a Polars frame.
    """
    from factory.store import Store

    return Store.open(path, read_only=read_only)
