"""One writer and many readers on one store file, across processes.

DuckDB locks its file whole: a read-write connection excludes every other
connection, a read-only one excludes writers. A store being forked must still
be readable, so the store file is shared in turns:

- A writer first takes the **writer lock**, an exclusive ``flock`` on the
  sidecar file ``<store>.lock`` holding its PID, and keeps it until it closes.
  That lock, not DuckDB's, is what keeps a second writer out, so the writer may
  close its DuckDB connection between operations without letting another
  writer in. The kernel drops it when the process dies (``kill -9`` included).
- A reader that finds DuckDB's lock taken **asks** the writer to let it in by
  appending a byte to the sidecar, then retries for a while.
- The writer watches the sidecar's size (an ``fstat`` every
  :data:`WATCH_INTERVAL_S`); when a reader asked, it waits for the operation in
  progress, if any, to end, closes its connection (every write committed: a
  reader sees whole batches or none) and opens it again at its next
  operation, waiting for the readers then inside to leave. It pauses so at
  most once every :data:`PAUSE_GAP_S` (longer when pauses cost more).
- While a writer waits for readers to leave it says so in the sidecar (its
  status byte, after the PID line); a read-only store left open (a server, a
  notebook) watches that byte and closes its connection between operations,
  opening it again, asking, at its next one. So no reader holds a writer off.

So nobody pays for sharing until someone reads: a writer that is not watched
holds its connection like any other, and a watched one reopens at most once per
:data:`PAUSE_GAP_S`, however many readers poll, and never once per write.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from factory.errors import OutputSpaceError, StoreError, StoreLockedError
from factory.outputs import disk_full

__all__ = [
    "PAUSE_GAP_MAX_S", "PAUSE_GAP_S", "PAUSE_SHARE", "WATCH_INTERVAL_S", "WriterLock", "ask_writer", "writer_waiting",
]

#: How often a writer looks whether a reader asked to get in.
WATCH_INTERVAL_S = 0.05
#: Least time between two of a writer's pauses for readers: each costs it a checkpoint, the readers' visit
#: and a reopen (0.1-1 s on a store of thousands of branches), so readers polling fast share a pause rather
#: than each costing one. The gap grows to PAUSE_SHARE times the last pause's cost, so pauses take at most
#: about 1/(1+PAUSE_SHARE) of the writer's time, up to PAUSE_GAP_MAX_S (half a reader's default wait).
PAUSE_GAP_S = 1.0
PAUSE_SHARE = 4.0
PAUSE_GAP_MAX_S = 5.0


def lock_path(db: Path) -> Path:
    """The sidecar file of store ``db``: the writer lock and the readers' requests."""
    return db.with_name(db.name + ".lock")


def _read_pid(fd: int) -> int | None:
    head = os.pread(fd, 32, 0).split(b"\n", 1)[0]
    return int(head) if head.isdigit() else None


def writer_waiting(db: Path) -> bool:
    """Whether the writer of ``db`` is waiting for readers to leave (False where there is no writer of ours)."""
    try:
        fd = os.open(lock_path(db), os.O_RDONLY)
    except OSError:
        return False
    try:
        head = os.pread(fd, 40, 0)
    finally:
        os.close(fd)
    line, _, rest = head.partition(b"\n")
    return line.isdigit() and rest[:1] == _WAITING


_WAITING, _HOLDING = b"w", b"-"


def ask_writer(db: Path) -> None:
    """Ask the writer of ``db``, if any, to let readers in (a no-op where there is none or no right to ask)."""
    with contextlib.suppress(OSError):  # no sidecar (no writer of ours), or a folder this reader cannot write
        fd = os.open(lock_path(db), os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, b"r")
        finally:
            os.close(fd)


class WriterLock:
    """The exclusive writer lock of one store, held from :meth:`acquire` to :meth:`release`.

    Attributes:
        path: The sidecar file.
    """

    def __init__(self, fd: int, path: Path, header: int):
        self._fd: int | None = fd
        self._header = header  # the PID line and the status byte; anything after them is a reader's request
        self.path = path

    @classmethod
    def acquire(cls, db: Path) -> WriterLock:
        """Take ``db``'s writer lock without waiting.

        Raises:
            StoreLockedError: Another process (or another open store in this one) holds it.
            StoreError: The sidecar cannot be created.
        """
        path = lock_path(db)
        while True:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
            except OSError as exc:
                raise StoreError(f"cannot create the writer lock {path}: {exc.strerror}") from exc
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pid = _read_pid(fd)
                os.close(fd)
                holder = f" (PID {pid})" if pid else ""
                raise StoreLockedError(
                    f"{db} is open for writing by another process{holder}; a store takes one writer at a time "
                    "— wait for it to finish, or use another --db (reading commands work meanwhile)"
                ) from None
            # A writer that just closed unlinks the sidecar after we opened it: lock the file at the path.
            try:
                current = os.path.samestat(os.fstat(fd), os.stat(path))
            except FileNotFoundError:
                current = False
            if current:
                break
            os.close(fd)
        header = f"{os.getpid()}\n".encode() + _HOLDING
        try:
            os.ftruncate(fd, 0)  # a dead writer's PID and readers' requests
            os.pwrite(fd, header, 0)
        except OSError as exc:  # a full disk: the sidecar goes, as at release, and the store is not opened
            with contextlib.suppress(OSError):
                os.unlink(path)
            os.close(fd)
            why = disk_full(exc)
            if why is not None:
                raise OutputSpaceError("lock the store", str(path), why) from exc
            raise StoreError(f"cannot write the writer lock {path}: {exc.strerror or exc}") from exc
        return cls(fd, path, len(header))

    def waiting(self, flag: bool) -> None:
        """Say (or stop saying) that this writer waits for the readers inside to leave."""
        if self._fd is not None:
            os.pwrite(self._fd, _WAITING if flag else _HOLDING, self._header - 1)

    def requested(self) -> bool:
        """Whether a reader asked to get in since the last :meth:`clear`."""
        return self._fd is not None and os.fstat(self._fd).st_size > self._header

    def clear(self) -> None:
        """Forget the requests seen (a reader still waiting asks again)."""
        if self._fd is not None:
            os.ftruncate(self._fd, self._header)

    def release(self) -> None:
        """Remove the sidecar and drop the lock. Safe to call twice."""
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(self.path)  # while still locked: a waiting writer sees it gone and makes a new one
        os.close(self._fd)
        self._fd = None
