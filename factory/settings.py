"""Where `factory` keeps things, resolved from the environment at call time.

Nothing here runs at import: every path is computed when asked for, so a test
(or a user) can point ``FACTORY_HOME`` or ``FACTORY_DB`` elsewhere at any time.

- ``FACTORY_HOME``: root for caches (joined model weights, embedder caches).
  Default: ``$XDG_CACHE_HOME/factory`` or ``~/.cache/factory``.
- ``FACTORY_DB``: the DuckDB file commands use when ``--db`` is not given.
  Default: ``./factory.duckdb`` in the working directory.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["DEFAULT_DB_NAME", "default_db_path", "factory_home"]

DEFAULT_DB_NAME = "factory.duckdb"


def factory_home() -> Path:
    """Return the root directory for caches (not created here)."""
    if env := os.environ.get("FACTORY_HOME"):
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache).expanduser() / "factory"


def default_db_path() -> Path:
    """Return the store path used when no ``--db`` is given."""
    if env := os.environ.get("FACTORY_DB"):
        return Path(env).expanduser()
    return Path.cwd() / DEFAULT_DB_NAME
