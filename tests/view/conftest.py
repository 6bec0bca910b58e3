"""The viewer's store: the replay run of tests/_runs.py (three tasks x four verified branches), ranked."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from factory.cli import main


@pytest.fixture(scope="session")
def view_db(exported_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the exported run's store, ranked by ``factory rank`` (so rank, reward and strength are stored)."""
    db = tmp_path_factory.mktemp("view-run") / "run.duckdb"
    # the pristine copy: other tests' exports from the shared run record outputs in it
    shutil.copyfile(exported_run.with_name(f"{exported_run.stem}-pristine{exported_run.suffix}"), db)
    result = CliRunner().invoke(main, ["rank", "r1", "--db", str(db), "--bootstrap", "10"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return db


@pytest.fixture(scope="session")
def outputs_db(view_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the viewer's store whose outputs are recorded, each by the real command that wrote it.

    ``factory rank --plot`` (rank.png), ``factory power`` by seed twice (without, then with --plot power.png:
    one comparison, one row) and ``factory export dpo`` (out/dpo.jsonl with its manifest and dataset card).
    ``power.json`` beside the store holds what power printed with --json.
    """
    folder = tmp_path_factory.mktemp("view-outputs")
    db = folder / "run.duckdb"
    shutil.copyfile(view_db, db)
    runner = CliRunner()

    def ok(*args: object) -> str:
        result = runner.invoke(main, [str(a) for a in args], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result.stdout

    ok("rank", "r1", "--db", db, "--bootstrap", "10", "--plot", folder / "rank.png")
    arms = ("--run", "r1", "--by", "seed", "--a", "0", "--b", "1")
    ok("power", "--db", db, *arms)
    (folder / "power.json").write_text(ok("power", "--db", db, *arms, "--plot", folder / "power.png", "--json"))
    ok("export", "dpo", "--run", "r1", "--db", db, "--out", folder / "out" / "dpo.jsonl")
    return db
