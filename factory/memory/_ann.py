"""``IvfIndex``: a faiss inverted-file index over one memory space's unit vectors, in one file beside the store.

Why an inverted file (faiss ``IndexIVFFlat``, inner product on unit rows =
cosine), and not an HNSW graph over every row (the previous index here),
usearch or an 8-bit/fp16 variant: measured with ``bench/bench_memory_ann.py``
on 2 shared cores, an HNSW graph of 1,000,000 384-dim rows did not finish
building in 19 minutes, and usearch's ``i8`` rows lose the ranking of unit
vectors (recall 0.56 at ``ef`` 512 on 50,000 rows). An inverted file is
trained on a sample (k-means, 10 rounds on at most 32 rows per list), so its
build is a k-means plus one assignment per row; an insert is one assignment
(no retraining), and the rows are stored as they are, so the similarities
reported are exact whatever the recall. The lists' centres are searched
exhaustively (a flat quantizer): assigning rows is then one matrix product
per batch, six times less CPU than walking an HNSW graph over the centres
(200,000 rows to 894 lists: 3.2 against 20.2 CPU seconds), and a query
scans 2,000 centres at 1,000,000 rows in a fraction of a millisecond. Its weakness is structureless data:
a query only sees the lists it probes (``nprobe``, the recall/latency knob),
so on uniform random directions recall grows with the share probed; on data
with cluster structure (real embeddings) a few lists hold the neighbours.

The file holds a JSON header (format, embedder, dim, list count, the rows it
was trained on, the store's memory state when written, the row count and a
sha256 of the ids), the memory ids in index order (position ``i`` is
``ids[i]``), then faiss's own serialization. It is written to a temporary
file in the same folder and renamed over the old one, so a reader sees the
old index or the new one, never a torn write. The header's hash is checked
on load; a file that does not parse, or whose format, embedder, dim or ids
do not match, is treated as absent (the caller rebuilds it).

faiss is an optional dependency (``pip install 'factory-rlaif[memory-ann]'``),
imported when an index is first built or loaded.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import struct
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from factory.errors import ConfigError

__all__ = ["RETRAIN_GROWTH", "IvfIndex", "ids_digest"]

_MAGIC = b"FACTORY-IVF-1\n\0\0"
_FORMAT = 2
#: Inserts of fewer rows run on one thread.
_PARALLEL_ROWS = 50_000
#: k-means: rounds, and the most training rows per list (a sample, drawn with a fixed seed).
_KMEANS_ROUNDS = 10
_ROWS_PER_LIST = 32
#: An index that has grown past this many times the rows it was trained on is rebuilt (its lists grew long).
RETRAIN_GROWTH = 4.0
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


@contextlib.contextmanager
def _threads(faiss: Any, rows: int) -> Iterator[None]:
    """One OpenMP thread for work on fewer than ``_PARALLEL_ROWS`` rows, every thread for more.

    OpenMP's spinning workers cost more than they bring on small work (an
    upsert batch, a small k-means), and several times more on a busy machine
    (a k-means of 4,500 rows: 0.8 s on one thread, 3.5 s on two at load 18).
    """
    threads = faiss.omp_get_max_threads()
    if rows < _PARALLEL_ROWS:
        faiss.omp_set_num_threads(1)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(threads)


def _lists_for(rows: int) -> int:
    """Inverted lists for ``rows`` rows: about 2 sqrt(n) (2,000 at 1M), and at least 32 training rows per list."""
    return max(1, min(int(2 * math.sqrt(rows)), rows // _ROWS_PER_LIST))


class IvfIndex:
    """An inverted-file index over unit-length float32 rows, with the memory id of each position.

    Built by :meth:`build` (k-means on a sample of the rows, then every row
    assigned to its nearest list); :meth:`add` appends rows to the lists
    without retraining.

    Args:
        embedder: The space's embedder name (recorded, checked on load).
        dim: Vector width.
        nprobe: Lists scanned per search: the recall/latency knob.
    """

    def __init__(self, embedder: str, dim: int, *, nprobe: int = 32):
        self.embedder = embedder
        self.dim = int(dim)
        self.nprobe = int(nprobe)
        self.nlist = 0
        self.trained_rows = 0
        self.ids: list[str] = []
        self.state: list[Any] = []  # the store's memory state the rows reflect (JSON-able)
        self._index: Any = None

    def __len__(self) -> int:
        return len(self.ids)

    @classmethod
    def build(cls, embedder: str, dim: int, vectors: np.ndarray, ids: Sequence[str], *, nprobe: int = 32,
              seed: int = 0) -> IvfIndex:
        """Train the lists on a seeded sample of ``vectors`` and insert them all."""
        faiss = _faiss()
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if not len(ids):
            raise ValueError("an index needs at least one row")
        index = cls(embedder, dim, nprobe=nprobe)
        index.nlist, index.trained_rows = _lists_for(len(ids)), len(ids)
        sample_size = min(len(ids), index.nlist * _ROWS_PER_LIST)
        sample = vectors if sample_size == len(ids) else vectors[
            np.sort(np.random.default_rng(seed).choice(len(ids), sample_size, replace=False))]
        kmeans = faiss.Clustering(index.dim, index.nlist)
        kmeans.niter, kmeans.seed, kmeans.spherical = _KMEANS_ROUNDS, seed + 1, True
        kmeans.max_points_per_centroid = _ROWS_PER_LIST
        kmeans.min_points_per_centroid = 1  # fewer rows than faiss's default minimum: no warning on stderr
        with _threads(faiss, len(sample)):
            kmeans.train(sample, faiss.IndexFlatIP(index.dim))
        quantizer = faiss.IndexFlatIP(index.dim)
        quantizer.add(faiss.vector_to_array(kmeans.centroids).reshape(index.nlist, index.dim))
        ivf = faiss.IndexIVFFlat(quantizer, index.dim, index.nlist, faiss.METRIC_INNER_PRODUCT)
        ivf.own_fields = True  # the IVF index frees its quantizer (as one read back from a file does)
        quantizer.this.disown()
        index._index = ivf
        index.add(vectors, ids)
        return index

    def add(self, vectors: np.ndarray, ids: Sequence[str]) -> None:
        """Insert unit rows with their memory ids (appended: positions ``len(self)`` onwards)."""
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if vectors.shape != (len(ids), self.dim):
            raise ValueError(f"expected {len(ids)} x {self.dim} vectors, got {vectors.shape}")
        if not len(ids):
            return
        faiss = _faiss()
        with _threads(faiss, len(ids)):
            self._index.add(vectors)
        self.ids.extend(ids)

    def outgrown(self, extra: int = 0) -> bool:
        """Whether the index (plus ``extra`` rows) holds over ``RETRAIN_GROWTH`` times the rows it was trained on."""
        return len(self.ids) + extra > RETRAIN_GROWTH * max(self.trained_rows, 1)

    def search(self, vector: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Positions and inner products of (about) the ``k`` nearest rows, best first (``-1`` pads a short result)."""
        faiss = _faiss()
        params = faiss.SearchParametersIVF()
        params.nprobe = max(1, min(self.nprobe, self.nlist))
        sims, positions = self._index.search(np.asarray(vector, dtype=np.float32).reshape(1, -1), int(k),
                                             params=params)
        keep = positions[0] >= 0
        return positions[0][keep], sims[0][keep]

    # ------------------------------------------------------------ persistence

    def header(self) -> dict[str, Any]:
        return {"format": _FORMAT, "kind": "faiss.IndexIVFFlat/ip", "embedder": self.embedder,
                "dim": self.dim, "nlist": self.nlist, "trained_rows": self.trained_rows, "count": len(self.ids),
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
    def load(cls, path: Path, embedder: str, dim: int, *, nprobe: int = 32) -> IvfIndex | None:
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
                if (header.get("format") != _FORMAT or header.get("embedder") != embedder
                        or header.get("dim") != int(dim) or header.get("count") != len(ids)
                        or header.get("ids_sha256") != ids_digest(ids)):
                    return None
                raw = faiss.read_index(faiss.PyCallbackIOReader(handle.read))
        except (OSError, ValueError, struct.error, RuntimeError, UnicodeDecodeError):
            return None  # missing, torn or foreign: the caller rebuilds
        if raw.ntotal != len(ids) or raw.d != int(dim):
            return None
        index = cls(embedder, dim, nprobe=nprobe)
        index.nlist, index.trained_rows = int(header["nlist"]), int(header["trained_rows"])
        index.ids, index.state = ids, list(header.get("state") or [])
        index._index = raw
        return index
