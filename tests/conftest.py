"""Shared fixtures: every test gets its own FACTORY_HOME and FACTORY_DB."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from factory.cli import main

#: The vendored libraries' own test suites are test data (tests/verifiers/test_realworld.py runs each on a copy),
#: never part of this suite; ignored here rather than by a conftest of their own, whose folder pytest would put on
#: sys.path (where ``import tabulate`` then found the vendored folder instead of the installed module).
collect_ignore_glob = ["data/realworld/*", "data/imports/*"]


@pytest.fixture(autouse=True)
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point FACTORY_HOME, FACTORY_DB and HF_HOME into the test's temp dir."""
    home = tmp_path / "factory-home"
    monkeypatch.setenv("FACTORY_HOME", str(home))
    monkeypatch.setenv("FACTORY_DB", str(tmp_path / "default.duckdb"))
    # Hugging Face libraries read and write nothing outside the test, and never try the network
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return home


@pytest.fixture
def cli():
    """Invoke the real `factory` click group in-process; returns the click Result."""
    runner = CliRunner()

    def invoke(*args: str, input: str | None = None):
        return runner.invoke(main, [str(a) for a in args], input=input, catch_exceptions=False)

    return invoke


@pytest.fixture
def write_jsonl(tmp_path: Path):
    """Write lines (dicts are JSON-encoded, strings written verbatim) to a .jsonl file."""

    def write(lines: list, name: str = "tasks.jsonl") -> Path:
        path = tmp_path / name
        path.write_text("".join((json.dumps(x) if not isinstance(x, str) else x) + "\n" for x in lines))
        return path

    return write


@pytest.fixture
def replay_file(tmp_path: Path):
    """Write scripted replay entries (dicts) to a JSONL file and return its path."""

    def write(entries: list[dict], name: str = "replay.jsonl") -> Path:
        path = tmp_path / name
        path.write_text("".join(json.dumps(entry) + "\n" for entry in entries))
        return path

    return write


@pytest.fixture
def one_torch_thread():
    """Tests that train the tiny model run torch on one thread: it gains nothing from more, and CI has two cores."""
    torch = pytest.importorskip("torch", reason="torch (the 'train' extra) is not installed")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    """The tiny offline causal LM (2-layer Llama, byte-level BPE, ChatML), built once per session."""
    pytest.importorskip("transformers", reason="transformers (the 'train' extra) is not installed")
    from factory.trainers import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("tiny-model")))


@pytest.fixture(scope="session")
def exported_run(tmp_path_factory) -> Path:
    """A store holding run ``r1`` to export and train on: three tasks x four verified branches (see tests/_runs.py)."""
    import shutil

    from tests._runs import build_exported_run

    db = build_exported_run(tmp_path_factory.mktemp("export-run"))
    # exports record their outputs in the store they read: a pristine copy for fixtures that need it unchanged
    shutil.copyfile(db, db.with_name(f"{db.stem}-pristine{db.suffix}"))
    return db


def pytest_collection_modifyitems(config, items):
    """Tests marked ``slow`` (minutes on the embedded model) run only when asked for: ``pytest -m slow``."""
    if "slow" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="slow: opt in with -m slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
