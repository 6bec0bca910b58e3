"""Outputs recorded in the store (``artifacts``) by rank, power and export, and what the viewer makes of them.

The store is a real DuckDB file and the rows are written by the real commands (tests/view/conftest.py's
``outputs_db``); the viewer is the real app under Starlette's TestClient. ``factory train``'s record is
checked in tests/trainers/test_closed_loop.py, whose run trains anyway.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from factory.provenance import file_sha256
from factory.store import Store, artifact_rows, utc_now
from factory.store._sharing import WriterLock
from factory.view import ViewData, create_app, write_bundle

pytest.importorskip("starlette", reason="starlette (the 'view' extra) is not installed")
pytest.importorskip("httpx", reason="httpx (the 'dev' extra; Starlette's TestClient needs it) is not installed")
from starlette.testclient import TestClient  # noqa: E402


def recorded(db: Path) -> dict[str, dict]:
    """The run's artifact rows by kind (meta parsed)."""
    with Store.open(db, read_only=True) as store:
        rows = store.artifacts("r1").to_dicts()
    for row in rows:
        row["meta"] = json.loads(row["meta"])
    return {row["kind"]: row for row in rows}


def test_rank_power_and_export_record_what_they_wrote_once(outputs_db: Path) -> None:
    folder = outputs_db.parent
    rows = recorded(outputs_db)
    assert sorted(rows) == ["export", "power", "rank_plot"]  # power ran twice: one comparison, one row
    plot = rows["rank_plot"]
    assert plot["path"] == str(folder / "rank.png") and plot["sha256"] == "sha256:" + file_sha256(folder / "rank.png")
    assert plot["meta"]["branches"] == 12 and plot["meta"]["stats"]["outcomes"]["passed"] == 5

    power, printed = rows["power"], json.loads((folder / "power.json").read_text())
    assert power["path"] == str(folder / "power.png")
    assert {k: power["meta"][k] for k in ("verdict", "n", "delta_pp", "ci_a", "ci_b", "tasks_needed", "arm_a")} == \
        {k: printed[k] for k in ("verdict", "n", "delta_pp", "ci_a", "ci_b", "tasks_needed", "arm_a")}

    export = rows["export"]
    out = folder / "out"
    manifest = json.loads((out / "dpo.jsonl.manifest.json").read_text())
    assert export["path"] == str(out / "dpo.jsonl") and export["sha256"] == manifest["file_sha256"]
    assert export["meta"]["manifest"] == manifest and export["meta"]["rows"] == manifest["rows"]
    assert {f["role"]: f["path"] for f in export["meta"]["files"]} == {
        "manifest": str(out / "dpo.jsonl.manifest.json"), "dataset card": str(out / "README.md")}
    assert all(f["sha256"] == "sha256:" + file_sha256(f["path"]) for f in export["meta"]["files"])


def test_a_busy_store_still_gets_the_output_and_one_line_saying_it_was_not_recorded(outputs_db: Path, cli,
                                                                                    tmp_path: Path) -> None:
    db = tmp_path / "busy.duckdb"
    shutil.copyfile(outputs_db, db)
    lock = WriterLock.acquire(db)  # a fork writing: it holds the writer lock (readers get in between its writes)
    try:
        result = cli("power", "--db", db, "--run", "r1", "--by", "seed", "--a", "1", "--b", "0", "--json")
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["arm_a"] == "seed=1"  # stdout is still one JSON document
        notes = [line for line in result.stderr.splitlines() if "not recorded" in line]
        assert len(notes) == 1 and "open for writing by another process" in notes[0]
    finally:
        lock.release()
    assert len(recorded(db)) == 3  # nothing written meanwhile
    # once the store is free the same comparison is recorded: a verdict with no plot, still shown by the viewer
    result = cli("power", "--db", db, "--run", "r1", "--by", "seed", "--a", "1", "--b", "0")
    assert result.exit_code == 0 and "not recorded" not in result.output
    with Store.open(db, read_only=True) as store:
        verdict = ViewData(store).answer("outputs", {"run": "r1"})["outputs"][0]
    assert (verdict["kind"], verdict["path"], verdict["status"], verdict["image"]) == ("power", "", "no file", None)
    assert verdict["meta"]["arm_a"] == "seed=1" and verdict["meta"]["verdict"] in result.stdout


def test_the_viewer_says_whether_files_still_match_and_serves_recorded_pngs_only(outputs_db: Path,
                                                                                tmp_path: Path) -> None:
    db, plot = tmp_path / "view.duckdb", tmp_path / "plot.png"
    shutil.copyfile(outputs_db, db)
    shutil.copyfile(outputs_db.parent / "rank.png", plot)
    notes = tmp_path / "notes.png"
    notes.write_bytes(b"not recorded")
    with Store.open(db) as store:  # the same file recorded twice: one row, updated
        for branches in (11, 12):
            store.record_artifacts(artifact_rows(["r1"], "rank_plot", plot, {"branches": branches},
                                                 created_at=utc_now()))
        assert json.loads(store.artifacts("r1").filter(path=str(plot))["meta"].item()) == {"branches": 12}
    with Store.open(db, read_only=True) as store, \
            TestClient(create_app(ViewData(store)), base_url="http://127.0.0.1") as client:
        page = client.get("/api/outputs", params={"run": "r1"}).json()
        assert page["total"] == 4 and {o["status"] for o in page["outputs"]} == {"matches"}
        mine = next(o for o in page["outputs"] if o["path"] == str(plot))
        export = next(o for o in page["outputs"] if o["kind"] == "export")
        assert [f["status"] for f in export["files"]] == ["matches", "matches"]
        shown = client.get(f"/files/{mine['image']}")
        assert shown.status_code == 200 and shown.headers["content-type"] == "image/png"
        assert shown.content == plot.read_bytes()

        def status() -> str:
            return client.get("/api/output", params={"run": "r1", "id": mine["artifact_id"]}).json()["status"]

        plot.write_bytes(plot.read_bytes() + b"tampered")
        assert status() == "changed" and client.get(f"/files/{mine['image']}").status_code == 404
        plot.unlink()
        assert status() == "missing" and client.get(f"/files/{mine['image']}").status_code == 404
        # nothing but a recorded PNG by its id: not a path, not an unknown id, not a recorded file that is no PNG
        unknown = hashlib.sha256(str(notes).encode()).hexdigest()[:32]
        other = export["artifact_id"]
        for name in (f"{unknown}.png", "..%2Fnotes.png", f"..%2F..%2F{notes.name}", notes.name, f"{other}.png",
                     f"{other}-0.png", f"{other}-9.png"):
            assert client.get(f"/files/{name}").status_code == 404, name
        assert client.get("/files/../../etc/passwd").status_code == 404
        assert client.get("/api/output", params={"run": "r2", "id": mine["artifact_id"]}).status_code == 404
        rankings = client.get("/api/rankings", params={"run": "r1"}).json()
        assert [p["status"] for p in rankings["plots"]] == ["missing", "matches"]  # newest first


def test_the_bundle_carries_the_outputs_and_their_plots(outputs_db: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    with Store.open(outputs_db, read_only=True) as store:
        data = ViewData(store)
        written = write_bundle(data, site)
        outputs = data.answer("outputs", {"run": "r1"})
    assert written["images"] == 2
    index = (site / "data" / "index.js").read_text()
    for output in outputs["outputs"]:
        assert f'"output?id={output["artifact_id"]}&run=r1"' in index
        if output["image"]:
            assert (site / "files" / output["image"]).read_bytes() == Path(output["path"]).read_bytes()
    assert '"outputs?run=r1"' in index
