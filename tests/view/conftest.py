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
    shutil.copyfile(exported_run, db)
    result = CliRunner().invoke(main, ["rank", "r1", "--db", str(db), "--bootstrap", "10"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return db
