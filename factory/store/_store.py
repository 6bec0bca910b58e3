"""The DuckDB store: one file holds everything a run produces.

Writes are batched through Arrow (never row by row) and idempotent: every
table with a natural key is written with ``INSERT OR REPLACE``, and a branch's
events are replaced as a set in the same transaction as its branch row, so
writing a (run, task, branch) again replaces it and never duplicates it.

One writer at a time: a second one gets :class:`~factory.errors.StoreLockedError`
naming the holder, not a corrupt file. Readers get in while a writer works (a
fork being watched): the writer takes a writer lock of its own beside the file
and lets go of DuckDB's between operations when a reader asks, a reader
retries for a while, and a reader left open steps aside while the writer
waits to go on (see :mod:`factory.store._sharing`).

A read-only store is sealed: besides DuckDB's ``access_mode=read_only``, its
connection has external access off (no file but the store is read or written:
no ``COPY ... TO``, ``EXPORT DATABASE``, ``ATTACH``, ``read_csv``), no
extension installed or loaded on demand, no Python object scanned, and its
configuration locked so no ``SET`` or ``PRAGMA`` turns any of that back on.

The store owns the SQL: every read and write another package needs is a named
method here (its statement in :mod:`factory.store._queries`), returning Polars
frames or plain values. :meth:`Store.query` is the user's SQL door (``factory
query``), not something the library calls.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

import duckdb
import polars as pl
import pyarrow as pa

from factory.errors import OutputSpaceError, QueryError, StoreError, StoreLockedError, StoreNotFoundError
from factory.outputs import disk_full
from factory.provenance import content_hash
from factory.settings import default_db_path
from factory.store import _queries as queries
from factory.store._migrations import MIGRATIONS, Migration, applied_migrations, migrate
from factory.store._sharing import (
    PAUSE_GAP_MAX_S,
    PAUSE_GAP_S,
    PAUSE_SHARE,
    WATCH_INTERVAL_S,
    WriterLock,
    ask_writer,
    writer_waiting,
)

__all__ = ["Rows", "Store", "utc_now"]

#: Seconds :meth:`Store.open` waits for DuckDB's lock: for a writer to let a reader in, or for readers to leave.
OPEN_WAIT_S = 10.0
#: Seconds a writer that let readers in waits for them to leave before its next operation (a slow
#: query must not stop a run).
REOPEN_WAIT_S = 120.0

#: Rows accepted by the write methods: mappings, or a ready Polars/Arrow table
#: whose JSON columns already hold JSON text.
Rows = Sequence[Mapping[str, Any]] | pl.DataFrame | pa.Table

T = TypeVar("T")
_BRANCH_KEY = ("run_id", "task_id", "branch_index")
# One encoder for every JSON cell: json.dumps with options builds a new one per call.
_encode_json = json.JSONEncoder(ensure_ascii=False, default=str).encode
_JUDGMENT_KEY = ("run_id", "task_id", "judge", "kind", "branch_a", "branch_b", "sample_index", "swapped")


def utc_now() -> datetime:
    """Current UTC time as the naive datetime the store's TIMESTAMP columns hold."""
    return datetime.now(timezone.utc).replace(tzinfo=None)


def _locked(method: Callable[..., T]) -> Callable[..., T]:
    """Serialize calls on one store (a DuckDB connection is not safe to share between threads), connected."""

    @functools.wraps(method)
    def wrapper(self: Store, *args: Any, **kwargs: Any) -> T:
        with self._lock:
            self._connect_again()
            try:
                return method(self, *args, **kwargs)
            except duckdb.Error as exc:  # a write outside a transaction block (an UPDATE) on a full disk
                why = disk_full(exc)
                if why is None:
                    raise
                raise OutputSpaceError("commit to the store", str(self.path), why) from exc

    return wrapper


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


#: Settings of a read-only connection: nothing outside the store file is reachable, and nothing can change that.
_SEALED_SETTINGS: dict[str, bool] = {
    "enable_external_access": False,  # no other file or database: COPY TO, EXPORT, ATTACH, read_csv, INSTALL
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "allow_community_extensions": False,
    "python_enable_replacements": False,  # a query cannot scan the caller's Python variables
    "lock_configuration": True,  # no SET / PRAGMA / RESET undoes the above
}
#: The statements :meth:`Store.query` runs (DuckDB statement types): SELECT covers WITH, FROM-first,
#: VALUES, DESCRIBE, SHOW and SUMMARIZE.
_QUERY_STATEMENTS = ("SELECT",)


def _connect(path: Path, read_only: bool, wait_s: float, writer: WriterLock | None = None, *,
             memory_limit: str | None = None) -> duckdb.DuckDBPyConnection:
    """Connect, retrying for up to ``wait_s`` while another process holds DuckDB's lock.

    A reader asks the writer to let it in on each refusal; a writer says it
    waits (readers left open step aside) until the readers inside leave.
    ``memory_limit``: DuckDB's memory limit (a reader's settings are locked once connected; a writer that let
    readers in connects again with the cap it had).
    """
    try:
        return _connect_waiting(path, read_only, wait_s, writer, memory_limit)
    finally:
        if writer is not None:
            writer.waiting(False)


def _connect_waiting(path: Path, read_only: bool, wait_s: float, writer: WriterLock | None,
                     memory_limit: str | None = None) -> duckdb.DuckDBPyConnection:
    deadline = time.monotonic() + wait_s
    delay = 0.005
    config: dict[str, Any] = dict(_SEALED_SETTINGS) if read_only else {}
    if memory_limit is not None:
        config["memory_limit"] = memory_limit
    while True:
        try:
            return duckdb.connect(str(path), read_only=read_only, config=config)
        except duckdb.IOException as exc:
            text = str(exc)
            if "lock" not in text.lower():
                raise StoreError(f"cannot open {path}: {_first_line(exc)}") from exc
            if time.monotonic() + delay > deadline:
                pid = re.search(r"PID (\d+)", text)
                holder = f" (PID {pid.group(1)})" if pid else ""
                if read_only:
                    raise StoreLockedError(
                        f"{path} is open for writing by another process{holder}, which did not let readers in "
                        f"within {wait_s:g} s; DuckDB allows one writer at a time — wait for it to finish, or "
                        "use another --db"
                    ) from exc
                raise StoreLockedError(
                    f"{path} is held by another process{holder} (a reader, or a writer that is not a factory "
                    f"store) for over {wait_s:g} s; DuckDB allows one writer at a time — wait for it to "
                    "finish, or use another --db"
                ) from exc
            if read_only:
                ask_writer(path)
            elif writer is not None:
                writer.waiting(True)
            time.sleep(delay)
            delay = min(delay * 2, 0.1)
        except duckdb.ConnectionException as exc:
            raise StoreLockedError(
                f"{path} is already open in this process in another mode: {_first_line(exc)}"
            ) from exc
        except duckdb.Error as exc:
            raise StoreError(f"cannot open {path}: {_first_line(exc)}") from exc


def _watch_for_readers(ref: weakref.ref[Store], stop: threading.Event, writer: WriterLock) -> None:
    """A writer's watcher thread: let readers in when they ask (at most once a gap), until the store closes."""
    last = float("-inf")
    while not stop.wait(WATCH_INTERVAL_S):
        store = ref()
        if store is None:  # dropped unclosed
            return
        gap = min(max(PAUSE_GAP_S, PAUSE_SHARE * store._pause_cost_s), PAUSE_GAP_MAX_S)
        if time.monotonic() - last >= gap and writer.requested():
            store._let_go()
            last = time.monotonic()
        del store


def _watch_for_writer(ref: weakref.ref[Store], stop: threading.Event, path: Path) -> None:
    """A read-only store's watcher thread: step aside when a writer waits for readers to leave."""
    while not stop.wait(WATCH_INTERVAL_S):
        store = ref()
        if store is None:
            return
        if writer_waiting(path):
            store._let_go()
        del store


class Store:
    """A `factory` DuckDB file: idempotent batch writes, Polars reads.

    Open with :meth:`Store.open` (or ``factory.open``); use as a context
    manager or call :meth:`close`.

    Attributes:
        path: The database file.
        read_only: Whether the connection is read-only.
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, path: Path, read_only: bool,
                 writer: WriterLock | None = None):
        self._con: duckdb.DuckDBPyConnection | None = con  # None while readers are let in
        self._lock = threading.RLock()
        self._depth = 0  # open transaction blocks (see _Transaction)
        self._closed = False
        self._pause_cost_s = 0.0  # a writer's last pause for readers: closing, and opening again
        self._memory_limit: str | None = None  # DuckDB's memory limit while memory_capped (None: DuckDB's default)
        self._memory_writes = 0  # write_memories/clear_memory calls so far (see memory_state)
        self._memory_state: tuple[int, tuple[int, datetime | None]] | None = None  # (writes, state) when read
        self.path = path
        self.read_only = read_only
        self._columns = self._load_columns()
        self._writer = writer
        self._stop_watching = threading.Event()
        if writer is not None:
            threading.Thread(target=_watch_for_readers, args=(weakref.ref(self), self._stop_watching, writer),
                             name=f"factory-store-readers:{path.name}", daemon=True).start()
            weakref.finalize(self, writer.release)  # dropped unclosed, or at exit: no sidecar left behind
        elif read_only:
            threading.Thread(target=_watch_for_writer, args=(weakref.ref(self), self._stop_watching, path),
                             name=f"factory-store-writer:{path.name}", daemon=True).start()

    @classmethod
    def open(
        cls,
        path: str | Path | None = None,
        *,
        read_only: bool = False,
        create: bool = True,
        migrations: tuple[Migration, ...] = MIGRATIONS,
        wait_s: float = OPEN_WAIT_S,
    ) -> Store:
        """Open (and, read-write, create and migrate) a store.

        Args:
            path: The DuckDB file; default ``$FACTORY_DB`` or ``./factory.duckdb``.
            read_only: Open without taking the write lock, sealed (see the
                module docstring); the file must exist.
            create: Read-write only: create the file when there is none. A
                command that updates an existing store passes False, so a
                mistyped path is an error rather than a new empty store.
            migrations: The schema to migrate to (tests pass a prefix to build
                a database as an older version wrote it).
            wait_s: How long to wait for DuckDB's lock: read-only, for a writer
                to let readers in (it does between operations when asked);
                read-write, for readers inside to leave.

        Raises:
            StoreNotFoundError: There is no file, and read-only or not ``create``.
            StoreError: Read-write, and its folder cannot be written in (or does not exist).
            StoreLockedError: Read-write, another store is writing to the file (at
                once); either way, DuckDB's lock stayed taken for ``wait_s``.
            MigrationError: The schema cannot be brought up to date.
        """
        db = Path(path) if path is not None else default_db_path()
        if (read_only or not create) and not db.exists():
            raise StoreNotFoundError(f"no database at {db} (run `factory fork` first, or pass --db)")
        if not read_only and not db.parent.exists():
            raise StoreError(f"cannot create {db}: directory {db.parent} does not exist")
        if not read_only and not os.access(db.parent, os.W_OK | os.X_OK):
            # DuckDB writes its write-ahead log beside the file: the first write would fail at COMMIT.
            raise StoreError(f"cannot write to {db}: its folder {db.parent} is not writable, and DuckDB keeps a "
                             "write-ahead log beside the store (copy the store to a writable folder)")
        writer = None if read_only else WriterLock.acquire(db)
        new = not read_only and not db.exists()
        try:
            con = _connect(db, read_only, wait_s, writer)
            try:
                if not read_only:
                    migrate(con, migrations)
            except BaseException:
                con.close()
                raise
        except BaseException as exc:
            if new:  # a store that could not be made whole (a full disk, say) is not left half-made
                for leftover in (db, db.with_name(db.name + ".wal")):
                    leftover.unlink(missing_ok=True)
            if writer is not None:
                writer.release()
            why = disk_full(exc)
            if why is not None:
                raise OutputSpaceError("create the store" if new else "migrate the store", str(db), why) from exc
            raise
        return cls(con, db, read_only, writer)

    def close(self) -> None:
        """Close the connection (releasing the write lock). Safe to call twice; thread-safe like every method."""
        with self._lock:
            self._closed = True
            self._stop_watching.set()
            if self._con is not None:
                self._con.close()
                self._con = None
            if self._writer is not None:
                self._writer.release()

    def _let_go(self) -> None:
        """Close the connection between operations (every write committed) so others waiting can open the file."""
        with self._lock:
            if self._closed:
                return
            if self._writer is not None:
                self._writer.clear()
            if self._con is not None and self._depth == 0:
                start = time.monotonic()
                self._con.close()
                self._con = None
                self._pause_cost_s = time.monotonic() - start

    def _connect_again(self) -> None:
        """Open the connection again if it was closed to let others in (waiting for them to leave)."""
        if self._con is not None:
            return
        if self._closed:
            raise StoreError(f"{self.path} is closed")
        start = time.monotonic()
        self._con = _connect(self.path, self.read_only, OPEN_WAIT_S if self.read_only else REOPEN_WAIT_S,
                             self._writer, memory_limit=self._memory_limit)
        self._pause_cost_s += time.monotonic() - start
        if self._writer is not None:
            self._writer.clear()  # readers who asked while it was closed are in, or will ask again

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ---------------------------------------------------------------- schema

    def _load_columns(self) -> dict[str, dict[str, str]]:
        rows = self._con.execute(
            "SELECT table_name, column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = 'main' ORDER BY table_name, ordinal_position"
        ).fetchall()
        columns: dict[str, dict[str, str]] = {}
        for table, column, dtype in rows:
            columns.setdefault(table, {})[column] = dtype
        return columns

    @_locked
    def migrations(self) -> list[str]:
        """Names of the migrations applied to this database, in order."""
        return applied_migrations(self._con)

    def tables(self) -> list[str]:
        """Names of the tables in the database."""
        return sorted(self._columns)

    # ---------------------------------------------------------------- writes

    def _arrow(self, table: str, rows: Rows) -> pa.Table:
        if isinstance(rows, pa.Table):
            return rows
        if isinstance(rows, pl.DataFrame):
            return rows.to_arrow()
        schema = self._columns[table]
        present = list(dict.fromkeys(key for row in rows for key in row))
        unknown = [key for key in present if key not in schema]
        if unknown:
            raise StoreError(f"table {table} has no column(s): {', '.join(unknown)}")
        data = {}
        for column in present:
            values = [row.get(column) for row in rows]
            if schema[column] == "JSON":
                values = [None if v is None else _encode_json(v) for v in values]
            data[column] = values
        try:
            return pa.table(data)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise StoreError(f"rows for table {table} have mixed types: {exc}") from exc

    def _write(self, table: str, rows: Rows, *, replace: bool = True) -> int:
        self._check_writable()
        arrow = self._arrow(table, rows)
        if arrow.num_rows == 0:
            return 0
        verb = "INSERT OR REPLACE" if replace else "INSERT"
        self._con.register("_factory_rows", arrow)
        try:
            self._con.execute(f"{verb} INTO {table} BY NAME SELECT * FROM _factory_rows")
        except duckdb.Error as exc:
            raise StoreError(f"writing {arrow.num_rows} row(s) to {table} failed: {_first_line(exc)}") from exc
        finally:
            _unregister(self._con, "_factory_rows")
        return arrow.num_rows

    def _transaction(self) -> _Transaction:
        return _Transaction(self)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """Group several writes into one atomic, thread-exclusive transaction."""
        self._check_writable()
        with self._lock:
            self._connect_again()
            with self._transaction():
                yield

    def _check_writable(self) -> None:
        if self.read_only:
            raise StoreError(f"{self.path} is open read-only")

    @_locked
    def write_run(self, run: Mapping[str, Any]) -> None:
        """Insert or replace one run row (``run_id`` is the key)."""
        with self._transaction():
            self._write("runs", [run])

    @_locked
    def update_run(self, run_id: str, **fields: Any) -> None:
        """Set some columns of an existing run (e.g. ``status``, ``finished_at``)."""
        self._check_writable()
        if not fields:
            return
        unknown = [name for name in fields if name not in self._columns["runs"]]
        if unknown:
            raise StoreError(f"table runs has no column(s): {', '.join(unknown)}")
        assignments = ", ".join(f"{name} = ?" for name in fields)
        values = [json.dumps(v) if self._columns["runs"][k] == "JSON" and v is not None else v
                  for k, v in fields.items()]
        self._con.execute(f"UPDATE runs SET {assignments} WHERE run_id = ?", [*values, run_id])

    @_locked
    def write_tasks(self, rows: Rows) -> int:
        """Insert or replace task rows, keyed by (run_id, task_id)."""
        with self._transaction():
            return self._write("tasks", rows)

    @_locked
    def write_branches(self, branches: Rows, events: Rows | None = None) -> int:
        """Write finished branches and (optionally) their events, atomically.

        Each branch row replaces any earlier row with the same (run_id,
        task_id, branch_index). When ``events`` is given, every event of those
        branches already stored is deleted first, so a branch written twice
        holds exactly its latest events.

        Returns:
            The number of branch rows written.
        """
        self._check_writable()
        branch_table = self._arrow("branches", branches)
        event_table = self._arrow("events", events) if events is not None else None
        with self._transaction():
            if event_table is not None and branch_table.num_rows:
                self._delete_events_of_stored(branch_table.select(list(_BRANCH_KEY)))
            written = self._write("branches", branch_table)
            if event_table is not None:
                self._write("events", event_table, replace=False)
        return written

    def _delete_events_of_stored(self, keys: pa.Table) -> None:
        # Events are only ever written with their branch row, so a branch not
        # yet stored has no events: look the keys up in the branches primary
        # key first and skip the scan of events on a first write.
        self._con.register("_factory_keys", keys)
        try:
            rewritten = self._con.execute(
                "SELECT count(*) FROM branches b JOIN _factory_keys k USING (run_id, task_id, branch_index)"
            ).fetchall()[0][0]
            if rewritten:
                self._con.execute(
                    "DELETE FROM events WHERE (run_id, task_id, branch_index) IN "
                    "(SELECT (run_id, task_id, branch_index) FROM _factory_keys)"
                )
        finally:
            _unregister(self._con, "_factory_keys")

    @_locked
    def write_verdicts(self, rows: Rows) -> int:
        """Insert or replace verdicts, keyed by (run, task, branch, verifier, version)."""
        with self._transaction():
            return self._write("verdicts", rows)

    @_locked
    def write_judgments(self, rows: Sequence[Mapping[str, Any]]) -> int:
        """Insert or replace judge samples; the key is derived from the identifying columns."""
        keyed = [{**row, "judgment_id": content_hash([row.get(k) for k in _JUDGMENT_KEY])} for row in rows]
        with self._transaction():
            return self._write("judgments", keyed)

    @_locked
    def write_rankings(self, rows: Rows) -> int:
        """Insert or replace ranking rows, keyed by (run, task, branch)."""
        with self._transaction():
            return self._write("rankings", rows)

    @_locked
    def replace_rankings(self, run_id: str, rows: Rows) -> int:
        """Replace a run's whole stored ranking with ``rows``, atomically.

        Unlike :meth:`write_rankings`, a branch ranked before but absent from
        ``rows`` loses its old row, so the stored ranking is exactly the new one.

        Returns:
            The number of ranking rows written.
        """
        self._check_writable()
        with self._transaction():
            self._execute(queries.DELETE_RANKINGS, [run_id])
            return self._write("rankings", rows)

    @_locked
    def record_artifacts(self, rows: Rows) -> int:
        """Insert or replace artifact rows (a command's output files), keyed by ``artifact_id``.

        The id is derived from run, kind and path (see :func:`~factory.store.artifact_rows`), so the same
        artifact written again updates its row: its hash, meta and time.
        """
        with self._transaction():
            return self._write("artifacts", rows)

    #: DuckDB's memory limit while :meth:`write_memories` loads many rows.
    BULK_MEMORY_LIMIT = "512MB"

    #: DuckDB's memory limit while a long read streams through the store (:meth:`memory_capped`).
    STREAM_MEMORY_LIMIT = "512MB"

    @contextlib.contextmanager
    def memory_capped(self, limit: str = STREAM_MEMORY_LIMIT) -> Iterator[None]:
        """DuckDB's buffer pool capped at ``limit`` meanwhile, then back to the limit before (caps nest).

        A read that streams a whole run slice by slice (an export) touches every block of the store once;
        uncapped, DuckDB keeps them cached up to 80% of the machine's memory, so the process grows with the
        store. Capped, read blocks are evicted instead (a query needing more spills or fails as over the cap).
        A read-only store's settings are locked (sealed): it connects again with the cap, and again with the
        limit before. A cap inside another (a bulk memory load inside an export's cap) restores the outer one.
        """
        with self._lock:
            previous = self._memory_limit
            self._set_memory_limit(limit)
        try:
            yield
        finally:
            with self._lock:
                self._set_memory_limit(previous)

    def _set_memory_limit(self, limit: str | None) -> None:
        """Apply ``limit`` (None: DuckDB's default) now on a writable connection, on the next connect on a reader."""
        self._memory_limit = limit
        if self.read_only:
            self._reconnect_lazily()
            return
        if self._con is None:  # let go for readers: the next connect applies it
            if self._closed:
                return
            self._connect_again()
        self._con.execute("RESET memory_limit" if limit is None else f"SET memory_limit = '{limit}'")

    def _reconnect_lazily(self) -> None:
        """Close a reader's connection now; the next read opens it again (with :attr:`_memory_limit`)."""
        if self._con is not None:
            self._con.close()
            self._con = None

    @_locked
    def write_memories(self, rows: Rows, *, new_only: bool = False, bulk_rows: int = 100_000) -> int:
        """Insert or replace memory rows, keyed by ``memory_id`` (``embedding`` a float list per row).

        ``new_only``: the caller has checked that no id is stored, so the rows
        are appended with a plain ``INSERT`` (``OR REPLACE`` holds several
        times the rows' size in memory while it checks each key), in one
        statement. From ``bulk_rows`` rows on, DuckDB's buffer pool is capped
        meanwhile (the written blocks are flushed rather than cached: uncapped,
        300,000 rows of 384 floats held 2.1 times the rows' size; capped, the
        load of 1,000,000 peaks at about 0.5 GiB) and the rows are stored
        uncompressed: DuckDB's float compression (ALP) saved 7 % of the bytes
        of unit vectors and doubled the load's CPU time (issue 33's notes).
        One statement, not slices of it: each ``INSERT`` of a transaction
        writes its own blocks, merged again at commit (slices of 250,000 took
        1.5 times the CPU and left a 2.3 GB file for 1.6 GB of rows).
        """
        self._memory_writes += 1
        if not new_only:
            with self._transaction():
                return self._write("memory", rows)
        arrow = self._arrow("memory", rows)
        if arrow.num_rows < bulk_rows:
            with self._transaction():
                return self._write("memory", arrow, replace=False)
        with self.memory_capped(self.BULK_MEMORY_LIMIT):  # then back to the limit before (an outer cap stays)
            self._con.execute("SET force_compression = 'uncompressed'")
            try:
                with self._transaction():
                    return self._write("memory", arrow, replace=False)
            finally:  # back to DuckDB's default
                self._con.execute("RESET force_compression")

    @_locked
    def clear_memory(self) -> int:
        """Delete every memory; return how many there were."""
        self._check_writable()
        self._memory_writes += 1
        with self._transaction():
            return self._execute(queries.DELETE_MEMORIES)

    @_locked
    def write_memory_discards(self, rows: Rows) -> int:
        """Insert or replace the branches the memory refused, keyed by (run, task, branch), with a ``reason``."""
        with self._transaction():
            return self._write("memory_discards", rows)

    @_locked
    def clear_memory_discards(self) -> int:
        """Delete every discard count; return how many rows there were."""
        self._check_writable()
        with self._transaction():
            return self._execute(queries.DELETE_MEMORY_DISCARDS)

    def _execute(self, sql: str, params: Sequence[Any] | None = None) -> int:
        """Run one of the store's own modifying statements; return the rows it changed."""
        try:
            return int(self._con.execute(sql, params).fetchall()[0][0])
        except duckdb.Error as exc:
            raise StoreError(f"{' '.join(sql.split()[:3])} failed: {_first_line(exc)}") from exc

    # ----------------------------------------------------------------- reads

    @_locked
    def query(self, sql: str, params: Sequence[Any] | Mapping[str, Any] | None = None) -> pl.DataFrame:
        """Run a user's SQL and return a Polars frame: the door ``factory query`` opens.

        Only reading statements run (``SELECT`` in all its forms: ``WITH``,
        ``FROM``-first, ``VALUES``, ``DESCRIBE``, ``SHOW``, ``SUMMARIZE``); any other
        statement refuses the whole text before any of it runs. On a
        read-only store the connection is sealed besides (see the module
        docstring), so not even a reading statement reaches a file but the
        store: that is how ``factory query`` opens it.

        The library itself never calls this: what a stage reads or writes is a
        named method of the store, so the SQL lives in one package.

        Raises:
            QueryError: A statement that is not a read, or DuckDB's error, on one line.
        """
        try:
            statements = self._con.extract_statements(sql)
        except duckdb.Error as exc:
            raise QueryError(" ".join(str(exc).split())) from exc
        if not statements:
            raise QueryError("no SQL statement given")
        for statement in statements:
            kind = statement.type.name
            if kind not in _QUERY_STATEMENTS:
                text = " ".join(statement.query.split()).rstrip("; ")
                raise QueryError(f"queries are read-only: {kind} refused ({text[:60]}); only SELECT, WITH, FROM, "
                                 "VALUES, DESCRIBE, SHOW and SUMMARIZE run, and nothing ran")
        return self._read(sql, params)

    @_locked
    def _read(self, sql: str, params: Sequence[Any] | Mapping[str, Any] | None = None) -> pl.DataFrame:
        try:
            relation = self._con.sql(sql, params=params)
            if relation is None:  # a statement with no result set
                return pl.DataFrame()
            return relation.pl()
        except duckdb.Error as exc:
            raise QueryError(" ".join(str(exc).split())) from exc

    def _select(self, table: str, order: str, **filters: Any) -> pl.DataFrame:
        where = [f"{column} = ?" for column, value in filters.items() if value is not None]
        params = [value for value in filters.values() if value is not None]
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        return self._read(f"SELECT * FROM {table}{clause} ORDER BY {order}", params)

    def runs(self) -> pl.DataFrame:
        """All runs, newest first."""
        return self._select("runs", "created_at DESC, run_id")

    def run(self, run_id: str) -> dict[str, Any] | None:
        """One run as a dict, or None if there is no such run."""
        frame = self._select("runs", "run_id", run_id=run_id)
        return frame.row(0, named=True) if frame.height else None

    def tasks(self, run_id: str) -> pl.DataFrame:
        """The tasks of a run."""
        return self._select("tasks", "task_id", run_id=run_id)

    def branches(self, run_id: str, task_id: str | None = None) -> pl.DataFrame:
        """The branches of a run (optionally of one task)."""
        return self._select("branches", "task_id, branch_index", run_id=run_id, task_id=task_id)

    def events(self, run_id: str, task_id: str | None = None, branch_index: int | None = None) -> pl.DataFrame:
        """Trajectory events of a run, in order within each branch."""
        return self._select(
            "events", "task_id, branch_index, seq",
            run_id=run_id, task_id=task_id, branch_index=branch_index,
        )

    def verdicts(self, run_id: str) -> pl.DataFrame:
        """Every verdict of a run (all verifier versions)."""
        return self._select("verdicts", "task_id, branch_index, verifier, version", run_id=run_id)

    def judgments(self, run_id: str) -> pl.DataFrame:
        """Every judge sample of a run."""
        return self._select("judgments", "task_id, kind, branch_a, branch_b, sample_index", run_id=run_id)

    def rankings(self, run_id: str) -> pl.DataFrame:
        """The stored ranking of a run."""
        return self._select("rankings", "task_id, rank", run_id=run_id)

    def artifacts(self, run_id: str) -> pl.DataFrame:
        """The files recorded as made from a run (plots, exports, models), newest first."""
        return self._select("artifacts", "created_at DESC, artifact_id", run_id=run_id)

    def run_summaries(self) -> pl.DataFrame:
        """One row per run with its counts: tasks, branches, errors (infrastructure failures), events, verdicts."""
        return self._read(
            f"""
            WITH t AS (SELECT run_id, count(*) AS tasks FROM tasks GROUP BY run_id),
                 b AS (SELECT run_id, count(*) AS branches,
                              count_if(status IN {queries.NOT_OUTCOMES})::BIGINT AS errors
                       FROM branches GROUP BY run_id),
                 e AS (SELECT run_id, count(*) AS events FROM events GROUP BY run_id),
                 v AS (SELECT run_id, count(*) AS verdicts FROM verdicts GROUP BY run_id)
            SELECT r.run_id, r.created_at, r.status, r.model, r.n_branches,
                   coalesce(t.tasks, 0) AS tasks, coalesce(b.branches, 0) AS branches,
                   coalesce(b.errors, 0) AS errors, coalesce(e.events, 0) AS events,
                   coalesce(v.verdicts, 0) AS verdicts
            FROM runs r
            LEFT JOIN t USING (run_id) LEFT JOIN b USING (run_id)
            LEFT JOIN e USING (run_id) LEFT JOIN v USING (run_id)
            ORDER BY r.created_at DESC, r.run_id
            """
        )

    def table_counts(self) -> dict[str, int]:
        """Rows in each table, by table name (the migrations ledger left out)."""
        return {table: int(self._read(queries.TABLE_COUNT.format(table=table)).item())
                for table in self.tables() if table != "factory_migrations"}

    def excluded_branches(self, run_id: str) -> pl.DataFrame:
        """A run's branches that are not outcomes of the policy (infrastructure failures), by status.

        Columns: ``status``, ``branches`` (how many), ``reasons`` (the error types seen).
        """
        return self._read(queries.EXCLUDED_BRANCHES, [run_id])

    def excluded_branch_rows(self, run_id: str) -> pl.DataFrame:
        """A run's branches that are not outcomes of the policy, one row each.

        Columns: ``task_id, branch_index, temperature, seed, model, status, reason`` (the error's type).
        """
        return self._read(queries.EXCLUDED_BRANCH_ROWS, [run_id])

    def branch_records(self, run_id: str, *, opinions: Sequence[str]) -> pl.DataFrame:
        """Every branch of a run that is an outcome, with its verdict summary, as the ranker reads it.

        Infrastructure failures are left out (:meth:`excluded_branches` counts them).
        Columns: ``task_id, branch_index, temperature, seed, model, status``;
        ``objective_pass``, ``objective_score``, ``judge_score`` (null for a
        branch with no such verdict), ``hack``, ``suspected`` and ``boundary_limited`` (a test failed only
        because something could not cross the isolation boundary; false when unverified), from
        each verifier's latest verdict (see
        :func:`~factory.store._queries.verdict_summary_sql`). Ordered by task
        and branch.
        Args:
            run_id: The run.
            opinions: Verifiers whose verdicts are opinions, not checks (the caller's
                :func:`factory.verifiers.opinion_verifiers`): left out of the objective outcome.
        """
        return self._read(queries.BRANCH_RECORDS, {"run": run_id, "opinions": list(opinions)})

    def pairwise_judgments(self, run_id: str) -> pl.DataFrame:
        """A run's pairwise judge samples, every status.

        Columns: ``task_id, judge, branch_a, branch_b, sample_index, swapped,
        preference, status``; ordered by task, branches, then ``swapped``, so
        both orders of one comparison are adjacent.
        """
        return self._read(queries.PAIRWISE_JUDGMENTS, [run_id])

    def latest_verdicts(self, run_id: str) -> pl.DataFrame:
        """The latest verdict of each verifier on each branch of a run.

        The newest by ``created_at``, the highest version breaking a tie.
        Columns: ``task_id, branch_index, verifier, status, score, details``;
        ordered by task, branch and verifier.
        """
        return self._read(queries.LATEST_VERDICTS, [run_id])

    def task_summaries(self, run_id: str, *, opinions: Sequence[str]) -> pl.DataFrame:
        """One row per task of a run: its branches counted, and what they cost.

        Columns: ``task_id, branches, ok, max_turns, errors, input_tokens,
        output_tokens, cost_usd`` (null when no branch has a cost), ``verified``
        (branches with an objective verdict), ``passed`` (every latest
        objective verdict passed), ``hacks`` and ``boundary_limited`` (branches with a test that failed
        only because something could not cross the isolation boundary). Ordered by task.
        Args:
            run_id: The run.
            opinions: Verifiers whose verdicts are opinions, not checks (the caller's
                :func:`factory.verifiers.opinion_verifiers`): left out of the objective outcome.
        """
        return self._read(queries.TASK_SUMMARIES, {"run": run_id, "opinions": list(opinions)})

    def run_provenance(self, run_ids: Sequence[str]) -> pl.DataFrame:
        """``run_id, dataset_hash, config_hash, model, created_at`` of those of ``run_ids`` that are stored."""
        return self._read(queries.RUN_PROVENANCE, [list(run_ids)])

    def export_branches(self, run_ids: Sequence[str], *, opinions: Sequence[str]) -> pl.DataFrame:
        """Every branch of ``run_ids``, verified, ranked and with its conversation: what an export reads.

        One query joins each verifier's latest verdict per branch (see
        :func:`~factory.store._queries.verdict_summary_sql`), the stored
        ranking (null where the run was never ranked), the task's prompt and
        spec, and the branch's trajectory parsed into typed messages
        (``json_transform`` to :data:`~factory.store._queries.MESSAGE_JSON_SHAPE`)
        and split into ``prompt_messages`` (system + user) and
        ``completion_messages`` (the rest). ``mode`` is the branch's
        ``run_start`` event's mode (``single-turn`` when absent). Ordered by
        run, task and branch.
        Args:
            run_ids: The runs.
            opinions: Verifiers whose verdicts are opinions, not checks (the caller's
                :func:`factory.verifiers.opinion_verifiers`): left out of the objective outcome.
        """
        return self._read(queries.EXPORT_BRANCHES, {"runs": list(run_ids), "opinions": list(opinions)})

    def export_tasks(self, run_ids: Sequence[str]) -> pl.DataFrame:
        """The tasks an export of ``run_ids`` reads, in its order: ``run_id, task_id, branches`` (outcomes only).

        Light (no messages): an export cuts its run into slices of whole tasks from it
        (:meth:`export_branch_slice`).
        """
        return self._read(queries.EXPORT_TASKS, {"runs": list(run_ids)})

    def export_slices(self, run_ids: Sequence[str], size: int | None) -> pl.DataFrame:
        """The slices an export of ``run_ids`` streams, one row each, in its order (from DuckDB: light).

        Consecutive whole tasks of one run; a slice closes at the first task that takes it to ``size``
        outcome branches or more (None: one slice per run). Columns: ``run_id, first_task, last_task,
        branches, tasks, most`` (the most branches of one of its tasks).
        """
        return self._read(queries.EXPORT_SLICES, {"runs": list(run_ids), "size": size})

    def run_outcome_counts(self, run_id: str, *, opinions: Sequence[str]) -> pl.DataFrame:
        """One row per task of a run with an outcome branch, by task id, counted in DuckDB (no row per branch).

        Columns: ``verified``, ``passed``, ``unverified`` (objective verdicts, as :meth:`branch_records`
        gives them), ``judge_scores`` and ``objective_scores`` (branches with one).
        """
        return self._read(queries.RUN_OUTCOME_COUNTS, {"run": run_id, "opinions": list(opinions)})

    def export_branch_slice(self, run_id: str, first_task: str, last_task: str, *,
                            opinions: Sequence[str]) -> pl.DataFrame:
        """The rows of :meth:`export_branches` for one run's tasks ``first_task`` .. ``last_task`` (inclusive).

        Every table is read through the same condition, so a slice costs what its own rows cost, whatever
        the size of the store: a streaming export holds one slice at a time.
        """
        # Sorted here, not in DuckDB: its sort would carry the message lists along (byte order, as DuckDB's).
        return self._read(queries.EXPORT_BRANCH_SLICE, {"run": run_id, "first": first_task, "last": last_task,
                                                        "opinions": list(opinions)}).sort("task_id", "branch_index")

    def stored_ranking_counts(self, run_ids: Sequence[str]) -> dict[str, int]:
        """Per run of ``run_ids``, how many of its outcome branches have a stored rank (runs with none: absent)."""
        frame = self._read(queries.RANKED_BRANCH_COUNTS, {"runs": list(run_ids)})
        return {run_id: int(n) for run_id, n in frame.iter_rows()}

    def export_judge_objective(self, run_ids: Sequence[str], *, opinions: Sequence[str]) -> pl.DataFrame:
        """``judge_score, objective_pass`` of every branch of ``run_ids`` (outcomes) that has both."""
        return self._read(queries.EXPORT_JUDGE_OBJECTIVE, {"runs": list(run_ids), "opinions": list(opinions)})

    # -------------------------------------------------------------- feedback

    @_locked
    def write_feedback(self, rows: Rows) -> int:
        """Insert or replace feedback rows (:meth:`~factory.store.FeedbackRecord.row`), keyed by ``feedback_id``."""
        with self._transaction():
            return self._write("feedback", rows)

    @_locked
    def set_feedback_status(self, feedback_ids: Sequence[str], status: str) -> int:
        """Set the status (``accepted``, ``rejected``...) of the given feedback rows; return how many changed."""
        self._check_writable()
        if not feedback_ids:
            return 0
        with self._transaction():
            return self._execute(queries.SET_FEEDBACK_STATUS, [status, list(feedback_ids)])

    def feedback(self, run_id: str, *, task_id: str | None = None, status: str | None = None) -> pl.DataFrame:
        """A run's feedback rows (optionally one task's, or one status's), by branch and place in the trajectory.

        Empty (no columns) on a database written before the ``feedback`` table existed.
        """
        if "feedback" not in self._columns:
            return pl.DataFrame()
        return self._read(queries.FEEDBACK, {"run": run_id, "task": task_id, "status": status})

    def feedback_by_ids(self, feedback_ids: Sequence[str]) -> pl.DataFrame:
        """The feedback rows with these ids (those that exist)."""
        if not feedback_ids or "feedback" not in self._columns:
            return pl.DataFrame()
        return self._read(queries.FEEDBACK_BY_IDS, [list(feedback_ids)])

    def accepted_feedback(self, run_ids: Sequence[str]) -> pl.DataFrame:
        """The accepted feedback of ``run_ids`` (what the ``hints`` and ``spans`` exports read)."""
        if "feedback" not in self._columns:
            return pl.DataFrame()
        return self._read(queries.ACCEPTED_FEEDBACK, [list(run_ids)])

    # ---------------------------------------------------------------- memory

    def memory_state(self) -> tuple[int, datetime | None]:
        """Row count and newest ``created_at`` of ``memory``: changes whenever any writer adds or clears memories.

        The memory backend asks before every search. The store that holds the
        writer lock is the only writer of its file, so it answers from the last
        read until it has itself written or cleared memories since (``max``
        scans every row: 4 ms of an 8.6 ms search at 100,000 memories); a
        reader asks DuckDB each time.
        """
        writes = self._memory_writes
        if self._writer is not None and self._memory_state is not None and self._memory_state[0] == writes:
            return self._memory_state[1]
        count, newest = self._read(queries.MEMORY_STATE).row(0)
        state = (int(count), newest)
        if self._writer is not None:
            self._memory_state = (writes, state)
        return state

    def memory_count(self) -> int:
        """Stored memories."""
        return int(self._read(queries.MEMORY_COUNT).item())

    def stored_memory_ids(self, memory_ids: Sequence[str]) -> set[str]:
        """Which of ``memory_ids`` are stored."""
        if not memory_ids:
            return set()
        return set(self._read(queries.STORED_MEMORY_IDS, [list(memory_ids)])["memory_id"].to_list())

    def memory_spaces(self) -> set[tuple[str, int]]:
        """The (embedder, dim) pairs of the stored memories."""
        return {(embedder, int(dim)) for embedder, dim in self._read(queries.MEMORY_SPACES).iter_rows()}

    def memory_space(self, embedder: str, dim: int) -> pl.DataFrame:
        """Every memory of one (embedder, dim) space, ``embedding`` included, ordered by ``memory_id``."""
        return self._read(queries.MEMORY_SPACE, [embedder, int(dim)])

    def memory_space_meta(self, embedder: str, dim: int) -> pl.DataFrame:
        """Every memory of one space but its vector, ordered by ``memory_id``, with its DuckDB ``rowid`` as ``_row``.

        ``_row`` matches the rows of :meth:`memory_vectors` while this store's connection stays open (the
        caller checks :meth:`memory_state` around both reads).
        """
        return self._read(queries.MEMORY_SPACE_META, [embedder, int(dim)])

    @_locked
    def memory_vectors(self, embedder: str, dim: int, sink: Callable[[pa.Array, pa.Array], None], *,
                       from_row: int = 0, batch_rows: int = 65_536) -> int:
        """Stream one space's vectors to ``sink(rowids, flat_float32_values)`` in batches; return the rows sent.

        Batches of at most ``batch_rows`` rows in storage order, from ``rowid`` ``from_row`` on (row groups
        below it are skipped), with DuckDB's buffer pool capped meanwhile: reading every vector of a space
        holds one batch at a time here, not the space (1.5 GB at 1M 384-dim rows) nor DuckDB's cache of it.
        """
        sent = 0
        with self.memory_capped():
            self._connect_again()
            try:
                reader = self._con.sql(queries.MEMORY_VECTORS, params=[embedder, int(dim), int(from_row)]
                                       ).to_arrow_reader(batch_rows)
                for batch in reader:
                    sink(batch.column("_row"), batch.column("embedding").flatten())
                    sent += batch.num_rows
            except duckdb.Error as exc:
                raise QueryError(" ".join(str(exc).split())) from exc
        return sent

    def memory_discard_counts(self) -> dict[str, int]:
        """Branches the memory refused, counted by reason (reasons in sorted order)."""
        return {reason: int(n) for reason, n in self._read(queries.MEMORY_DISCARD_COUNTS).iter_rows()}


class _Transaction:
    """BEGIN/COMMIT around a block; ROLLBACK if it raises. Nested blocks join the outer one.

    Nesting is counted here rather than detected from a failing BEGIN:
    DuckDB aborts the open transaction when a second BEGIN fails.
    """

    def __init__(self, store: Store):
        self._store = store

    def __enter__(self) -> None:
        if self._store._depth == 0:
            self._store._con.execute("BEGIN TRANSACTION")
        self._store._depth += 1

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self._store._depth -= 1
        if self._store._depth > 0:
            return
        con = self._store._con
        if exc_type is None:
            try:
                con.execute("COMMIT")
            except duckdb.Error as exc:  # a full disk, a write-ahead log that cannot be written
                with contextlib.suppress(duckdb.Error):
                    con.execute("ROLLBACK")
                why = disk_full(exc)
                if why is not None:  # rolled back: the store is as it was before the block
                    raise OutputSpaceError("commit to the store", str(self._store.path), why) from exc
                raise StoreError(f"writing to {self._store.path} failed: {_first_line(exc)}") from exc
            return
        con.execute("ROLLBACK")
        for name in _SCRATCH_VIEWS:  # left registered if the failing statement aborted the transaction
            _unregister(con, name)


_SCRATCH_VIEWS = ("_factory_rows", "_factory_keys")


def _unregister(con: duckdb.DuckDBPyConnection, name: str) -> None:
    # Inside an aborted transaction DuckDB refuses even this; the transaction's
    # rollback retries it.
    with contextlib.suppress(duckdb.Error):
        con.unregister(name)

