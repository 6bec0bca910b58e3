"""``RolloutMemoryStore``: winning branches, embedded, retrieved to prime later runs.

Only clean wins are stored: a branch whose objective score is 1 and in which
no verifier detected a hack. Everything else is discarded and counted (in
``memory_discards``), never stored, so the memory cannot be poisoned by
failures or exploits. A winner with the same task and final answer as a
stored memory is a duplicate and is not stored again, so re-adding a run (or
resuming it) adds nothing twice.

Backends implement :class:`MemoryBackend`; the default keeps the memories in
the run's DuckDB file and searches them with DuckDB's built-in
``array_cosine_similarity`` over ``FLOAT[dim]`` arrays (no extension to
download).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import polars as pl
import pyarrow as pa

from factory.errors import ConfigError, StoreError
from factory.memory._embedders import Embedder
from factory.provenance import content_hash
from factory.store import Store, utc_now

logger = logging.getLogger(__name__)

#: Inverted lists an ANN search scans by default (of about 2 sqrt(n): 64 of 2,000 at 1,000,000 memories).
NPROBE = 64

__all__ = ["DuckDBMemoryBackend", "Memory", "MemoryBackend", "MemoryCandidate", "RolloutMemoryStore",
           "UpsertReport", "candidates_from_run", "format_as_system_prompt", "new_rows"]


@dataclass(frozen=True)
class MemoryCandidate:
    """A finished, verified branch offered to the memory."""

    run_id: str
    task_id: str
    branch_index: int
    task_text: str
    final_answer: str | None
    key_steps: list[str]
    objective_score: float | None
    hack_detected: bool
    #: The behaviour monitor saw a hack attempt: never stored, even when it passed.
    hack_suspected: bool = False
    #: Not an outcome (the provider, sandbox or verifier failed): never stored, counted apart.
    infra_error: bool = False


@dataclass(frozen=True)
class Memory:
    """A stored winner (``similarity`` is set on retrieval)."""

    memory_id: str
    run_id: str
    task_id: str
    branch_index: int
    task_text: str
    key_steps: list[str]
    final_answer: str | None
    embedder: str
    dim: int
    similarity: float | None = None


@runtime_checkable
class MemoryBackend(Protocol):
    """Where memories live. Vectors are unit-length float32 rows."""

    def add(self, memories: Sequence[Memory], vectors: np.ndarray) -> int:
        """Insert memories whose id is new; return how many were inserted."""
        ...

    def existing_ids(self, memory_ids: Sequence[str]) -> set[str]:
        """Which of these ids are stored."""
        ...

    def search(self, vector: np.ndarray, k: int, embedder: str, dim: int) -> list[Memory]:
        """The k most cosine-similar memories of this embedder, most similar first."""
        ...

    def spaces(self) -> set[tuple[str, int]]:
        """The (embedder, dim) pairs stored."""
        ...

    def count(self) -> int:
        """Stored memories."""
        ...

    def clear(self) -> int:
        """Delete every memory; return how many there were."""
        ...


class DuckDBMemoryBackend:
    """Memories in the store's ``memory`` table; exact cosine search below a size threshold, an ANN index above it.

    The DuckDB file is the durable store and the source of truth: every
    memory, vector included, is a row of ``memory``, and any DuckDB client can
    search it with ``array_cosine_similarity(embedding::FLOAT[384], ...)``.
    Retrieval itself runs in process, on a mirror of one (embedder, dim)
    space loaded on the first search:

    - below ``index_threshold`` memories, an exact search over a NumPy matrix
      of the unit vectors: DuckDB 2.0 reads a ``FLOAT[384]`` column at about
      2 GB/s on one thread, six to eight times NumPy's matrix-vector product
      over the same rows (``bench/bench_memory.py``); both are exact and agree
      (a test checks the mirror against ``array_cosine_similarity``);
    - from ``index_threshold`` on, a faiss inverted-file index
      (:class:`IvfIndex`, the ``memory-ann`` extra) persisted in
      ``<db>.memory-<space>.ann`` beside the store. A process loads it
      instead of rebuilding it; rows the store gained since it was written
      are inserted into it (and the file rewritten once they pass
      ``save_fraction`` of it); if the store lost or replaced rows behind it
      (its ids are not all stored any more, or the file is torn or foreign),
      or it has grown past ``RETRAIN_GROWTH`` times the rows its lists were
      trained on, it is rebuilt. :meth:`reindex` rebuilds it on demand.

    What the mirror holds: every row's metadata (Arrow columns, no vectors;
    a search builds its k results from it: fetching the k rows from DuckDB
    by id took 5-25 ms at 1,000,000 memories, against a 5 ms budget for
    the whole search), and the vectors only below the threshold. With a
    current index file, a new process reads the metadata and the file and
    only the vectors of the rows the file lacks; a build reads every vector
    in bounded batches (DuckDB's buffer pool capped) into one float32
    matrix, dropped once the index holds its own copy.

    The mirror is extended in place by this backend's own writes (the index
    too: an upsert is searchable at once, without a rebuild), and reloaded
    when the table's row count or newest ``created_at`` shows that another
    writer changed it.

    Args:
        store: The run store.
        index_threshold: Memories of one space from which searches use the
            ANN index (exact below).
        nprobe: Inverted lists scanned per search (the recall/latency knob).
        save_fraction: Rewrite the index file once the rows inserted since it
            was written exceed this fraction of it.
    """

    spec = "duckdb"

    def __init__(self, store: Store, *, index_threshold: int = 100_000, nprobe: int = NPROBE,
                 save_fraction: float = 0.05):
        self.store = store
        self.index_threshold = int(index_threshold)
        self.nprobe = int(nprobe)
        self.save_fraction = float(save_fraction)
        # space -> (metadata rows, unit-length vectors in the same order, or None once indexed; the index or None)
        self._mirror: dict[tuple[str, int], _Space] = {}
        self._mirror_state: tuple[int, Any] | None = None
        self._spaces: tuple[tuple[int, Any], frozenset[tuple[str, int]]] | None = None  # (table state, spaces)

    def _table_state(self) -> tuple[int, Any]:
        return self.store.memory_state()

    def index_path(self, embedder: str, dim: int) -> Path | None:
        """Where a space's ANN index lives (None for a store with no file)."""
        path = getattr(self.store, "path", None)
        if path is None or str(path) == ":memory:":
            return None
        tag = hashlib.sha256(f"{embedder}\n{int(dim)}".encode()).hexdigest()[:12]
        return Path(path).with_name(f"{Path(path).name}.memory-{tag}.ann")

    def add(self, memories: Sequence[Memory], vectors: np.ndarray) -> int:
        if not memories:
            return 0
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        keep = new_rows(memories, self.existing_ids([m.memory_id for m in memories]))
        if not keep:
            return 0
        fresh, block = [memories[i] for i in keep], vectors[keep]
        in_sync = self._mirror_state is not None and self._mirror_state == self._table_state()
        meta = _meta_table(fresh)
        self.store.write_memories(_with_vectors(meta, block), new_only=True)
        if in_sync:  # nobody else wrote since the mirror was loaded: extend it rather than reload it
            self._mirror_state = self._table_state()
            frame = pl.from_arrow(meta)
            for (embedder, space_dim), part in frame.with_row_index("_row").group_by(["embedder", "dim"]):
                space = self._mirror.get((embedder, space_dim))
                if space is not None:
                    rows = _unit_rows(block[part["_row"].to_numpy()])
                    space.extend(part.drop("_row"), rows)
                    if space.index is None and space.meta.height >= self.index_threshold:
                        self._build(space, embedder, int(space_dim))
                    elif space.index is not None and space.index.outgrown():  # lists trained on far fewer rows
                        space.index = None  # its lists' copy of the vectors goes before the rebuild reads them
                        self._mirror[(embedder, space_dim)] = space = self._load_space(
                            embedder, int(space_dim), rebuild=True)
            for (embedder, space_dim), space in self._mirror.items():
                if space.index is not None and space.unsaved > self.save_fraction * len(space.index):
                    self._save(space, embedder, space_dim)
        return len(fresh)

    def existing_ids(self, memory_ids: Sequence[str]) -> set[str]:
        return self.store.stored_memory_ids(memory_ids)

    def _space(self, embedder: str, dim: int) -> _Space:
        state = self._table_state()
        if state != self._mirror_state:
            self._mirror, self._mirror_state = {}, state
        if (embedder, dim) not in self._mirror:
            self._mirror[(embedder, dim)] = self._load_space(embedder, dim)
        return self._mirror[(embedder, dim)]

    def _load_space(self, embedder: str, dim: int, *, rebuild: bool = False) -> _Space:
        """One space's mirror: its metadata (never its vectors when a current index file holds them).

        Below the threshold, every vector is read into one matrix. From it, the index file is loaded and
        checked against the stored ids; only the rows it lacks (newer than the file) are read and inserted.
        The metadata and the vectors are two reads: if the table changed between them (a reader let a
        writer in), the load starts again.
        """
        for _ in range(3):
            before = self._table_state()
            meta = self.store.memory_space_meta(embedder, dim)
            if meta.height >= self.index_threshold or rebuild:
                space = self._indexed_space(meta, embedder, dim, rebuild=rebuild)
            else:
                space = _Space(meta.drop("_row"), self._read_vectors(meta, embedder, dim))
            if self._table_state() == before:
                return space
        raise StoreError(f"{self.store.path}: the memory table kept changing while its {embedder} space was read")

    def _read_vectors(self, meta: pl.DataFrame, embedder: str, dim: int, rows: np.ndarray | None = None
                      ) -> np.ndarray:
        """Unit vectors of ``meta``'s rows (or of its positions ``rows``), read in batches into one new matrix."""
        rowids = meta["_row"].to_numpy().astype(np.int64)
        wanted = np.arange(len(rowids)) if rows is None else np.asarray(rows, dtype=np.int64)
        matrix = np.empty((len(wanted), dim), dtype=np.float32)
        if not len(wanted):
            return matrix
        order = np.argsort(rowids[wanted], kind="stable")
        sorted_rowids = rowids[wanted][order]  # rowid -> its place in ``matrix`` by binary search

        def sink(batch_rowids: Any, values: Any) -> None:
            got = batch_rowids.to_numpy().astype(np.int64)
            at = np.minimum(np.searchsorted(sorted_rowids, got), len(sorted_rowids) - 1)
            keep = sorted_rowids[at] == got  # rows past ``from_row`` that are not wanted (already indexed)
            block = np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.float32).reshape(-1, dim)
            matrix[order[at[keep]]] = _unit_rows(block[keep])

        self.store.memory_vectors(embedder, dim, sink, from_row=int(sorted_rowids[0]))
        return matrix

    def _indexed_space(self, meta: pl.DataFrame, embedder: str, dim: int, *, rebuild: bool) -> _Space:
        """Load the persisted index and catch it up with the store, or rebuild it when stale (or asked to)."""
        from factory.memory._ann import IvfIndex

        path = self.index_path(embedder, dim)
        index = IvfIndex.load(path, embedder, dim, nprobe=self.nprobe) if path and not rebuild else None
        if index is not None:
            indexed_ids = pl.Series("memory_id", index.ids)
            if len(indexed_ids) == meta.height and (indexed_ids == meta["memory_id"]).all():
                return _Space(meta.drop("_row"), None, index, 0)  # the file is the store's space, in its order
            positions = indexed_ids.to_frame().join(
                meta.select("memory_id").with_row_index("_pos"), on="memory_id", how="left",
                maintain_order="left")["_pos"]
            # every indexed id is still stored, and the lists were trained on enough of them: insert the newer rows
            if positions.null_count() == 0 and not index.outgrown(meta.height - len(index)):
                indexed = positions.to_numpy().astype(np.int64)
                unindexed = np.ones(meta.height, dtype=bool)
                unindexed[indexed] = False  # a mask, not setdiff1d: its sort of 1M positions took seconds
                rest = np.flatnonzero(unindexed)
                space = _Space(meta[np.concatenate([indexed, rest])].drop("_row"), None, index, len(rest))
                if len(rest):
                    index.add(self._read_vectors(meta, embedder, dim, rest), meta["memory_id"][rest].to_list())
                    if len(rest) > self.save_fraction * len(index):
                        self._save(space, embedder, dim)
                return space
        space = _Space(meta.drop("_row"), None)
        self._build(space, embedder, dim, self._read_vectors(meta, embedder, dim))
        return space

    def _build(self, space: _Space, embedder: str, dim: int, matrix: np.ndarray | None = None) -> None:
        from factory.memory._ann import IvfIndex

        matrix = space.matrix if matrix is None else matrix
        index = IvfIndex.build(embedder, dim, matrix, space.meta["memory_id"].to_list(), nprobe=self.nprobe)
        space.matrix, space.index, space.unsaved = None, index, len(index)
        self._save(space, embedder, dim)
        path = self.index_path(embedder, dim)
        if path is not None:  # the HNSW file of earlier versions, superseded by this one
            path.with_suffix(".hnsw").unlink(missing_ok=True)

    def _save(self, space: _Space, embedder: str, dim: int) -> None:
        path = self.index_path(embedder, dim)
        if path is None or space.index is None:
            return
        space.index.state = [self._mirror_state[0], str(self._mirror_state[1])] if self._mirror_state else []
        try:
            space.index.save(path)
        except OSError as exc:  # the index is a cache: searches go on from memory, the next process rebuilds
            logger.warning("could not write the memory index %s: %s", path, exc)
            return
        space.unsaved = 0

    def reindex(self) -> dict[str, Any]:
        """Rebuild every space's ANN index from the store (from any size) and write it; return what was built."""
        self._mirror, self._mirror_state = {}, self._table_state()
        built = []
        for embedder, dim in sorted(self.spaces()):
            space = self._load_space(embedder, dim, rebuild=True)
            self._mirror[(embedder, dim)] = space
            built.append({"embedder": embedder, "dim": dim, "memories": space.meta.height,
                          "path": str(self.index_path(embedder, dim)), "saved": space.unsaved == 0})
        return {"indexes": built, "index_threshold": self.index_threshold}

    def search(self, vector: np.ndarray, k: int, embedder: str, dim: int) -> list[Memory]:
        space = self._space(embedder, int(dim))
        meta = space.meta
        if k <= 0 or not meta.height:
            return []
        # Rows are unit-length (an embedder registered by a user may not normalize).
        query = _unit_rows(np.asarray(vector, dtype=np.float32)[None, :])[0]
        ids = meta["memory_id"]
        if space.index is not None:
            positions, found = space.index.search(query, k)
            top, sims = positions.tolist(), dict(zip(positions.tolist(), found.tolist()))
        else:
            scores = space.matrix @ query
            top = (np.argpartition(-scores, k - 1)[:k] if k < len(scores) else np.arange(len(scores))).tolist()
            sims = {i: float(scores[i]) for i in top}
        order = sorted(top, key=lambda i: (-round(sims[i], 6), ids[i]))  # ties by id, as SQL would
        memories = []
        for i in order:
            row = meta.row(i, named=True)
            memories.append(Memory(**{**row, "key_steps": list(row["key_steps"] or []), "similarity": sims[i]}))
        return memories

    def indexed(self, embedder: str, dim: int) -> bool:
        """Whether this space's searches go through the ANN index (loading the mirror if needed)."""
        return self._space(embedder, int(dim)).index is not None

    def spaces(self) -> set[tuple[str, int]]:
        """The stored spaces, read again only when the table's state changed (a retrieval asks every time)."""
        state = self._table_state()
        if self._spaces is None or self._spaces[0] != state:
            self._spaces = (state, frozenset(self.store.memory_spaces()))
        return set(self._spaces[1])

    def count(self) -> int:
        """Stored memories: the table state's row count (a writable store answers it without a scan)."""
        return int(self._table_state()[0])

    def clear(self) -> int:
        count = self.store.clear_memory()
        self._mirror, self._mirror_state, self._spaces = {}, None, None
        return count


@dataclass
class _Space:
    """One (embedder, dim) space in memory: metadata rows, and either their unit vectors or the index over them."""

    meta: pl.DataFrame
    matrix: np.ndarray | None
    index: Any = None  # IvfIndex once the space reaches the threshold (its positions = meta's rows)
    unsaved: int = 0  # rows in the index not yet in its file

    #: Chunks the metadata may gather (upserts append one each) before it is made contiguous again.
    MAX_CHUNKS = 32

    def __post_init__(self) -> None:
        # contiguous columns: a search reads its k rows by position, 2.5x slower across DuckDB's many chunks
        self.meta = self.meta.rechunk()

    def extend(self, meta: pl.DataFrame, rows: np.ndarray) -> None:
        self.meta = pl.concat([self.meta, meta])
        if self.meta.n_chunks() > self.MAX_CHUNKS:
            self.meta = self.meta.rechunk()
        if self.index is not None:
            self.index.add(rows, meta["memory_id"].to_list())
            self.unsaved += len(rows)
        else:
            self.matrix = np.concatenate([self.matrix, rows])


def _meta_table(memories: Sequence[Memory]) -> pa.Table:
    """The memory rows' columns but the vectors and ``created_at``, one pass over the memories."""
    columns = list(zip(*((m.memory_id, m.run_id, m.task_id, m.branch_index, m.task_text, list(m.key_steps),
                          m.final_answer, m.embedder, m.dim) for m in memories)))
    names = ["memory_id", "run_id", "task_id", "branch_index", "task_text", "key_steps", "final_answer",
             "embedder", "dim"]
    types = [pa.string(), pa.string(), pa.string(), pa.int32(), pa.string(), pa.list_(pa.string()), pa.string(),
             pa.string(), pa.int32()]
    return pa.table({name: pa.array(values, kind) for name, values, kind in zip(names, columns, types)})


def _with_vectors(meta: pa.Table, vectors: np.ndarray) -> pa.Table:
    """``meta`` plus ``embedding`` (a list view over one flat float32 buffer) and ``created_at``."""
    n, dim = vectors.shape
    offsets = pa.array(np.arange(0, (n + 1) * dim, dim, dtype=np.int64))
    rows = meta.append_column("embedding", pa.LargeListArray.from_arrays(offsets, pa.array(vectors.reshape(-1))))
    now = pa.scalar(utc_now(), pa.timestamp("us"))
    return rows.append_column("created_at", pa.repeat(now, n))


def _unit_rows(matrix: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (zero rows stay zero), float32."""
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return (matrix / np.where(norms > 0, norms, 1.0)).astype(np.float32, copy=False)


def new_rows(memories: Sequence[Memory], stored_ids: set[str]) -> list[int]:
    """Positions of the memories to insert: not stored yet, and the first of any repeated id."""
    keep, seen = [], set(stored_ids)
    for row, memory in enumerate(memories):
        if memory.memory_id not in seen:
            seen.add(memory.memory_id)
            keep.append(row)
    return keep


def format_as_system_prompt(memories: Sequence[Memory], max_chars: int = 400) -> str:
    """A deterministic system-prompt section describing retrieved memories (empty if none)."""
    if not memories:
        return ""
    lines = ["Notes from similar tasks solved before (most similar first); use them only if they apply:"]
    for number, memory in enumerate(memories, start=1):
        task = " ".join(memory.task_text.split())[:max_chars]
        answer = " ".join((memory.final_answer or "").split())[:max_chars]
        steps = " -> ".join(memory.key_steps) if memory.key_steps else "answered directly"
        lines.append(f"{number}. Task: {task}\n   Steps: {steps}\n   Answer: {answer}")
    return "\n".join(lines)


@dataclass
class UpsertReport:
    """What an upsert did."""

    stored: int = 0
    duplicates: int = 0
    discarded: int = 0
    reasons: dict[str, int] = field(default_factory=dict)


class RolloutMemoryStore:
    """Winners in, similar winners out.

    Args:
        backend: Where memories live.
        embedder: How task texts become vectors (its name and dim are stored).
        store: The run store, for discard counts (defaults to the backend's store, if it has one).
    """

    def __init__(self, backend: MemoryBackend, embedder: Embedder, store: Store | None = None):
        self.backend = backend
        self.embedder = embedder
        self.store = store or getattr(backend, "store", None)

    def _check_space(self) -> None:
        spaces = self.backend.spaces()
        mine = (self.embedder.name, self.embedder.dim)
        other = sorted(s for s in spaces if s != mine)
        if other:
            name, dim = other[0]
            raise ConfigError(f"the memory holds {name} embeddings (dim {dim}); this store embeds with "
                              f"{mine[0]} (dim {mine[1]}): use --embedder {name}, or clear the memory")

    @staticmethod
    def memory_id(task_id: str, final_answer: str | None) -> str:
        """Same task and same (whitespace-normalized) final answer: the same memory."""
        return content_hash([task_id, " ".join((final_answer or "").split())])

    def upsert(self, candidates: Sequence[MemoryCandidate]) -> UpsertReport:
        """Store the clean winners among ``candidates``; count the rest."""
        self._check_space()
        report = UpsertReport()
        winners: list[Memory] = []
        seen: set[str] = set()
        discards = []
        for c in candidates:
            reason = None
            if c.infra_error:
                reason = "infra_error"
            elif c.hack_detected:
                reason = "hack_detected"
            elif c.hack_suspected:
                reason = "hack_suspected"
            elif c.objective_score is None or c.objective_score < 1.0 - 1e-9:
                reason = "not_a_win"
            if reason:
                discards.append({"run_id": c.run_id, "task_id": c.task_id, "branch_index": c.branch_index,
                                 "reason": reason})
                report.reasons[reason] = report.reasons.get(reason, 0) + 1
                continue
            memory_id = self.memory_id(c.task_id, c.final_answer)
            if memory_id in seen:
                report.duplicates += 1
                continue
            seen.add(memory_id)
            winners.append(Memory(memory_id, c.run_id, c.task_id, c.branch_index, c.task_text, list(c.key_steps),
                                  c.final_answer, self.embedder.name, self.embedder.dim))
        existing = self.backend.existing_ids([m.memory_id for m in winners])
        report.duplicates += len(existing)
        fresh = [m for m in winners if m.memory_id not in existing]
        if fresh:
            vectors = self.embedder.embed([m.task_text for m in fresh])
            report.stored = self.backend.add(fresh, vectors)
        report.discarded = len(discards)
        if discards and self.store is not None:
            self.store.write_memory_discards(discards)
        return report

    def retrieve(self, task_text: str, k: int = 3) -> list[Memory]:
        """The k stored winners most similar to ``task_text``."""
        if k <= 0 or self.backend.count() == 0:
            return []
        self._check_space()
        vector = self.embedder.embed([task_text])[0]
        return self.backend.search(vector, k, self.embedder.name, self.embedder.dim)

    def prime(self, task_text: str, k: int) -> str:
        """The system-prompt section of the k winners most similar to ``task_text`` (a ``BranchPrimer``)."""
        return format_as_system_prompt(self.retrieve(task_text, k))

    def describe(self) -> dict[str, Any]:
        """Embedder, backend and size at the start of a run (a ``BranchPrimer``); a resume reopens the same."""
        return {"embedder": self.embedder.name, "dim": self.embedder.dim,
                "backend": getattr(self.backend, "spec", type(self.backend).__name__),
                "memories_at_start": self.backend.count()}

    def stats(self) -> dict[str, Any]:
        """Counts: memories, discards by reason, embedders."""
        discards: dict[str, int] = {}
        if self.store is not None:
            discards = self.store.memory_discard_counts()
        return {"memories": self.backend.count(), "discarded": sum(discards.values()), "discards": discards,
                "embedders": sorted(f"{name} (dim {dim})" for name, dim in self.backend.spaces())}


def candidates_from_run(store: Store, run_id: str) -> list[MemoryCandidate]:
    """Every branch of a run as a memory candidate (objective score and hacks from its latest verdicts)."""
    from factory.ranking import load_records

    records = {(r.task_id, r.branch_index): r for r in load_records(store, run_id)}
    prompts = {row["task_id"]: row["prompt"] for row in store.tasks(run_id).iter_rows(named=True)}
    out = []
    for row in store.branches(run_id).iter_rows(named=True):
        record = records.get((row["task_id"], row["branch_index"]))
        steps = [call["name"] for call in json.loads(row["tool_call_sequence"] or "[]")]
        verified = record is not None and record.objective_pass is not None
        out.append(MemoryCandidate(run_id, row["task_id"], row["branch_index"], prompts.get(row["task_id"], ""),
                                   row["final_answer"], steps, record.objective_score if verified else None,
                                   bool(record and record.hack_detected),
                                   hack_suspected=bool(record and record.hack_suspected),
                                   infra_error=record is None))
    return out
