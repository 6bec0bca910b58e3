"""The viewer's JSON API (Starlette's TestClient) and its static bundle, on a real replay run's store."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from factory.errors import ConfigError
from factory.ranking import wilson_interval
from factory.store import Store, utc_now
from factory.view import (
    ENDPOINTS,
    ViewData,
    create_app,
    final_workspace,
    is_loopback,
    pass_rate,
    workspace_diff,
    write_bundle,
)

pytest.importorskip("starlette", reason="starlette (the 'view' extra) is not installed")
pytest.importorskip("httpx", reason="httpx (the 'dev' extra; Starlette's TestClient needs it) is not installed")
from starlette.testclient import TestClient  # noqa: E402


@pytest.fixture(scope="module")
def store(view_db: Path):
    with Store.open(view_db, read_only=True) as opened:
        yield opened


@pytest.fixture(scope="module")
def client(store: Store):
    with TestClient(create_app(ViewData(store)), base_url="http://127.0.0.1") as test_client:
        yield test_client


def get(client: TestClient, name: str, **params) -> dict:
    response = client.get(f"/api/{name}", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def test_runs_page_counts_and_wilson_interval(client: TestClient, store: Store) -> None:
    page = get(client, "runs")
    assert page["total"] == 1 and page["filters"]["statuses"] == ["finished"]
    run = page["runs"][0]
    assert (run["run_id"], run["branches"], run["verified"], run["passed"], run["hacks"], run["infra_failures"]) == \
        ("r1", 12, 12, 5, 1, 0)
    low, high = wilson_interval(5, 12)
    assert run["pass_rate"] == {"passed": 5, "verified": 12, "rate": 5 / 12, "low": low, "high": high}
    assert get(client, "runs", status="running")["runs"] == []
    assert get(client, "runs", model="replay:")["total"] == 1
    assert get(client, "runs", q="no-such-run")["total"] == 0


def test_run_counts_agree_with_the_store(client: TestClient, store: Store) -> None:
    run = get(client, "run", run="r1")
    summaries = store.task_summaries("r1", opinions=["judge"])
    assert run["tasks"] == 3 and run["branches"] == int(summaries["branches"].sum())
    assert run["passed"] == int(summaries["passed"].sum()) and run["hacks"] == int(summaries["hacks"].sum())
    assert run["boundary_limited"] == 0 and run["verifier_errors"] == 0 and run["unverified"] == 0
    assert run["by_status"] == {"ok": 12} and run["ranked_rows"] == 12
    assert run["config"]["branches"] == 4  # the manifest, parsed
    assert client.get("/api/run", params={"run": "nope"}).status_code == 404


def test_tasks_page_is_paged_and_carries_the_grid(client: TestClient) -> None:
    first = get(client, "tasks", run="r1", limit=2)
    assert first["total"] == 3 and [t["task_id"] for t in first["tasks"]] == ["add", "fix-factorial"]
    assert [t["task_id"] for t in get(client, "tasks", run="r1", limit=2, offset=2)["tasks"]] == ["mul"]
    cells = {c["branch_index"]: c for c in first["tasks"][1]["cells"]}
    assert cells[2]["hack_detected"] and cells[2]["hack_suspected"] and not cells[2]["objective_pass"]
    assert cells[0]["objective_pass"] and cells[0]["rank"] == 1
    assert first["tasks"][1]["pass_rate"]["passed"] == 1
    assert get(client, "tasks", run="r1", q="factorial(0)")["total"] == 1  # prompt text matches


def test_task_side_by_side_carries_trajectories_verdict_details_and_ranking(client: TestClient, store: Store) -> None:
    task = get(client, "task", run="r1", task="fix-factorial")
    assert task["shown"] == [0, 1, 2, 3] and "solution" not in task["task"]["spec"]
    branches = {b["branch_index"]: b for b in task["branches"]}
    stored = store.branches("r1", "fix-factorial")
    for row in stored.iter_rows(named=True):
        assert branches[row["branch_index"]]["final_answer"] == row["final_answer"]
    call = next(e for e in branches[0]["events"] if e["kind"] == "tool_call")
    assert call["payload"]["name"] == "write_file" and "return 1" in call["payload"]["arguments"]["content"]
    result = next(e for e in branches[1]["events"] if e["kind"] == "tool_result")
    assert "FAILED test_solution.py::test_zero" in result["payload"]["output"]
    tests = branches[1]["verdicts"][0]
    assert tests["verifier"] == "tests" and tests["details"]["failed"] == ["test_solution.py::test_zero"]
    assert "assert factorial(0) == 1" in tests["details"]["failures"]["test_solution.py::test_zero"]
    assert tests["details"]["isolation"]
    hack = branches[2]["verdicts"][0]["details"]
    assert hack["hack_detected"] and hack["monitor_findings"][0]["code"] == "conftest_added"
    ranking = store.rankings("r1").filter(task_id="fix-factorial")
    for row in ranking.iter_rows(named=True):
        shown = branches[row["branch_index"]]
        assert (shown["rank"], shown["reward"], shown["ci_low"], shown["ci_high"]) == \
            (row["rank"], row["reward"], row["ci_low"], row["ci_high"])
    answer = get(client, "task", run="r1", task="add", branches="3,1")
    assert answer["shown"] == [1, 3] and [b["branch_index"] for b in answer["branches"]] == [1, 3]
    assert client.get("/api/task", params={"run": "r1", "task": "nope"}).status_code == 404
    assert client.get("/api/task", params={"run": "r1", "task": "add", "branches": "x"}).status_code == 400


def test_diff_is_the_stored_final_workspaces(client: TestClient, store: Store) -> None:
    rows = {r["branch_index"]: r for r in store.branches("r1", "fix-factorial").iter_rows(named=True)}
    spec = store.tasks("r1").filter(task_id="fix-factorial")["spec"].item()
    expected = workspace_diff(final_workspace(rows[0]["workspace"], spec), final_workspace(rows[2]["workspace"], spec))
    diff = get(client, "diff", run="r1", task="fix-factorial", a=0, b=2)
    assert diff["files"] == expected
    files = {f["path"]: f for f in diff["files"]}
    assert files["conftest.py"]["change"] == "added" and "+    items.clear()" in files["conftest.py"]["lines"]
    assert "-        return 1" in files["solution.py"]["lines"] and "+        return n" in files["solution.py"]["lines"]
    assert get(client, "diff", run="r1", task="fix-factorial", a=1, b=1)["files"] == []
    assert client.get("/api/diff", params={"run": "r1", "task": "fix-factorial", "a": 0, "b": 9}).status_code == 404


def test_final_workspace_applies_the_change_set() -> None:
    spec = {"files": {"a.py": "1\n", "b.py": "2\n"}}
    snapshot = {"files": {"a.py": "one\n", "c.py": "3\n"}, "deleted": ["b.py"], "symlinks": {"l": "/etc"},
                "skipped": ["big.bin"]}
    assert final_workspace(json.dumps(snapshot), json.dumps(spec)) == {
        "a.py": "one\n", "big.bin": "[changed, not stored: too large or binary]\n", "c.py": "3\n",
        "l": "[symlink -> /etc]\n"}
    assert final_workspace(None, spec) == spec["files"]


def test_search_finds_final_answers_and_tool_outputs(client: TestClient) -> None:
    answers = get(client, "search", run="r1", q="final: 42")["hits"]
    assert {(h["task_id"], h["branch_index"], h["place"]) for h in answers} == \
        {("add", 0, "final_answer"), ("add", 1, "final_answer")}
    outputs = get(client, "search", run="r1", q="short test summary")["hits"]
    assert [(h["task_id"], h["branch_index"], h["place"]) for h in outputs] == [("fix-factorial", 1, "tool_output")]
    assert get(client, "search", run="r1", q="x")["hits"] == []  # one character searches nothing


def test_rankings_page(client: TestClient) -> None:
    page = get(client, "rankings", run="r1", limit=5)
    assert page["total"] == 12 and len(page["rankings"]) == 5
    assert [r["task_id"] for r in page["rankings"]] == ["add"] * 4 + ["fix-factorial"]


def test_bad_requests_are_clean_errors(client: TestClient) -> None:
    assert client.get("/api/runs", params={"limit": "x"}).json() == {"error": "limit must be a whole number, not 'x'"}
    assert client.get("/api/runs", params={"limit": "100000"}).status_code == 400
    assert client.get("/api/tasks").status_code == 400  # run is required
    assert client.get("/api/nothing").status_code == 404
    assert client.get("/assets/../secret").status_code == 404
    assert set(ENDPOINTS) == {"runs", "run", "tasks", "task", "diff", "search", "rankings", "outputs", "output"}


def test_pages_are_locked_to_their_origin_and_loopback_hosts(client: TestClient, store: Store) -> None:
    page = client.get("/")
    assert page.status_code == 200 and "assets/app.js" in page.text
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert client.get("/assets/app.js").headers["content-type"].startswith("text/javascript")
    # a DNS-rebinding page reaches the server under another name: refused
    assert client.get("/api/runs", headers={"Host": "attacker.example"}).status_code == 400
    assert client.post("/api/runs").status_code == 405  # read-only: GET only
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.5")


def test_pass_rate_without_verified_branches() -> None:
    assert pass_rate(0, 0) == {"passed": 0, "verified": 0, "rate": None, "low": 0.0, "high": 1.0}


def test_bundle_holds_every_default_answer_and_replaces_only_a_bundle(store: Store, tmp_path: Path) -> None:
    data = ViewData(store)
    site = tmp_path / "site"
    written = write_bundle(data, site)
    index = (site / "data" / "index.js").read_text()
    files = json.loads(index[index.index("{files: ") + len("{files: "):index.index(", answers:")])
    for key in ("runs", "run?run=r1", "tasks?run=r1", "task?run=r1&task=fix-factorial", "rankings?run=r1",
                "diff?a=0&b=2&run=r1&task=fix-factorial", "corpus?run=r1"):
        assert key in files, key
    assert written["answers"] == len(files)
    script = (site / files["task?run=r1&task=fix-factorial"]).read_text()
    answer = json.loads(script[script.index(", ") + 2:script.rindex(");")])
    assert answer == data.answer("task", {"run": "r1", "task": "fix-factorial"})
    assert (site / "index.html").read_text().count('<script src="data/index.js"></script>') == 1
    write_bundle(data, site)  # an earlier bundle is replaced
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    with pytest.raises(Exception, match="not an earlier bundle"):
        write_bundle(data, other)
    assert (other / "notes.txt").read_text() == "keep me"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging folder left behind


def test_cli_writes_a_bundle_and_refuses_a_missing_store(cli, view_db: Path, tmp_path: Path) -> None:
    result = cli("view", "--db", view_db, "--bundle", tmp_path / "out")
    assert result.exit_code == 0 and "file://" in result.output and (tmp_path / "out" / "index.html").exists()
    missing = cli("view", "--db", tmp_path / "none.duckdb", "--bundle", tmp_path / "out2")
    assert missing.exit_code == 1 and "no database" in missing.output


def test_run_counts_are_kept_until_the_run_changes(view_db: Path, tmp_path: Path) -> None:
    db = tmp_path / "copy.duckdb"
    db.write_bytes(view_db.read_bytes())
    with Store.open(db) as writable:
        data = ViewData(writable)
        before = data.answer("run", {"run": "r1"})
        assert data.answer("run", {"run": "r1"}) == before  # kept: nothing changed
        assert before["passed"] == 5
        # a newer verdict passes branch 3 of `add` (it failed): the counts must follow
        writable.write_verdicts([{"run_id": "r1", "task_id": "add", "branch_index": 3, "verifier": "answer",
                                  "version": "1", "ok": True, "score": 1.0, "status": "pass",
                                  "details": {"code": "ok"}, "created_at": utc_now()}])
        after = data.answer("run", {"run": "r1"})
        assert after["passed"] == 6 and data.answer("runs", {})["runs"][0]["passed"] == 6


def test_a_viewer_by_path_lets_go_of_the_store_when_idle(view_db: Path, tmp_path: Path) -> None:
    db = tmp_path / "copy.duckdb"
    db.write_bytes(view_db.read_bytes())
    data = ViewData(path=db, hold_s=0.2)
    assert data.answer("run", {"run": "r1"})["branches"] == 12
    deadline = time.monotonic() + 10
    while data.browser is not None:  # closed by its timer once idle
        assert time.monotonic() < deadline, "the viewer kept the store open"
        time.sleep(0.05)
    with Store.open(db) as writable:  # read-write in this process: refused if a read-only connection were left
        writable.update_run("r1", status="interrupted")
    assert data.answer("run", {"run": "r1"})["status"] == "interrupted"  # opened again, counts recounted
    data.release()
    with pytest.raises(ConfigError, match="not both"):
        ViewData()
