"""``HnswIndex``: a faiss HNSW graph over one memory space's unit vectors, persisted in one file beside the store.

Why HNSW (faiss ``IndexHNSWFlat``, inner product on unit rows = cosine):
an inverted-file index (LanceDB's ``IVF_SQ``) finds a query's neighbours only
in the partitions it probes, so on structureless data its recall falls to the
share of the data probed (0.64 at 1,000,000 in ``bench/bench_memory.py``);
a graph walk does not depend on cluster structure, is updated in place by
``add`` (no retraining), and returns exact inner products, so the
similarities reported are exact whatever the recall.

The file holds a JSON header (format, embedder, dim, HNSW settings, the
store's memory state when written, the row count and a sha256 of the ids),
the memory ids in index order (position ``i`` of the graph is ``ids[i]``),
then faiss's own serialization of the graph. It is written to a temporary
file in the same folder and renamed over the old one, so a reader sees the
old index or the new one, never a torn write. The header's hash is checked
on load; a file that does not parse, or whose embedder, dim or ids do not
match, is treated as absent (the caller rebuilds it).

faiss is an optional dependency (``pip install 'factory-rlaif[memory-ann]'``),
imported when an index is first built or loaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from factory.errors import ConfigError

__all__ = ["HnswIndex", "ids_digest"]

_MAGIC = b"FACTORY-HNSW-1\n\0"
#: Inserts of fewer rows run on one thread.
_PARALLEL_ROWS = 50_000
_INSTALL = "pip install 'factory-rlaif[memory-ann]'"


def _faiss() -> Any:
    try:
        import faiss
    except ImportError:
        raise ConfigError(f"an ANN memory index needs faiss: {_INSTALL}") from None
    return faiss


def ids_digest(ids: Sequence[str]) -> str:
    """sha256 of the ids in order (newline-joined UTF-8)."""
    return hashlib.sha256("\n".join(ids).encode("utf-8")).hexdigest()


class HnswIndex:
    """An HNSW graph over unit-length float32 rows, with the memory id of each position.

    Args:
        embedder: The space's embedder name (recorded, checked on load).
        dim: Vector width.
        m: Graph degree (links per node; 2m on the bottom layer). More: higher
            recall at a given ``ef_search``, slower builds, more memory.
        ef_construction: Candidate list while inserting (build quality).
        ef_search: Candidate list while searching (at least ``k``); the
            recall/latency knob.
    """

    def __init__(self, embedder: str, dim: int, *, m: int = 32, ef_construction: int = 80, ef_search: int = 256):
        faiss = _faiss()
        self.embedder = embedder
        self.dim = int(dim)
        self.m = int(m)
        self.ef_construction = int(ef_construction)
        self.ef_search = int(ef_search)
        self.ids: list[str] = []
        self.state: list[Any] = []  # the store's memory state the rows reflect (JSON-able)
        self._index = faiss.IndexHNSWFlat(self.dim, self.m, faiss.METRIC_INNER_PRODUCT)
        self._index.hnsw.efConstruction = self.ef_construction

    def __len__(self) -> int:
        return len(self.ids)

    def add(self, vectors: np.ndarray, ids: Sequence[str]) -> None:
        """Insert unit rows with their memory ids (appended: positions ``len(self)`` onwards)."""
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if vectors.shape != (len(ids), self.dim):
            raise ValueError(f"expected {len(ids)} x {self.dim} vectors, got {vectors.shape}")
        if not len(ids):
            return
        faiss = _faiss()
        threads = faiss.omp_get_max_threads()
        # OpenMP's spinning workers cost more than they bring on a small insert (an upsert batch), and several
        # times more on a busy machine; a build of many rows uses every thread.
        if len(ids) < _PARALLEL_ROWS:
            faiss.omp_set_num_threads(1)
        try:
            self._index.add(vectors)
        finally:
            faiss.omp_set_num_threads(threads)
        self.ids.extend(ids)

    def search(self, vector: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Positions and inner products of (about) the ``k`` nearest rows, best first (``-1`` pads a short result)."""
        faiss = _faiss()
        params = faiss.SearchParametersHNSW()
        params.efSearch = max(self.ef_search, int(k))
        sims, positions = self._index.search(np.asarray(vector, dtype=np.float32).reshape(1, -1), int(k),
                                             params=params)
        keep = positions[0] >= 0
        return positions[0][keep], sims[0][keep]

    # ------------------------------------------------------------ persistence

    def header(self) -> dict[str, Any]:
        return {"format": 1, "kind": "faiss.IndexHNSWFlat/ip", "embedder": self.embedder, "dim": self.dim,
                "m": self.m, "ef_construction": self.ef_construction, "count": len(self.ids),
                "ids_sha256": ids_digest(self.ids), "state": self.state}

    def save(self, path: Path) -> None:
        """Write the index to ``path`` atomically (a temporary file in the same folder, renamed onto it).

        Raises:
            OSError: The folder is not writable or the disk is full (the old file, if any, is unchanged).
        """
        faiss = _faiss()
        path = Path(path)
        header = json.dumps(self.header(), sort_keys=True).encode("utf-8")
        ids = "\n".join(self.ids).encode("utf-8")
        handle, staged = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(_MAGIC + struct.pack("<QQ", len(header), len(ids)) + header + ids)
                faiss.write_index(self._index, faiss.PyCallbackIOWriter(out.write))
                out.flush()
                os.fsync(out.fileno())
            os.replace(staged, path)
        except BaseException:
            Path(staged).unlink(missing_ok=True)
            raise

    @classmethod
    def load(cls, path: Path, embedder: str, dim: int, *, ef_search: int = 256) -> HnswIndex | None:
        """The index at ``path``, or None when it is missing, unreadable, or built for another space."""
        faiss = _faiss()
        try:
            with open(path, "rb") as handle:
                if handle.read(len(_MAGIC)) != _MAGIC:
                    return None
                header_len, ids_len = struct.unpack("<QQ", handle.read(16))
                header = json.loads(handle.read(header_len))
                raw_ids = handle.read(ids_len).decode("utf-8")
                ids = raw_ids.split("\n") if raw_ids else []
                if (header.get("format") != 1 or header.get("embedder") != embedder
                        or header.get("dim") != int(dim) or header.get("count") != len(ids)
                        or header.get("ids_sha256") != ids_digest(ids)):
                    return None
                graph = faiss.read_index(faiss.PyCallbackIOReader(handle.read))
        except (OSError, ValueError, struct.error, RuntimeError, UnicodeDecodeError):
            return None  # missing, torn or foreign: the caller rebuilds
        if graph.ntotal != len(ids) or graph.d != int(dim):
            return None
        index = cls.__new__(cls)
        index.embedder, index.dim = embedder, int(dim)
        index.m, index.ef_construction = int(header["m"]), int(header["ef_construction"])
        index.ef_search = int(ef_search)
        index.ids, index.state = ids, list(header.get("state") or [])
        index._index = graph
        return index
