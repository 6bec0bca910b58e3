"""The DuckDB store: migrations, idempotent writes, locking, Polars reads."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path

import polars as pl
import pytest

import factory
from factory.errors import MigrationError, QueryError, StoreError, StoreLockedError, StoreNotFoundError
from factory.store import MIGRATIONS, Migration, Store, utc_now

TABLES = {"runs", "tasks", "branches", "events", "verdicts", "judgments", "rankings", "memory"}


def run_row(run_id: str = "r1", **extra) -> dict:
    return {"run_id": run_id, "created_at": utc_now(), "status": "running", "model": "replay:x", **extra}


def branch_row(index: int, task: str = "t1", run_id: str = "r1", **extra) -> dict:
    return {
        "run_id": run_id, "task_id": task, "branch_index": index,
        "session_id": f"{run_id}-b{index}-0000", "status": "ok",
        "trajectory": [{"role": "assistant", "content": f"answer {index}"}],
        "usage": {"input_tokens": 10, "output_tokens": 5}, "started_at": utc_now(), **extra,
    }


def event_rows(index: int, count: int, task: str = "t1", run_id: str = "r1") -> list[dict]:
    return [
        {"run_id": run_id, "task_id": task, "branch_index": index, "seq": seq, "ts": utc_now(),
         "kind": "model_call", "payload": {"seq": seq, "text": "x" * seq}}
        for seq in range(count)
    ]


def test_blank_database_gets_every_migration_once(tmp_path):
    path = tmp_path / "blank.duckdb"
    with Store.open(path) as store:
        assert store.migrations() == [m.name for m in MIGRATIONS]
        assert set(store.tables()) >= TABLES
    with Store.open(path) as store:  # reopening applies nothing twice
        assert store.migrations() == [m.name for m in MIGRATIONS]
        ledger = store.query("SELECT count(*) AS n, count(DISTINCT name) AS d FROM factory_migrations").row(0)
        assert ledger == (len(MIGRATIONS), len(MIGRATIONS))


def test_database_written_by_previous_schema_is_upgraded_in_place(tmp_path):
    path = tmp_path / "old.duckdb"
    with Store.open(path, migrations=MIGRATIONS[:1]) as old:
        assert "verdicts" not in old.tables()
        old.write_run(run_row())
        old.write_branches([branch_row(0)], event_rows(0, 3))
    with Store.open(path) as store:
        assert store.migrations() == [m.name for m in MIGRATIONS]
        assert store.branches("r1").height == 1
        assert store.events("r1").height == 3
        store.write_verdicts([{
            "run_id": "r1", "task_id": "t1", "branch_index": 0, "verifier": "answer", "version": "1",
            "ok": True, "score": 1.0, "status": "pass", "details": {"code": "ok"}, "created_at": utc_now(),
        }])
        assert store.verdicts("r1")["status"].to_list() == ["pass"]


def test_database_from_a_newer_version_is_refused(tmp_path):
    path = tmp_path / "new.duckdb"
    Store.open(path).close()
    with pytest.raises(MigrationError, match="newer version"):
        Store.open(path, migrations=MIGRATIONS[:2])


def test_failing_migration_is_rolled_back(tmp_path):
    path = tmp_path / "bad.duckdb"
    broken = (*MIGRATIONS, Migration("0999_broken", "CREATE TABLE half (a INT); SELECT * FROM no_such_table;"))
    with pytest.raises(MigrationError, match="0999_broken failed"):
        Store.open(path, migrations=broken)
    with Store.open(path) as store:
        assert "half" not in store.tables()
        assert store.migrations()[-1] == MIGRATIONS[-1].name


def test_rewriting_a_branch_replaces_it_and_its_events(tmp_path):
    with Store.open(tmp_path / "s.duckdb") as store:
        store.write_run(run_row())
        store.write_branches([branch_row(0), branch_row(1)], event_rows(0, 5) + event_rows(1, 4))
        store.write_branches([branch_row(0), branch_row(1)], event_rows(0, 5) + event_rows(1, 4))
        assert store.branches("r1").height == 2
        assert store.events("r1").height == 9
        # a resumed branch that ends differently: one row, only its new events
        store.write_branches([branch_row(0, status="error", error="sandbox died")], event_rows(0, 2))
        branches = store.branches("r1")
        assert branches.height == 2
        assert branches.filter(pl.col("branch_index") == 0)["error"].to_list() == ["sandbox died"]
        events = store.events("r1")
        assert events.filter(pl.col("branch_index") == 0)["seq"].to_list() == [0, 1]
        assert events.filter(pl.col("branch_index") == 1).height == 4


def test_idempotent_rewrites_of_every_keyed_table(tmp_path):
    with Store.open(tmp_path / "s.duckdb") as store:
        for _ in range(3):
            store.write_run(run_row())
            store.write_tasks([{"run_id": "r1", "task_id": "t1", "task_hash": "sha256:1", "prompt": "p",
                                "verifiers": ["answer"], "spec": {"id": "t1"}}])
            store.write_verdicts([{"run_id": "r1", "task_id": "t1", "branch_index": 0, "verifier": "answer",
                                   "version": "1", "ok": False, "score": 0.0, "status": "fail",
                                   "created_at": utc_now()}])
            store.write_judgments([{"run_id": "r1", "task_id": "t1", "judge": "replay:j", "kind": "pairwise",
                                    "branch_a": 0, "branch_b": 1, "sample_index": 0, "swapped": False,
                                    "preference": "a", "status": "pass", "created_at": utc_now()}])
            store.write_rankings([{"run_id": "r1", "task_id": "t1", "branch_index": 0, "rank": 1,
                                   "strength": 0.7, "created_at": utc_now()}])
        counts = {t: store.query(f"SELECT count(*) FROM {t}").item() for t in
                  ("runs", "tasks", "verdicts", "judgments", "rankings")}
        assert counts == {"runs": 1, "tasks": 1, "verdicts": 1, "judgments": 1, "rankings": 1}
        # a new verifier version adds a row and keeps the old one
        store.write_verdicts([{"run_id": "r1", "task_id": "t1", "branch_index": 0, "verifier": "answer",
                               "version": "2", "ok": True, "score": 1.0, "status": "pass",
                               "created_at": utc_now()}])
        assert store.verdicts("r1")["version"].to_list() == ["1", "2"]


def test_failed_batch_writes_nothing(tmp_path):
    with Store.open(tmp_path / "s.duckdb") as store:
        store.write_branches([branch_row(0)], event_rows(0, 3))
        bad_events = event_rows(1, 2) + [{"run_id": "r1", "task_id": "t1", "branch_index": 1, "seq": 9,
                                          "ts": utc_now(), "kind": None}]  # kind is NOT NULL
        with pytest.raises(StoreError, match="events"):
            store.write_branches([branch_row(1)], bad_events)
        assert store.branches("r1")["branch_index"].to_list() == [0]
        assert store.events("r1").height == 3


def test_unknown_column_is_a_clear_error(tmp_path):
    with Store.open(tmp_path / "s.duckdb") as store, pytest.raises(StoreError, match="no column.*colour"):
        store.write_run(run_row(colour="red"))


def test_reads_return_polars_frames_with_json_text(tmp_path):
    path = tmp_path / "s.duckdb"
    with factory.open(path) as store:
        store.write_run(run_row(config={"temperatures": [0.5, 0.7]}))
        store.write_branches([branch_row(0)], event_rows(0, 2))
    with factory.open(path, read_only=True) as store:
        branches = store.branches("r1")
        assert isinstance(branches, pl.DataFrame)
        assert branches["session_id"].to_list() == ["r1-b0-0000"]
        usage = json.loads(branches["usage"].item())
        assert usage == {"input_tokens": 10, "output_tokens": 5}
        assert store.run("r1")["status"] == "running"
        assert store.run("nope") is None
        summary = store.run_summaries().row(0, named=True)
        assert (summary["branches"], summary["events"], summary["errors"]) == (1, 2, 0)
        with pytest.raises(StoreError, match="read-only"):
            store.write_run(run_row("r2"))


def test_query_errors_are_one_line(tmp_path):
    with Store.open(tmp_path / "s.duckdb") as store:
        with pytest.raises(QueryError) as info:
            store.query("SELEC 1")
        assert "\n" not in str(info.value) and "syntax error" in str(info.value)


def test_read_only_open_of_missing_file(tmp_path):
    with pytest.raises(StoreNotFoundError, match="no database at"):
        Store.open(tmp_path / "none.duckdb", read_only=True)
    with pytest.raises(StoreError, match="does not exist"):
        Store.open(tmp_path / "no-dir" / "x.duckdb")


def test_not_a_duckdb_file(tmp_path):
    path = tmp_path / "text.duckdb"
    path.write_text("hello, not a database\n" * 100)
    with pytest.raises(StoreError, match="cannot open"):
        Store.open(path)


def test_second_writer_gets_a_clear_error_and_data_survives(tmp_path):
    path = tmp_path / "locked.duckdb"
    with Store.open(path) as store:
        store.write_run(run_row())
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            from factory.store import Store
            store = Store.open({str(path)!r})
            print("ready", flush=True)
            sys.stdin.readline()
            store.close()
        """)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        with pytest.raises(StoreLockedError, match=rf"PID {holder.pid}"):
            Store.open(path)
    finally:
        holder.communicate("done\n", timeout=30)
    with Store.open(path, read_only=True) as store:
        assert store.runs()["run_id"].to_list() == ["r1"]


def test_default_path_comes_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("FACTORY_DB", str(tmp_path / "env.duckdb"))
    with factory.open() as store:
        assert store.path == tmp_path / "env.duckdb"
    monkeypatch.delenv("FACTORY_DB")
    monkeypatch.chdir(tmp_path)
    with factory.open() as store:
        assert store.path == tmp_path / "factory.duckdb"


# ------------------------------------------------------------- the store owns the SQL

#: SQL in a string literal: a statement's keywords in capitals, as the store writes them (prose rarely does).
SQL_TEXT = re.compile(
    r"\bSELECT\b[\s\S]*\bFROM\b|\bINSERT\s+(?:OR\s+\w+\s+)?INTO\b|\bDELETE\s+FROM\b|\bUPDATE\s+\w+\s+SET\b"
)
#: Methods that run SQL on a store or a DuckDB connection.
SQL_METHODS = {"query", "_write", "execute", "sql"}
#: (module, function) allowed SQL outside factory/store: `factory query` passes the user's SQL through the door.
SQL_ALLOWED = {("cli/_query.py", "query")}


def _literal_text(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):  # an f-string: its fixed parts, placeholders between
        return "".join(part.value if isinstance(part, ast.Constant) else "{}" for part in node.values)
    return None


def sql_outside_store(root: Path) -> list[str]:
    """Every SQL call or SQL string in the package at ``root`` outside ``store/`` and the allow-list."""
    problems = []
    for path in sorted(root.rglob("*.py")):
        module = path.relative_to(root).as_posix()
        if module.startswith("store/"):
            continue
        tree = ast.parse(path.read_text(), str(path))
        allowed = {id(node) for top in tree.body
                   if isinstance(top, ast.FunctionDef | ast.AsyncFunctionDef) and (module, top.name) in SQL_ALLOWED
                   for node in ast.walk(top)}
        for node in ast.walk(tree):
            if id(node) in allowed:
                continue
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in SQL_METHODS:
                problems.append(f"{module}:{node.lineno}: .{node.func.attr}() runs SQL")
            text = _literal_text(node)
            if text is not None and SQL_TEXT.search(text):
                problems.append(f"{module}:{node.lineno}: SQL in a string")
    return list(dict.fromkeys(problems))  # an f-string's fixed parts are strings too: one report per line


def test_sql_lives_only_in_the_store():
    """Other packages call named store methods; only `factory query` hands SQL (the user's) to the store."""
    assert sql_outside_store(Path(factory.__file__).parent) == []


def test_the_sql_allow_list_is_the_query_command():
    """The one exemption is live: `factory query` is where it is and does pass SQL to ``Store.query``."""
    source = (Path(factory.__file__).parent / "cli/_query.py").read_text()
    command = next(node for node in ast.parse(source).body
                   if isinstance(node, ast.FunctionDef) and node.name == "query")
    calls = [node.func.attr for node in ast.walk(command)
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)]
    assert "query" in calls


@pytest.mark.parametrize(("module", "line", "found"), [
    ("ranking/_records.py", "def f(store):\n    return store.query('SELECT 1')\n", 1),
    ("memory/_store.py", "def f(self, rows):\n    self.store._write('memory_discards', rows)\n", 1),
    ("cli/_db.py", 'COUNT = "SELECT count(*) AS n FROM runs"\n', 1),
    ("export/_source.py", 'def f(table):\n    return f"SELECT count(*) FROM {table}"\n', 1),
    ("cli/_memory.py", 'CLEAR = """\n    DELETE FROM memory_discards\n"""\n', 1),
    ("rollouts/_report.py", "def f(con):\n    con.execute('UPDATE runs SET status = 1')\n", 2),
    ("cli/_query.py", "def g(store):\n    return store.query('SELECT * FROM runs')\n", 2),  # not the command
])
def test_sql_outside_the_store_is_caught(tmp_path, module, line, found):
    """The scan is not vacuous: SQL planted in a module, by call or by string, is found there."""
    target = tmp_path / module
    target.parent.mkdir(parents=True)
    target.write_text((Path(factory.__file__).parent / module).read_text() + "\n" + line)
    problems = sql_outside_store(tmp_path)
    assert len(problems) == found and all(p.startswith(module) for p in problems), problems


# ------------------------------------------------------------- named reads and writes

T0 = utc_now()


def verdict_row(index: int, verifier: str, status: str, score: float | None, *, version: str = "1",
                at: int = 0, details: dict | None = None, task: str = "t1", run_id: str = "r1") -> dict:
    return {"run_id": run_id, "task_id": task, "branch_index": index, "verifier": verifier, "version": version,
            "ok": status == "pass", "score": score, "status": status, "details": details,
            "created_at": T0 + timedelta(seconds=at)}


def judgment_row(a: int, b: int, preference: str | None, *, swapped: bool = False, status: str = "ok",
                 sample: int = 0, kind: str = "pairwise", run_id: str = "r1") -> dict:
    return {"run_id": run_id, "task_id": "t1", "judge": "replay:j", "kind": kind, "branch_a": a, "branch_b": b,
            "sample_index": sample, "swapped": swapped, "preference": preference, "status": status,
            "created_at": T0}


def ranking_row(index: int, rank: int, run_id: str = "r1") -> dict:
    return {"run_id": run_id, "task_id": "t1", "branch_index": index, "rank": rank, "reward": 1.0 / rank,
            "strength": 0.5, "created_at": T0}


@pytest.fixture
def verified(tmp_path):
    """Run r1, task t1: branch 0 passes on its newer verdict and is judged, 1 fails with a hack, 2 is unverified."""
    store = Store.open(tmp_path / "s.duckdb")
    store.write_run(run_row())
    store.write_branches([branch_row(0, temperature=0.5, input_tokens=10, output_tokens=5, cost_usd=0.25),
                          branch_row(1, temperature=1.0, input_tokens=20, output_tokens=7),
                          branch_row(2, status="error", input_tokens=1, output_tokens=0)])
    store.write_verdicts([
        verdict_row(0, "answer", "fail", 0.0, at=0),
        verdict_row(0, "answer", "pass", 1.0, version="2", at=1),
        verdict_row(0, "judge", "pass", 0.8, at=1),
        verdict_row(1, "answer", "fail", 0.0, details={"hack_detected": True}),
    ])
    yield store
    store.close()


def test_branch_records_read_each_verifiers_latest_verdict(verified):
    frame = verified.branch_records("r1", opinions=["judge"])
    rows = frame.select("branch_index", "objective_pass", "objective_score", "judge_score", "hack").rows()
    # branch 2 ended in error: not an outcome of the policy, so not a record; counted apart instead
    assert rows == [(0, True, 1.0, 0.8, False), (1, False, 0.0, None, True)]
    assert frame["temperature"].to_list() == [0.5, 1.0]
    assert verified.branch_records("nope", opinions=["judge"]).is_empty()
    excluded = verified.excluded_branches("r1")
    assert excluded.select("status", "branches").rows() == [("error", 1)]


def test_an_errored_objective_verdict_makes_the_outcome_unknown_not_a_fail(tmp_path):
    """A verifier that crashed is the infrastructure's failure: the branch has no objective outcome."""
    store = Store.open(tmp_path / "s.duckdb")
    store.write_run(run_row())
    store.write_branches([branch_row(0), branch_row(1)])
    store.write_verdicts([verdict_row(0, "answer", "pass", 1.0), verdict_row(0, "tests", "error", 0.0),
                          verdict_row(1, "answer", "fail", 0.0)])
    frame = store.branch_records("r1", opinions=["judge"])
    rows = frame.select("branch_index", "objective_pass", "objective_score").rows()
    assert rows == [(0, None, None), (1, False, 0.0)]
    store.close()


def test_latest_verdicts_take_the_newest_then_the_highest_version(verified):
    verified.write_verdicts([verdict_row(1, "answer", "pass", 1.0, version="2")])  # same time as version 1
    latest = verified.latest_verdicts("r1")
    assert latest.select("branch_index", "verifier", "status").rows() == [
        (0, "answer", "pass"), (0, "judge", "pass"), (1, "answer", "pass")]
    assert latest.columns == ["task_id", "branch_index", "verifier", "status", "score", "details"]


def test_task_summaries_count_branches_passes_hacks_and_cost(verified):
    verified.write_tasks([{"run_id": "r1", "task_id": "t2", "task_hash": "h", "prompt": "p", "spec": {}}])
    verified.write_branches([branch_row(0, task="t2", status="max_turns")])
    summaries = verified.task_summaries("r1", opinions=["judge"]).to_dicts()
    assert summaries == [
        {"task_id": "t1", "branches": 3, "ok": 2, "max_turns": 0, "errors": 1, "input_tokens": 31,
         "output_tokens": 12, "cost_usd": 0.25, "verified": 2, "passed": 1, "hacks": 1,
         "boundary_limited": 0},
        {"task_id": "t2", "branches": 1, "ok": 0, "max_turns": 1, "errors": 0, "input_tokens": 0,
         "output_tokens": 0, "cost_usd": None, "verified": 0, "passed": 0, "hacks": 0,
         "boundary_limited": 0},
    ]


def test_pairwise_judgments_keep_every_status_and_pair_both_orders(verified):
    verified.write_judgments([
        judgment_row(0, 1, "a", swapped=True), judgment_row(1, 2, None, status="error"),
        judgment_row(0, 1, "b"), judgment_row(0, None, None, kind="scalar"),
        judgment_row(0, 1, "a", run_id="r2"),
    ])
    frame = verified.pairwise_judgments("r1")
    assert frame.select("branch_a", "branch_b", "swapped", "preference", "status").rows() == [
        (0, 1, False, "b", "ok"), (0, 1, True, "a", "ok"), (1, 2, False, None, "error")]
    assert {"judge", "sample_index"} <= set(frame.columns)


def test_replace_rankings_leaves_exactly_the_new_ranking(verified):
    verified.write_rankings([ranking_row(i, i + 1) for i in range(3)] + [ranking_row(0, 1, run_id="r2")])
    assert verified.replace_rankings("r1", [ranking_row(2, 1), ranking_row(0, 2)]) == 2
    assert verified.rankings("r1").select("branch_index", "rank").rows() == [(2, 1), (0, 2)]
    assert verified.rankings("r2").height == 1  # another run's ranking is not touched
    with pytest.raises(StoreError, match="rankings"):  # rank is NOT NULL: the old ranking survives the failure
        verified.replace_rankings("r1", [{**ranking_row(1, 1), "rank": None}])
    assert verified.rankings("r1").select("branch_index", "rank").rows() == [(2, 1), (0, 2)]


def test_run_provenance_and_table_counts(verified):
    provenance = verified.run_provenance(["r1", "missing"])
    assert provenance.columns == ["run_id", "dataset_hash", "config_hash", "model", "created_at"]
    assert provenance["run_id"].to_list() == ["r1"]
    counts = verified.table_counts()
    assert "factory_migrations" not in counts
    assert {t: counts[t] for t in ("runs", "branches", "verdicts", "memory")} == {
        "runs": 1, "branches": 3, "verdicts": 4, "memory": 0}


def test_export_branches_split_messages_and_join_verdicts_ranking_and_task(verified):
    trajectory = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"},
                  {"role": "assistant", "content": "", "tool_calls": [
                      {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": {"x": "2+2"}}}]},
                  {"role": "tool", "content": "4", "tool_call_id": "c1"}, {"role": "assistant", "content": "4"}]
    start = {"run_id": "r1", "task_id": "t1", "branch_index": 0, "seq": 0, "ts": T0, "kind": "run_start",
             "payload": {"mode": "multi-turn"}}
    verified.write_branches([branch_row(0, trajectory=trajectory, final_answer="4")], [start])
    verified.write_tasks([{"run_id": "r1", "task_id": "t1", "task_hash": "h", "prompt": "2+2?",
                           "verifiers": ["answer"], "spec": {"id": "t1"}}])
    verified.write_branches([branch_row(3)])  # finished, never verified
    verified.write_rankings([ranking_row(0, 1)])
    frame = verified.export_branches(["r1"], opinions=["judge"])
    assert frame["branch_index"].to_list() == [0, 1, 3]  # branch 2 ended in error: not an outcome, never exported
    row = frame.row(0, named=True)
    assert [m["role"] for m in row["prompt_messages"]] == ["system", "user"]
    assert [m["role"] for m in row["completion_messages"]] == ["assistant", "tool", "assistant"]
    call = row["completion_messages"][0]["tool_calls"][0]["function"]
    assert (call["name"], json.loads(call["arguments"])) == ("calc", {"x": "2+2"})
    assert row["completion_chars"] == len("calc") + len(call["arguments"]) + len("4") + len("4")
    assert (row["mode"], row["objective_pass"], row["judge_score"], row["rank"]) == ("multi-turn", True, 0.8, 1)
    assert row["verifier_versions"] == ["answer@2", "judge@1"]
    assert (row["task_prompt"], row["task_verifiers"]) == ("2+2?", ["answer"])
    other = frame.row(2, named=True)  # no events, verdicts or ranking of its own
    assert (other["mode"], other["objective_pass"], other["hack_detected"], other["verifier_versions"],
            other["rank"]) == ("single-turn", None, False, [], None)
    assert verified.export_branches(["nope"], opinions=["judge"]).is_empty()


def memory_row(memory_id: str, vector: list[float], *, embedder: str = "hash", at: int = 0) -> dict:
    return {"memory_id": memory_id, "run_id": "r1", "task_id": "t1", "branch_index": 0, "task_text": "task",
            "key_steps": ["calc"], "final_answer": "4", "embedder": embedder, "dim": len(vector),
            "embedding": vector, "created_at": T0 + timedelta(seconds=at)}


def test_memory_rows_count_spaces_and_clear(tmp_path):
    with Store.open(tmp_path / "s.duckdb") as store:
        assert store.memory_state() == (0, None) and store.memory_count() == 0
        assert store.write_memories([memory_row("m2", [0.0, 1.0]), memory_row("m1", [1.0, 0.0], at=5),
                                     memory_row("m3", [1.0, 0.0, 0.0], embedder="other")]) == 3
        assert store.write_memories([memory_row("m1", [1.0, 0.0], at=5)]) == 1  # same id: replaced, not doubled
        assert store.memory_state() == (3, T0 + timedelta(seconds=5))
        assert store.stored_memory_ids(["m1", "m9", "m3"]) == {"m1", "m3"}
        assert store.stored_memory_ids([]) == set()
        assert store.memory_spaces() == {("hash", 2), ("other", 3)}
        space = store.memory_space("hash", 2)
        assert space["memory_id"].to_list() == ["m1", "m2"]
        assert space["embedding"].to_list() == [[1.0, 0.0], [0.0, 1.0]]
        assert store.clear_memory() == 3
        assert store.memory_count() == 0 and store.memory_spaces() == set()


def test_memory_discards_are_counted_by_reason_and_cleared(tmp_path):
    path = tmp_path / "s.duckdb"
    discards = [{"run_id": "r1", "task_id": "t1", "branch_index": i, "reason": reason}
                for i, reason in enumerate(["not_a_win", "hack_detected", "not_a_win"])]
    with Store.open(path) as store:
        assert store.memory_discard_counts() == {}
        store.write_memory_discards(discards)
        store.write_memory_discards(discards[:1])  # the same branch again: replaced, not counted twice
        assert store.memory_discard_counts() == {"hack_detected": 1, "not_a_win": 2}
    with Store.open(path, read_only=True) as store:
        for clear in (store.clear_memory_discards, store.clear_memory):
            with pytest.raises(StoreError, match="read-only"):
                clear()
    with Store.open(path) as store:
        assert store.clear_memory_discards() == 3
        assert store.memory_discard_counts() == {}


def test_which_verifiers_are_opinions_is_the_callers_word(verified):
    """The store knows no verifier class: the opinions it leaves out of the objective outcome are a parameter."""
    as_judge = verified.branch_records("r1", opinions=["judge"]).select("branch_index", "objective_pass").rows()
    as_check = verified.branch_records("r1", opinions=[]).select("branch_index", "objective_pass").rows()
    assert as_judge == [(0, True), (1, False)]
    assert as_check == [(0, True), (1, False)]  # branch 0's judge verdict passes too, so nothing changes
    answer_as_opinion = verified.branch_records("r1", opinions=["answer"]).select("objective_pass").to_series()
    assert answer_as_opinion.to_list() == [True, None]  # branch 1 has no objective verdict left
