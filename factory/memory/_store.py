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

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from factory.errors import ConfigError
from factory.memory._embedders import Embedder
from factory.provenance import content_hash
from factory.store import Store, utc_now

__all__ = ["DuckDBMemoryBackend", "Memory", "MemoryBackend", "MemoryCandidate", "RolloutMemoryStore",
           "UpsertReport", "candidates_from_run", "format_as_system_prompt"]


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
    """Memories in the store's ``memory`` table, searched with ``array_cosine_similarity``."""

    spec = "duckdb"

    def __init__(self, store: Store):
        self.store = store

    def add(self, memories: Sequence[Memory], vectors: np.ndarray) -> int:
        if not memories:
            return 0
        fresh = set(m.memory_id for m in memories) - self.existing_ids([m.memory_id for m in memories])
        rows = [{"memory_id": m.memory_id, "run_id": m.run_id, "task_id": m.task_id, "branch_index": m.branch_index,
                 "task_text": m.task_text, "key_steps": m.key_steps, "final_answer": m.final_answer,
                 "embedder": m.embedder, "dim": m.dim, "embedding": vector.astype(np.float32).tolist(),
                 "created_at": utc_now()}
                for m, vector in zip(memories, vectors) if m.memory_id in fresh]
        with self.store.transaction():
            self.store._write("memory", rows)
        return len(rows)

    def existing_ids(self, memory_ids: Sequence[str]) -> set[str]:
        if not memory_ids:
            return set()
        frame = self.store.query("SELECT memory_id FROM memory WHERE list_contains(?, memory_id)", [list(memory_ids)])
        return set(frame["memory_id"].to_list())

    def search(self, vector: np.ndarray, k: int, embedder: str, dim: int) -> list[Memory]:
        frame = self.store.query(
            f"SELECT memory_id, run_id, task_id, branch_index, task_text, key_steps, final_answer, embedder, dim, "
            f"array_cosine_similarity(embedding::FLOAT[{int(dim)}], ?::FLOAT[{int(dim)}]) AS similarity "
            f"FROM memory WHERE embedder = ? AND dim = ? ORDER BY similarity DESC, memory_id LIMIT ?",
            [vector.astype(np.float32).tolist(), embedder, int(dim), int(k)])
        return [Memory(**{**row, "key_steps": list(row["key_steps"] or [])}) for row in frame.iter_rows(named=True)]

    def spaces(self) -> set[tuple[str, int]]:
        frame = self.store.query("SELECT DISTINCT embedder, dim FROM memory")
        return {(row[0], int(row[1])) for row in frame.iter_rows()}

    def count(self) -> int:
        return int(self.store.query("SELECT count(*) FROM memory").item())

    def clear(self) -> int:
        count = self.count()
        with self.store.transaction():
            self.store.query("DELETE FROM memory")
        return count


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
            if c.hack_detected:
                reason = "hack_detected"
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
            with self.store.transaction():
                self.store._write("memory_discards", discards)
        return report

    def retrieve(self, task_text: str, k: int = 3) -> list[Memory]:
        """The k stored winners most similar to ``task_text``."""
        if k <= 0 or self.backend.count() == 0:
            return []
        self._check_space()
        vector = self.embedder.embed([task_text])[0]
        return self.backend.search(vector, k, self.embedder.name, self.embedder.dim)

    def stats(self) -> dict[str, Any]:
        """Counts: memories, discards by reason, embedders."""
        discards: dict[str, int] = {}
        if self.store is not None:
            frame = self.store.query("SELECT reason, count(*) FROM memory_discards GROUP BY 1 ORDER BY 1")
            discards = {row[0]: int(row[1]) for row in frame.iter_rows()}
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
                                   bool(record and record.hack_detected)))
    return out
