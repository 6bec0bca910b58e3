"""The DuckDB memory backend's ANN index (faiss IVF, the ``memory-ann`` extra): recall, persistence, staleness."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("faiss", reason="faiss is optional: pip install 'factory-rlaif[memory-ann]'")

from click.testing import CliRunner  # noqa: E402

from factory.memory import DuckDBMemoryBackend, Memory  # noqa: E402
from factory.memory._ann import IvfIndex  # noqa: E402
from factory.store import Store  # noqa: E402

DIM = 32
SPACE = ("random", DIM)


def unit(rng: np.random.Generator, n: int) -> np.ndarray:
    rows = rng.standard_normal((n, DIM)).astype(np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def clustered(rng: np.random.Generator, n: int, centres: np.ndarray) -> np.ndarray:
    """Unit rows near random centres (a centre plus noise of the same norm): structure as real embeddings have."""
    rows = centres[rng.integers(0, len(centres), n)] + unit(rng, n)
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def memories(start: int, n: int) -> list[Memory]:
    return [Memory(f"m{i:06d}", "r", f"t{i}", 0, f"text {i}", [], None, *SPACE) for i in range(start, start + n)]


def exact_top(vectors: np.ndarray, query: np.ndarray, k: int) -> list[str]:
    sims = vectors @ query
    return [f"m{i:06d}" for i in np.argsort(-sims, kind="stable")[:k]]


def ids(found: list[Memory]) -> list[str]:
    return [m.memory_id for m in found]


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(7)
    return unit(rng, 5_000), unit(rng, 20)


def test_ivf_recall_against_exact_search_and_reload_answers_identically(tmp_path):
    rng = np.random.default_rng(11)
    centres = unit(rng, 50)
    vectors, queries = clustered(rng, 5_000, centres), clustered(rng, 20, centres)
    with Store.open(tmp_path / "m.duckdb") as store:
        backend = DuckDBMemoryBackend(store, index_threshold=1_000)
        backend.add(memories(0, len(vectors)), vectors)
        assert backend.indexed(*SPACE)
        first = [ids(backend.search(q, 10, *SPACE)) for q in queries]
        hits = [len(set(found) & set(exact_top(vectors, q, 10))) / 10 for found, q in zip(first, queries)]
        assert np.mean(hits) >= 0.95  # the default nprobe on data with cluster structure
        # similarities are exact inner products even when found approximately
        top = backend.search(queries[0], 3, *SPACE)
        assert [m.similarity for m in top] == pytest.approx(
            [float(vectors[int(m.memory_id[1:])] @ queries[0]) for m in top], abs=1e-5)
        path = backend.index_path(*SPACE)
        assert path.exists() and path.parent == store.path.parent
        written = path.stat().st_mtime_ns
        # a new process (a new backend) loads the file instead of rebuilding, and answers the same
        again = DuckDBMemoryBackend(store, index_threshold=1_000)
        assert [ids(again.search(q, 10, *SPACE)) for q in queries] == first
        assert path.stat().st_mtime_ns == written
        assert not list(tmp_path.glob(".*.tmp"))  # the atomic write left nothing staged


def test_probing_every_list_is_exact_and_fewer_lists_trade_recall_on_uniform_data(data):
    vectors, queries = data
    index = IvfIndex.build(*SPACE, vectors, [f"m{i:06d}" for i in range(len(vectors))], nprobe=4)

    def recall() -> float:
        found = [[index.ids[p] for p in index.search(q, 10)[0]] for q in queries]
        return float(np.mean([len(set(f) & set(exact_top(vectors, q, 10))) / 10 for f, q in zip(found, queries)]))

    few = recall()
    index.nprobe = index.nlist
    assert recall() == 1.0 and few < 1.0
    assert len(index) == len(vectors) and not index.outgrown() and index.outgrown(3 * len(vectors) + 1)


def test_below_the_threshold_results_equal_exact_search(tmp_path, data):
    vectors, queries = data
    with Store.open(tmp_path / "m.duckdb") as store:
        backend = DuckDBMemoryBackend(store, index_threshold=len(vectors) + 1)
        backend.add(memories(0, len(vectors)), vectors)
        assert not backend.indexed(*SPACE)
        for q in queries[:10]:
            found = backend.search(q, 10, *SPACE)
            assert ids(found) == exact_top(vectors, q, 10)
        assert not backend.index_path(*SPACE).exists()


def test_upserts_are_searchable_without_a_rebuild_and_a_stale_index_is_rebuilt(tmp_path, data):
    vectors, _ = data
    rng = np.random.default_rng(3)
    with Store.open(tmp_path / "m.duckdb") as store:
        backend = DuckDBMemoryBackend(store, index_threshold=500)
        backend.add(memories(0, 1_000), vectors[:1_000])
        backend.search(vectors[0], 1, *SPACE)  # loads the mirror, builds and writes the index
        index = backend._mirror[SPACE].index
        # an upsert goes into the same graph: found at once, nothing rebuilt
        extra = unit(rng, 1)
        backend.add(memories(9_000, 1), extra)
        assert backend._mirror[SPACE].index is index and len(index) == 1_001
        assert ids(backend.search(extra[0], 1, *SPACE)) == ["m009000"]

        # rows another writer added are inserted into the loaded file's graph, not rebuilt from scratch
        DuckDBMemoryBackend(store).add(memories(1_000, 200), vectors[1_000:1_200])
        assert ids(backend.search(vectors[1_150], 1, *SPACE)) == ["m001150"]

        # the store changed behind the file: cleared and refilled with other memories under other ids
        path = backend.index_path(*SPACE)
        saved = IvfIndex.load(path, *SPACE)
        assert saved is not None
        store.clear_memory()
        fresh = [Memory(f"n{i:06d}", "r", f"t{i}", 0, f"text {i}", [], None, *SPACE) for i in range(800)]
        DuckDBMemoryBackend(store).add(fresh, vectors[3_000:3_800])
        reopened = DuckDBMemoryBackend(store, index_threshold=500)
        assert ids(reopened.search(vectors[3_100], 1, *SPACE)) == ["n000100"]
        rebuilt = IvfIndex.load(path, *SPACE)
        assert rebuilt is not None and rebuilt.ids[0] == "n000000" and len(rebuilt) == 800

        # a torn file is treated as absent and rebuilt
        path.write_bytes(path.read_bytes()[:1_000])
        assert IvfIndex.load(path, *SPACE) is None
        assert ids(DuckDBMemoryBackend(store, index_threshold=500).search(vectors[3_100], 1, *SPACE)) == ["n000100"]
        assert IvfIndex.load(path, *SPACE) is not None


def test_an_index_grown_past_its_training_is_retrained(tmp_path, data):
    from factory.memory._ann import RETRAIN_GROWTH

    vectors, _ = data
    with Store.open(tmp_path / "m.duckdb") as store:
        backend = DuckDBMemoryBackend(store, index_threshold=200)
        backend.add(memories(0, 200), vectors[:200])
        assert backend.indexed(*SPACE) and backend._mirror[SPACE].index.trained_rows == 200
        grown = int(RETRAIN_GROWTH * 200)
        backend.add(memories(200, grown), vectors[200:200 + grown])  # past RETRAIN_GROWTH x 200 rows: rebuilt
        index = backend._mirror[SPACE].index
        assert index.trained_rows == len(index) == 200 + grown and index.nlist > 1
        assert ids(backend.search(vectors[250], 1, *SPACE)) == ["m000250"]
        assert IvfIndex.load(backend.index_path(*SPACE), *SPACE).trained_rows == 200 + grown


def test_memory_reindex_command_rebuilds_the_index_file(tmp_path, data):
    from factory.cli import main as cli

    vectors, _ = data
    db = tmp_path / "m.duckdb"
    with Store.open(db) as store:
        DuckDBMemoryBackend(store).add(memories(0, 300), vectors[:300])
        path = DuckDBMemoryBackend(store).index_path(*SPACE)
    result = CliRunner().invoke(cli, ["memory", "reindex", "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert "300 memories" in result.output and path.exists()
    assert IvfIndex.load(path, *SPACE).ids == [f"m{i:06d}" for i in range(300)]


def test_a_bulk_load_is_one_transaction_and_restores_the_memory_limit_and_compression(tmp_path, data):
    from factory.memory._store import _meta_table, _with_vectors

    vectors, _ = data
    with Store.open(tmp_path / "m.duckdb") as store:
        limit = store.query("SELECT current_setting('memory_limit') AS m")["m"][0]
        rows = _with_vectors(_meta_table(memories(0, 250)), vectors[:250])
        assert store.write_memories(rows, new_only=True, bulk_rows=100) == 250
        assert store.memory_count() == 250
        assert store.query("SELECT current_setting('memory_limit') AS m")["m"][0] == limit
        assert store.query("SELECT current_setting('force_compression') AS c")["c"][0] in ("", "auto")
        backend = DuckDBMemoryBackend(store)
        assert ids(backend.search(vectors[123], 1, *SPACE)) == ["m000123"]


class CountingStore:
    """The real store, counting the vectors it streams and the scans for spaces (a spy, not a fake)."""

    def __init__(self, store: Store):
        self.store, self.vectors_read, self.space_scans = store, 0, 0

    def __getattr__(self, name):
        return getattr(self.store, name)

    def memory_vectors(self, *args, **kwargs):
        sent = self.store.memory_vectors(*args, **kwargs)
        self.vectors_read += sent
        return sent

    def memory_spaces(self):
        self.space_scans += 1
        return self.store.memory_spaces()


def test_a_new_process_with_a_current_index_reads_only_the_vectors_the_file_lacks(tmp_path, data):
    vectors, queries = data
    with Store.open(tmp_path / "m.duckdb") as store:
        first = DuckDBMemoryBackend(store, index_threshold=500)
        first.add(memories(0, 1_000), vectors[:1_000])
        assert first.indexed(*SPACE)  # the first search builds and writes the index
        path = first.index_path(*SPACE)
        assert IvfIndex.load(path, *SPACE).ids == [f"m{i:06d}" for i in range(1_000)]
        expected = [ids(first.search(q, 10, *SPACE)) for q in queries[:5]]

        spy = CountingStore(store)
        again = DuckDBMemoryBackend(spy, index_threshold=500)
        assert [ids(again.search(q, 10, *SPACE)) for q in queries[:5]] == expected
        assert spy.vectors_read == 0  # the file holds every row: no vector read from the store

        # 20 rows newer than the file (under save_fraction: the file is not rewritten): only they are read
        DuckDBMemoryBackend(store, index_threshold=500).add(memories(1_000, 20), vectors[1_000:1_020])
        spy = CountingStore(store)
        later = DuckDBMemoryBackend(spy, index_threshold=500)
        assert ids(later.search(vectors[1_010], 1, *SPACE)) == ["m001010"]
        assert spy.vectors_read == 20 and len(later._mirror[SPACE].index) == 1_020
        assert "embedding" not in later._mirror[SPACE].meta.columns

        # reindex reads every vector once, in batches, and writes the same ids
        spy = CountingStore(store)
        DuckDBMemoryBackend(spy, index_threshold=500).reindex()
        assert spy.vectors_read == 1_020 and len(IvfIndex.load(path, *SPACE)) == 1_020


def test_vectors_stream_in_bounded_batches_matched_by_rowid_under_the_cap(tmp_path, data):
    vectors, _ = data
    with Store.open(tmp_path / "m.duckdb") as store:
        DuckDBMemoryBackend(store).add(memories(0, 250), vectors[:250])
        limit = store.query("SELECT current_setting('memory_limit') AS m")["m"][0]
        meta = store.memory_space_meta(*SPACE)
        assert "embedding" not in meta.columns and meta["memory_id"].to_list() == [f"m{i:06d}" for i in range(250)]
        by_row = dict(zip(meta["_row"].to_list(), meta["memory_id"].to_list()))
        batches = []

        def sink(rowids, values):
            batches.append((rowids.to_pylist(), values.to_numpy().reshape(-1, DIM)))

        assert store.memory_vectors(*SPACE, sink, batch_rows=100) == 250
        assert max(len(rows) for rows, _ in batches) <= 100 and len(batches) >= 3
        for rows, block in batches:
            for row, vector in zip(rows, block):
                assert np.allclose(vector, vectors[int(by_row[row][1:])])
        # from a rowid on: the rows below it are not sent
        assert store.memory_vectors(*SPACE, lambda *_: None, from_row=sorted(by_row)[200]) == 50
        assert store.query("SELECT current_setting('memory_limit') AS m")["m"][0] == limit


def test_retrieval_answers_spaces_and_count_from_the_known_state_and_sees_other_writers(tmp_path):
    from factory.errors import ConfigError
    from factory.memory import HashingEmbedder, MemoryCandidate, RolloutMemoryStore

    with Store.open(tmp_path / "m.duckdb") as store:
        spy = CountingStore(store)
        memory = RolloutMemoryStore(DuckDBMemoryBackend(spy), HashingEmbedder())
        memory.upsert([MemoryCandidate("r", f"t{i}", 0, f"task number {i}", "ok", [], 1.0, False) for i in range(5)])
        scans = spy.space_scans
        for _ in range(5):
            assert len(memory.retrieve("task number 3", k=2)) == 2
        assert spy.space_scans <= scans + 1  # read once after the upsert, then answered from the known state
        assert memory.backend.count() == 5
        # another writer (another backend on the store) adds a space: the next retrieval sees it
        DuckDBMemoryBackend(store).add(memories(0, 1), unit(np.random.default_rng(1), 1))
        assert memory.backend.count() == 6
        with pytest.raises(ConfigError, match="random"):
            memory.retrieve("task number 3", k=2)


def test_memory_caps_nest_a_bulk_load_inside_a_capped_block_restores_the_outer_cap(tmp_path, data):
    from factory.memory._store import _meta_table, _with_vectors

    vectors, _ = data

    def limit(store):
        return store.query("SELECT current_setting('memory_limit') AS m")["m"][0]

    with Store.open(tmp_path / "m.duckdb") as store:
        default = limit(store)
        with store.memory_capped("300MB"):
            outer = limit(store)
            assert outer != default
            rows = _with_vectors(_meta_table(memories(0, 250)), vectors[:250])
            assert store.write_memories(rows, new_only=True, bulk_rows=100) == 250
            assert limit(store) == outer  # the bulk load's own cap did not lift the outer one
            with store.memory_capped("200MB"):
                assert limit(store) not in (outer, default)
            assert limit(store) == outer
        assert limit(store) == default
