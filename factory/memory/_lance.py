"""``LanceMemoryBackend``: memories in an embedded LanceDB table, for memories past a few million entries.

The default :class:`~factory.memory.DuckDBMemoryBackend` scans every stored
vector on each retrieval, which is fine up to a few hundred thousand
memories. This backend keeps them in a LanceDB table in a local directory
(embedded: no server) and, once the table holds ``index_threshold`` rows,
builds an approximate nearest-neighbour index on the vectors:

- below the threshold every search is exact (a flat scan, cosine distance);
- at the threshold an ``IVF_SQ`` index (cosine: inverted-file partitions of
  8-bit scalar-quantized vectors) is trained on the rows stored, together
  with a B-tree index on ``memory_id`` for the duplicate checks; rows added
  afterwards are still found (LanceDB scans the
  not-yet-indexed rows exactly and merges them in), and once they exceed
  ``reindex_fraction`` of the indexed rows ``optimize()`` folds them into the
  index.

An index trades exactness for speed: a search probes ``nprobes`` of the
index's partitions and re-ranks ``refine_factor`` x k candidates on their
full vectors (so the similarities returned are exact). On real embeddings,
which cluster, the nearest entries are almost always in those partitions; on
structureless data (uniformly random vectors) recall falls towards the
share of the data probed.

``IVF_SQ`` rather than HNSW or PQ: on a 2-core machine it trains on
1,000,000 x 384 vectors in about 10 s, where ``IVF_PQ`` took 90 s on 100,000
and ``IVF_HNSW_SQ`` did not finish on 1,000,000 in 15 minutes (see
``bench/bench_memory.py``).

The table holds one vector width (fixed at its first write, as a
``FixedSizeList<float32>``); a side table ``<table>_spaces`` lists the
(embedder, dim) pairs stored, so :meth:`LanceMemoryBackend.spaces` never
scans the memories. :meth:`LanceMemoryBackend.clear` drops both tables, so
a cleared memory can take another embedder.

LanceDB is an optional dependency (``pip install 'factory-rlaif[memory-ann]'``),
imported when the backend is created.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from factory.errors import ConfigError
from factory.memory._store import Memory, new_rows
from factory.store import utc_now

__all__ = ["LanceMemoryBackend"]

_INSTALL = "pip install 'factory-rlaif[memory-ann]'"
# Past this many ids, a duplicate check reads the whole memory_id column once
# instead of sending the ids as an IN (...) filter.
_IN_LIST_MAX = 1_000
_RESULT_COLUMNS = ["memory_id", "run_id", "task_id", "branch_index", "task_text", "key_steps", "final_answer",
                   "embedder", "dim", "_distance"]


def _schema(dim: int) -> pa.Schema:
    return pa.schema([
        pa.field("memory_id", pa.string(), nullable=False),
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("branch_index", pa.int32(), nullable=False),
        pa.field("task_text", pa.string(), nullable=False),
        pa.field("key_steps", pa.list_(pa.string())),
        pa.field("final_answer", pa.string()),
        pa.field("embedder", pa.string(), nullable=False),
        pa.field("dim", pa.int32(), nullable=False),
        pa.field("vector", pa.list_(pa.float32(), dim), nullable=False),
        pa.field("created_at", pa.timestamp("us"), nullable=False),
    ])


_SPACES_SCHEMA = pa.schema([pa.field("embedder", pa.string(), nullable=False),
                            pa.field("dim", pa.int32(), nullable=False)])


def _sql_text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


class LanceMemoryBackend:
    """Memories in a LanceDB table in a local directory; exact search, then ANN past a size threshold.

    Implements :class:`~factory.memory.MemoryBackend`. One backend object
    should do a process's writes (LanceDB sees the writes made through the
    same table handle at once; other writers' after a reopen).

    Args:
        path: The LanceDB directory (created if missing).
        table: The memories table's name (its spaces live in ``<table>_spaces``).
        index_threshold: Rows at which the ANN index is built; searches are
            exact below it.
        nprobes: Index partitions probed per search once indexed (more: higher
            recall, slower).
        refine_factor: Once indexed, re-rank ``refine_factor * k`` candidates
            on their full vectors.
        reindex_fraction: Fold rows added since the index was built into it
            once they exceed this fraction of the indexed rows.

    Raises:
        ConfigError: lancedb is not installed.
    """

    def __init__(self, path: str | Path, table: str = "memories", *, index_threshold: int = 100_000,
                 nprobes: int = 50, refine_factor: int = 5, reindex_fraction: float = 0.1):
        try:
            import lancedb
        except ImportError:
            raise ConfigError(f"the LanceDB memory backend needs lancedb: {_INSTALL}") from None
        self.path = Path(path)
        self.spec = f"lance:{self.path}"
        self.table_name = table
        self.index_threshold = int(index_threshold)
        self.nprobes = int(nprobes)
        self.refine_factor = int(refine_factor)
        self.reindex_fraction = float(reindex_fraction)
        self._lock = threading.RLock()
        self._db = lancedb.connect(str(self.path))
        self._table: Any = self._open(table)
        self._spaces_table: Any = self._open(f"{table}_spaces")

    def _open(self, name: str) -> Any:
        try:
            return self._db.open_table(name)
        except (ValueError, FileNotFoundError):  # lancedb: "Table '...' was not found"
            return None

    def _dim(self) -> int | None:
        if self._table is None:
            return None
        return int(self._table.schema.field("vector").type.list_size)

    # ---------------------------------------------------------------- writes

    def add(self, memories: Sequence[Memory], vectors: np.ndarray) -> int:
        """Insert memories whose id is new; return how many were inserted.

        Raises:
            ConfigError: The vectors' width differs from the table's (clear the memory to change embedder).
        """
        if not memories:
            return 0
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[0] != len(memories):
            raise ValueError(f"expected {len(memories)} vectors, got an array of shape {vectors.shape}")
        dim = int(vectors.shape[1])
        with self._lock:
            stored_dim = self._dim()
            if stored_dim is not None and stored_dim != dim:
                raise ConfigError(f"the LanceDB memory at {self.path} holds dim {stored_dim} vectors, not {dim}: "
                                  "use the embedder it was built with, or clear the memory")
            keep = new_rows(memories, self.existing_ids([m.memory_id for m in memories]))
            if not keep:
                return 0
            rows = self._arrow([memories[i] for i in keep], vectors[keep], dim)
            if self._table is None:
                self._table = self._db.create_table(self.table_name, schema=_schema(dim))
            self._record_spaces({(m.embedder, int(m.dim)) for m in (memories[i] for i in keep)})
            self._table.add(rows)
            self.optimize()
            return len(keep)

    @staticmethod
    def _arrow(memories: Sequence[Memory], vectors: np.ndarray, dim: int) -> pa.Table:
        now = utc_now()
        return pa.Table.from_arrays([
            pa.array([m.memory_id for m in memories], pa.string()),
            pa.array([m.run_id for m in memories], pa.string()),
            pa.array([m.task_id for m in memories], pa.string()),
            pa.array([m.branch_index for m in memories], pa.int32()),
            pa.array([m.task_text for m in memories], pa.string()),
            pa.array([list(m.key_steps) for m in memories], pa.list_(pa.string())),
            pa.array([m.final_answer for m in memories], pa.string()),
            pa.array([m.embedder for m in memories], pa.string()),
            pa.array([m.dim for m in memories], pa.int32()),
            pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1), pa.float32()), dim),
            pa.array([now] * len(memories), pa.timestamp("us")),
        ], schema=_schema(dim))

    def _record_spaces(self, spaces: set[tuple[str, int]]) -> None:
        # Written before the memories: the side table may list a space whose rows a crash lost, never the reverse.
        new = sorted(spaces - self.spaces())
        if not new:
            return
        rows = pa.Table.from_arrays([pa.array([e for e, _ in new], pa.string()),
                                     pa.array([d for _, d in new], pa.int32())], schema=_SPACES_SCHEMA)
        if self._spaces_table is None:
            self._spaces_table = self._db.create_table(f"{self.table_name}_spaces", schema=_SPACES_SCHEMA)
        self._spaces_table.add(rows)

    def optimize(self) -> None:
        """Build the ANN index once the table holds ``index_threshold`` rows, or fold newer rows into it.

        :meth:`add` calls this after every write; call it after raising or
        lowering ``index_threshold`` on a loaded table.
        """
        with self._lock:
            if self._table is None or self._table.count_rows() < self.index_threshold:
                return
            stats = self._table.index_stats("vector_idx")
            if stats is None:
                from lancedb.index import BTree, IvfSq

                self._table.create_index("vector", config=IvfSq(distance_type="cosine"), name="vector_idx")
                self._table.create_index("memory_id", config=BTree(), name="memory_id_idx")
            elif stats.num_unindexed_rows > self.reindex_fraction * max(stats.num_indexed_rows, 1):
                self._table.optimize()

    def clear(self) -> int:
        """Drop every memory (and the spaces list); return how many there were."""
        with self._lock:
            count = self.count()
            for name in (self.table_name, f"{self.table_name}_spaces"):
                self._db.drop_table(name, ignore_missing=True)
            self._table = self._spaces_table = None
            return count

    # ----------------------------------------------------------------- reads

    def existing_ids(self, memory_ids: Sequence[str]) -> set[str]:
        """Which of these ids are stored."""
        wanted = list(dict.fromkeys(memory_ids))
        if not wanted or self._table is None:
            return set()
        if len(wanted) > _IN_LIST_MAX:
            column = self._table.search().select(["memory_id"]).limit(None).to_arrow()["memory_id"]
            return set(pc.filter(column, pc.is_in(column, value_set=pa.array(wanted, pa.string()))).to_pylist())
        found = self._table.search().where(f"memory_id IN ({', '.join(_sql_text(i) for i in wanted)})") \
            .select(["memory_id"]).limit(None).to_arrow()
        return set(found["memory_id"].to_pylist())

    def search(self, vector: np.ndarray, k: int, embedder: str, dim: int) -> list[Memory]:
        """The k most cosine-similar memories of this embedder, most similar first."""
        if k <= 0 or self._table is None or self._dim() != int(dim):
            return []
        spaces = self.spaces()
        if (embedder, int(dim)) not in spaces:
            return []
        query = self._table.search(np.asarray(vector, dtype=np.float32), vector_column_name="vector") \
            .distance_type("cosine").limit(int(k)).nprobes(self.nprobes).refine_factor(self.refine_factor)
        if len(spaces) > 1:  # one space: every row matches, so skip the filter scan
            query = query.where(f"embedder = {_sql_text(embedder)} AND dim = {int(dim)}", prefilter=True)
        rows = query.select(_RESULT_COLUMNS).to_arrow().to_pylist()
        memories = [Memory(memory_id=r["memory_id"], run_id=r["run_id"], task_id=r["task_id"],
                           branch_index=int(r["branch_index"]), task_text=r["task_text"],
                           key_steps=list(r["key_steps"] or []), final_answer=r["final_answer"],
                           embedder=r["embedder"], dim=int(r["dim"]), similarity=1.0 - float(r["_distance"]))
                    for r in rows]
        return sorted(memories, key=lambda m: (-(m.similarity or 0.0), m.memory_id))

    def spaces(self) -> set[tuple[str, int]]:
        """The (embedder, dim) pairs stored."""
        if self._spaces_table is None or self._table is None:
            return set()
        rows = self._spaces_table.search().select(["embedder", "dim"]).limit(None).to_arrow().to_pylist()
        return {(r["embedder"], int(r["dim"])) for r in rows}

    def count(self) -> int:
        """Stored memories."""
        return 0 if self._table is None else int(self._table.count_rows())

    def indexed(self) -> bool:
        """Whether the ANN index has been built (searches are exact until then)."""
        return self._table is not None and self._table.index_stats("vector_idx") is not None
