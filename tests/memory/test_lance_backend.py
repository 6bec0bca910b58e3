"""Every memory backend passes the same checks: DuckDB (the default) and LanceDB (the ``memory-ann`` extra)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("lancedb", reason="LanceDB is optional: pip install 'factory-rlaif[memory-ann]'")

from factory.errors import ConfigError  # noqa: E402
from factory.memory import (  # noqa: E402
    MEMORY_BACKENDS,
    DuckDBMemoryBackend,
    HashingEmbedder,
    LanceMemoryBackend,
    Memory,
    MemoryCandidate,
    RolloutMemoryStore,
    create_memory_backend,
)
from factory.store import Store  # noqa: E402


def candidate(task_id, text, answer, score=1.0, hack=False, index=0, run="r1"):
    return MemoryCandidate(run, task_id, index, text, answer, ["read_file", "write_file", "submit"], score, hack)


@pytest.fixture(params=MEMORY_BACKENDS.names())
def backend(request, tmp_path):
    """Every registered backend, built as ``--memory-backend NAME`` builds it (lance beside the store)."""
    store = Store.open(tmp_path / "m.duckdb")
    yield create_memory_backend(request.param, store)
    store.close()


@pytest.fixture
def memory(backend):
    return RolloutMemoryStore(backend, HashingEmbedder())


def test_only_clean_winners_are_stored(memory):
    report = memory.upsert([
        candidate("a", "sort a list of numbers", "done", 1.0),
        candidate("b", "reverse a string", "done", 0.0, index=1),
        candidate("c", "parse a date", "done", 0.67, index=2),
        candidate("d", "sum two numbers", "Final: 4", 1.0, hack=True, index=3),
        candidate("e", "unverified task", "x", None, index=4),
    ])
    assert (report.stored, report.discarded) == (1, 4)
    assert report.reasons == {"not_a_win": 3, "hack_detected": 1}
    assert memory.backend.count() == 1
    [stored] = memory.retrieve("sort a list of numbers", k=5)
    assert (stored.task_id, stored.final_answer) == ("a", "done")
    assert stored.key_steps == ["read_file", "write_file", "submit"]
    assert (stored.embedder, stored.dim) == ("hashing", 384)


def test_duplicates_are_not_stored_twice(memory):
    first = memory.upsert([candidate("a", "sort a list", "[1, 2]"),
                           candidate("a", "sort a list", " [1,  2] ", index=1)])
    assert (first.stored, first.duplicates) == (1, 1)  # same task, same answer up to whitespace
    again = memory.upsert([candidate("a", "sort a list", "[1, 2]", run="r2"), candidate("a", "sort a list", "[2, 1]")])
    assert (again.stored, again.duplicates) == (1, 1)  # a re-added winner is a duplicate; a new answer is new
    assert memory.backend.count() == 2


def test_backend_add_skips_stored_ids(backend):
    embedder = HashingEmbedder()
    memories = [Memory(f"id-{i}", "r1", f"t{i}", 0, f"task number {i}", [], "x", embedder.name, embedder.dim)
                for i in range(3)]
    vectors = embedder.embed([m.task_text for m in memories])
    assert backend.add(memories[:2], vectors[:2]) == 2
    assert backend.add(memories, vectors) == 1
    assert backend.existing_ids(["id-0", "id-2", "id-9"]) == {"id-0", "id-2"}
    assert backend.count() == 3
    assert backend.spaces() == {("hashing", 384)}


def test_retrieval_returns_the_nearest_first_with_cosine_similarity(memory):
    texts = {
        "sort": "sort a list of integers in ascending order",
        "sort-desc": "sort a list of integers in descending order",
        "csv": "parse a csv file and sum the second column",
        "http": "fetch a web page over http and count the links",
    }
    memory.upsert([candidate(task_id, text, "ok", index=i) for i, (task_id, text) in enumerate(texts.items())])
    query = "sort a list of integers in ascending order please"
    found = memory.retrieve(query, k=3)
    assert [m.task_id for m in found][:2] == ["sort", "sort-desc"]
    assert len(found) == 3
    similarities = [m.similarity for m in found]
    assert similarities == sorted(similarities, reverse=True)
    embedder = memory.embedder
    expected = float(embedder.embed([query])[0] @ embedder.embed([texts["sort"]])[0])
    assert found[0].similarity == pytest.approx(expected, abs=1e-5)
    assert memory.retrieve(query, k=0) == []


def test_retrieval_from_an_empty_memory_is_empty(memory):
    assert memory.retrieve("anything", k=3) == []
    assert memory.backend.spaces() == set()


def test_mixing_embedder_dimensions_is_a_config_error(backend):
    RolloutMemoryStore(backend, HashingEmbedder(384)).upsert([candidate("a", "sort a list", "ok")])
    other = RolloutMemoryStore(backend, HashingEmbedder(64))
    with pytest.raises(ConfigError, match="dim 384"):
        other.upsert([candidate("b", "reverse a string", "ok")])
    with pytest.raises(ConfigError, match="dim 384"):
        other.retrieve("sort a list")
    assert backend.count() == 1


def test_clear_empties_and_frees_the_space(backend):
    memory = RolloutMemoryStore(backend, HashingEmbedder())
    memory.upsert([candidate("a", "sort a list", "ok"), candidate("b", "reverse a string", "ok", index=1)])
    assert backend.clear() == 2
    assert backend.count() == 0
    assert memory.retrieve("sort a list") == []
    assert backend.spaces() == set()
    # a cleared memory takes another embedder
    small = RolloutMemoryStore(backend, HashingEmbedder(64))
    assert small.upsert([candidate("c", "count words", "ok")]).stored == 1
    assert [m.task_id for m in small.retrieve("count words", k=1)] == ["c"]


def test_lance_memories_survive_a_reopen(tmp_path):
    memory = RolloutMemoryStore(LanceMemoryBackend(tmp_path / "lance"), HashingEmbedder())
    memory.upsert([candidate("a", "sort a list of numbers", "done")])
    reopened = RolloutMemoryStore(LanceMemoryBackend(tmp_path / "lance"), HashingEmbedder())
    assert reopened.upsert([candidate("a", "sort a list of numbers", "done", run="r2")]).duplicates == 1
    assert [m.task_id for m in reopened.retrieve("sort numbers", k=1)] == ["a"]


def test_lance_builds_an_ann_index_at_the_threshold(tmp_path):
    rng = np.random.default_rng(0)
    dim, n = 32, 600
    vectors = rng.standard_normal((n, dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    backend = LanceMemoryBackend(tmp_path / "lance", index_threshold=500)
    memories = [Memory(f"m{i:04d}", "r", f"t{i}", 0, f"text {i}", [], None, "random", dim) for i in range(n)]
    backend.add(memories[:400], vectors[:400])
    assert not backend.indexed()  # exact search below the threshold
    exact = backend.search(vectors[7], 3, "random", dim)
    assert exact[0].memory_id == "m0007" and exact[0].similarity == pytest.approx(1.0, abs=1e-5)
    backend.add(memories[400:], vectors[400:])
    assert backend.indexed()
    assert backend.count() == n
    assert backend.existing_ids(["m0001", "m0599", "nope"]) == {"m0001", "m0599"}
    found = backend.search(vectors[42], 5, "random", dim)
    assert len(found) == 5 and found[0].memory_id == "m0042"


def test_missing_lancedb_is_a_config_error_naming_the_extra(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "lancedb", None)
    with pytest.raises(ConfigError, match=r"factory-rlaif\[memory-ann\]"):
        LanceMemoryBackend(tmp_path / "lance")


def test_duckdb_search_agrees_with_array_cosine_similarity_and_sees_other_writers(tmp_path):
    rng = np.random.default_rng(1)
    dim, n = 16, 300
    vectors = rng.standard_normal((n, dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    memories = [Memory(f"m{i:04d}", "r", f"t{i}", 0, f"text {i}", [], None, "random", dim) for i in range(n)]
    with Store.open(tmp_path / "m.duckdb") as store:
        backend = DuckDBMemoryBackend(store)
        backend.add(memories[:200], vectors[:200])
        query = rng.standard_normal(dim).astype(np.float32)
        found = backend.search(query, 5, "random", dim)
        reference = store.query(
            f"SELECT memory_id, array_cosine_similarity(embedding::FLOAT[{dim}], ?::FLOAT[{dim}]) AS s FROM memory "
            "ORDER BY s DESC, memory_id LIMIT 5", [query.tolist()])
        assert [m.memory_id for m in found] == reference["memory_id"].to_list()
        assert [m.similarity for m in found] == pytest.approx(reference["s"].to_list(), abs=1e-5)
        # a second backend on the same store (another writer) adds rows: the first one's next search sees them
        DuckDBMemoryBackend(store).add(memories[200:], vectors[200:])
        assert backend.search(vectors[250], 1, "random", dim)[0].memory_id == "m0250"
        # its own writes extend its mirror
        extra = Memory("z-new", "r", "tz", 0, "text z", [], None, "random", dim)
        backend.add([extra], -vectors[:1])
        assert backend.search(-vectors[0], 1, "random", dim)[0].memory_id == "z-new"
