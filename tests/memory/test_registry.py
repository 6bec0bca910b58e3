"""The memory extension points: an embedder and a backend of our own, registered by name, work like the built-ins."""

from __future__ import annotations

import numpy as np
import pytest

from factory.errors import ConfigError
from factory.memory import (
    EMBEDDERS,
    MEMORY_BACKENDS,
    DuckDBMemoryBackend,
    Embedder,
    MemoryBackend,
    MemoryCandidate,
    RolloutMemoryStore,
    create_embedder,
    create_memory_backend,
    embedder_names,
    memory_backend_names,
    register_embedder,
    register_memory_backend,
)
from factory.store import Store


class LengthEmbedder:
    """A toy embedder: a text's vector points one way for short texts, another for long ones."""

    name = "length"
    dim = 2

    def embed(self, texts):
        rows = [[1.0, 0.0] if len(t) < 20 else [0.0, 1.0] for t in texts]
        return np.asarray(rows, dtype=np.float32).reshape(len(texts), self.dim)


class ListBackend:
    """A toy backend: memories in a Python list, searched by dot product."""

    def __init__(self, label):
        self.label = label
        self.rows = []

    def add(self, memories, vectors):
        known = {m.memory_id for m, _ in self.rows}
        fresh = [(m, v) for m, v in zip(memories, vectors) if m.memory_id not in known]
        self.rows.extend(fresh)
        return len(fresh)

    def existing_ids(self, memory_ids):
        return {m.memory_id for m, _ in self.rows} & set(memory_ids)

    def search(self, vector, k, embedder, dim):
        scored = sorted(((float(v @ vector), m) for m, v in self.rows if m.embedder == embedder), key=lambda p: -p[0])
        return [m for _, m in scored[:k]]

    def spaces(self):
        return {(m.embedder, m.dim) for m, _ in self.rows}

    def count(self):
        return len(self.rows)

    def clear(self):
        cleared, self.rows = len(self.rows), []
        return cleared


@pytest.fixture
def registered(monkeypatch):
    """Register both for this test only."""
    monkeypatch.setattr(EMBEDDERS, "_entries", dict(EMBEDDERS._entries))
    monkeypatch.setattr(MEMORY_BACKENDS, "_entries", dict(MEMORY_BACKENDS._entries))
    register_embedder("length", LengthEmbedder)
    register_memory_backend("list", lambda store, argument: ListBackend(argument))


@pytest.fixture
def store(tmp_path):
    with Store.open(tmp_path / "m.duckdb") as opened:
        yield opened


def win(task_id, text, answer):
    return MemoryCandidate("r1", task_id, 0, text, answer, ["read_file", "submit"], 1.0, False)


def test_the_built_ins_are_registered_and_satisfy_the_protocols(store):
    assert {"hashing", "minilm"} <= set(embedder_names()) and embedder_names() == EMBEDDERS.names()
    assert {"duckdb", "lance"} <= set(memory_backend_names()) and memory_backend_names() == MEMORY_BACKENDS.names()
    assert isinstance(create_embedder("hashing"), Embedder)
    assert isinstance(create_memory_backend(None, store), DuckDBMemoryBackend)
    assert isinstance(create_memory_backend("duckdb", store), MemoryBackend)


def test_our_own_embedder_and_backend_are_chosen_by_name(registered, store):
    assert "length" in embedder_names() and "list" in memory_backend_names()
    backend = create_memory_backend("list:shelf", store)
    assert isinstance(backend, ListBackend) and backend.label == "shelf"  # the spec's argument reaches the factory
    assert isinstance(backend, MemoryBackend) and isinstance(create_embedder("length"), Embedder)
    memory = RolloutMemoryStore(backend, create_embedder("length"))
    report = memory.upsert([win("short", "Add 2 and 3.", "5"),
                            win("long", "Sort this list of forty numbers in place, stably.", "done")])
    assert report.stored == 2 and backend.count() == 2
    assert [m.task_id for m in memory.retrieve("What is 7 + 8?", k=1)] == ["short"]
    assert [m.task_id for m in memory.retrieve("Reverse a linked list without extra memory.", k=1)] == ["long"]
    assert memory.describe()["embedder"] == "length" and memory.describe()["dim"] == 2


def test_unknown_names_list_the_registered_ones(store):
    with pytest.raises(ConfigError, match="hashing"):
        create_embedder("no-such-embedder")
    with pytest.raises(ConfigError, match="duckdb"):
        create_memory_backend("no-such-backend", store)
    with pytest.raises(ConfigError, match="takes no argument"):
        create_memory_backend("duckdb:somewhere", store)
