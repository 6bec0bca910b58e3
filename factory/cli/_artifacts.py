"""Recording a command's output files in the store (``artifacts``), so ``factory view`` shows them beside the run.

A command records its outputs once they are in place. Recording never costs
the user an output: where the store cannot be written (a fork is writing to
it, readers hold it past a short wait, its folder is read-only), the command
has already written its files and printed its results, and says on one line
(on stderr, so ``--json`` output stays one document) that it did not record
them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from factory.store import Store

__all__ = ["RECORD_WAIT_S", "record_outputs", "record_with"]

#: Seconds a command waits for readers of the store to let it in before giving up recording.
RECORD_WAIT_S = 2.0


def _not_recorded(what: str, why: str) -> None:
    click.secho(f"note: {what} written but not recorded in the store for `factory view`: {why}", fg="yellow",
                err=True)


def record_with(store: Store, what: str, rows: Callable[[], Sequence[dict[str, Any]]]) -> bool:
    """Record ``rows()`` in a store the command already holds open read-write; say so where it cannot.

    Returns:
        Whether they were recorded.
    """
    from factory.errors import StoreError

    try:
        store.record_artifacts(list(rows()))
    except (StoreError, OSError) as exc:
        _not_recorded(what, str(exc).splitlines()[0])
        return False
    return True


def record_outputs(db: Path, what: str, rows: Callable[[Store], Sequence[dict[str, Any]]], *,
                   missing_ok: bool = False) -> bool:
    """Open the store read-write briefly (its writer lock first: one writer at a time) and record ``rows(store)``.

    Args:
        db: The store.
        what: The outputs, in words, for the line said where they cannot be recorded.
        rows: Builds the rows from the open store (it may look runs up); an empty list records nothing.
        missing_ok: No store at ``db`` is no reason to say anything (``factory train`` on a file made elsewhere).

    Returns:
        Whether anything was recorded.
    """
    from factory.errors import StoreError, StoreNotFoundError
    from factory.store import Store

    try:
        with Store.open(db, create=False, wait_s=RECORD_WAIT_S) as store:
            built = list(rows(store))
            if built:
                store.record_artifacts(built)
            return bool(built)
    except StoreNotFoundError as exc:
        if not missing_ok:
            _not_recorded(what, str(exc).splitlines()[0])
    except (StoreError, OSError) as exc:  # a fork holds the writer lock, readers stayed past the wait, ...
        _not_recorded(what, str(exc).splitlines()[0])
    return False
