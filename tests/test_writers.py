"""Writers that cannot destroy: outputs land whole or not at all, and never on the store or an input.

Every output (an export's data, side file, manifest and card; a plot; a
training report) is written beside its target and renamed into place when
complete; a target that resolves to the store or an input (through a
symlink or a hard link) is refused before any work; on an error no
partial file is left.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from factory.errors import ConfigError
from factory.outputs import OutputFiles, refuse_protected, write_output


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


# ------------------------------------------------------------------ the helper


def test_a_set_of_files_lands_together_when_complete(tmp_path):
    with OutputFiles() as outputs:
        outputs.stage(tmp_path / "a.txt").write_text("a")
        outputs.stage(tmp_path / "sub" / "b.txt").write_text("b")
        staged = [outputs.staged(tmp_path / "a.txt"), outputs.staged(tmp_path / "sub" / "b.txt")]
        # beside their targets, hidden, with the target's extension (matplotlib and polars go by it)
        assert [(p.parent, p.name[0], p.suffix) for p in staged] == [(tmp_path, ".", ".txt"),
                                                                     (tmp_path / "sub", ".", ".txt")]
        assert not (tmp_path / "a.txt").exists() and not (tmp_path / "sub" / "b.txt").exists()
    assert (tmp_path / "a.txt").read_text() == "a" and (tmp_path / "sub" / "b.txt").read_text() == "b"
    assert listing(tmp_path) == ["a.txt", "sub", "sub/b.txt"]


def test_an_error_leaves_every_target_as_it_was_and_no_partial_file(tmp_path):
    (tmp_path / "a.txt").write_text("old")
    with pytest.raises(RuntimeError), OutputFiles() as outputs:
        outputs.stage(tmp_path / "a.txt").write_text("new")
        outputs.stage(tmp_path / "new" / "deeper" / "b.txt").write_text("b")
        raise RuntimeError("the third file failed")
    assert (tmp_path / "a.txt").read_text() == "old"
    assert listing(tmp_path) == ["a.txt"]  # no temporary file, and the folders made for b.txt are gone


@pytest.mark.parametrize("how", ["same path", "relative path", "symlink", "symlinked folder", "hard link"])
def test_a_target_that_is_the_store_is_refused_however_it_is_reached(tmp_path, monkeypatch, how):
    store = tmp_path / "store.duckdb"
    store.write_bytes(b"DUCK")
    monkeypatch.chdir(tmp_path)
    target = {"same path": lambda: store, "relative path": lambda: Path("store.duckdb")}.get(how, lambda: None)()
    if how == "symlink":
        target = tmp_path / "out.jsonl"
        target.symlink_to(store)
    elif how == "symlinked folder":
        (tmp_path / "link").symlink_to(tmp_path)
        target = tmp_path / "link" / "store.duckdb"
    elif how == "hard link":
        target = tmp_path / "out.jsonl"
        os.link(store, target)
    with pytest.raises(ConfigError, match=r"refusing to write .*: it is the store \(--db\)"):
        write_output(target, lambda path: path.write_text("export"), {"the store (--db)": store})
    assert store.read_bytes() == b"DUCK"


def test_a_directory_target_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="it is a directory"):
        OutputFiles().check(tmp_path)
    assert refuse_protected(tmp_path, {"the store (--db)": tmp_path / "store.duckdb"}) == tmp_path


# ------------------------------------------------------------------ exports


@pytest.fixture
def store_copy(exported_run, tmp_path) -> Path:
    """A private copy of the exported run's store (tests/_runs.py), in its own folder."""
    folder = tmp_path / "work"
    folder.mkdir()
    return Path(shutil.copyfile(exported_run, folder / "store.duckdb"))


def test_an_export_over_the_store_is_refused_and_the_store_is_intact(cli, store_copy, tmp_path):
    disguised = store_copy.with_name("store.jsonl")
    store_copy.rename(disguised)  # `--out store.jsonl --db store.jsonl`: the store has the export's name
    before, files = digest(disguised), listing(disguised.parent)
    result = cli("export", "sft", "--run", "r1", "--out", disguised, "--db", disguised)
    assert result.exit_code == 2, result.output
    assert result.output.strip() == f"error: refusing to write {disguised}: it is the store (--db) ({disguised})"
    assert digest(disguised) == before and listing(disguised.parent) == files


def test_an_export_through_a_symlink_to_the_store_is_refused(cli, store_copy):
    link = store_copy.with_name("dpo.jsonl")
    link.symlink_to(store_copy)
    before = digest(store_copy)
    result = cli("export", "dpo", "--run", "r1", "--out", link, "--db", store_copy)
    assert result.exit_code == 2 and "it is the store (--db)" in result.output
    assert digest(store_copy) == before and link.is_symlink()


def test_a_failed_export_leaves_no_file_of_it(cli, store_copy, tmp_path):
    """The card, written last, cannot be (both its names are folders): the data and manifest do not land either."""
    out = tmp_path / "export"
    (out / "README.md").mkdir(parents=True)  # not factory's card: the card goes to DATASET_CARD.md...
    (out / "DATASET_CARD.md").mkdir()  # ...which cannot be written either
    (out / "sft.jsonl").write_text("the previous export\n")
    result = cli("export", "sft", "--run", "r1", "--out", out / "sft.jsonl", "--db", store_copy)
    assert result.exit_code == 2 and "DATASET_CARD.md: it is a directory" in result.output
    assert listing(out) == ["DATASET_CARD.md", "README.md", "sft.jsonl"]
    assert (out / "sft.jsonl").read_text() == "the previous export\n"


def test_an_export_lands_whole(cli, store_copy, tmp_path):
    out = tmp_path / "export" / "reward.jsonl"
    result = cli("export", "reward", "--run", "r1", "--out", out, "--db", store_copy, "--json")
    assert result.exit_code == 0, result.output
    assert listing(out.parent) == ["README.md", "reward.jsonl", "reward.jsonl.manifest.json", "reward.scalar.jsonl"]
    manifest = json.loads((out.parent / "reward.jsonl.manifest.json").read_text())
    assert manifest["file_sha256"] == "sha256:" + digest(out)
    assert manifest["files"]["scalar"]["sha256"] == "sha256:" + digest(out.parent / "reward.scalar.jsonl")
    assert "config_name: reward" in (out.parent / "README.md").read_text()


# ------------------------------------------------------------------ plots


def test_a_plot_over_the_store_is_refused_before_the_ranking_is_stored(cli, store_copy):
    link = store_copy.with_name("strengths.png")
    link.symlink_to(store_copy)
    before = digest(store_copy)
    result = cli("rank", "r1", "--db", store_copy, "--plot", link)
    assert result.exit_code == 2, result.output
    assert "it is the store (--db)" in result.output and len(result.output.strip().splitlines()) == 1
    assert digest(store_copy) == before


def test_a_plot_of_a_type_matplotlib_cannot_write_is_refused_before_anything(cli, store_copy):
    pytest.importorskip("matplotlib")
    before = digest(store_copy)
    result = cli("power", "--db", store_copy, "--run", "r1", "--by", "seed", "--a", "0", "--b", "1",
                 "--plot", store_copy.with_name("arms.txt"))
    assert result.exit_code == 2 and "cannot draw a .txt file" in result.output
    assert digest(store_copy) == before and not store_copy.with_name("arms.txt").exists()


def test_plots_land_whole(cli, store_copy):
    pytest.importorskip("matplotlib")
    plot = store_copy.parent / "plots" / "strengths.png"
    result = cli("rank", "r1", "--db", store_copy, "--plot", plot)
    assert result.exit_code == 0, result.output
    assert listing(plot.parent) == ["strengths.png"] and plot.read_bytes().startswith(b"\x89PNG")


# ------------------------------------------------------------------ training reports


def test_a_training_report_over_the_data_is_refused_before_training(cli, store_copy, tmp_path):
    pytest.importorskip("trl", reason="trl (the 'train' extra) is not installed")
    data = tmp_path / "sft.jsonl"
    assert cli("export", "sft", "--run", "r1", "--out", data, "--db", store_copy).exit_code == 0
    output = tmp_path / "trained"
    output.mkdir()
    (output / "train_result.json").symlink_to(data)  # an output folder with a link to the input in it
    before = digest(data)
    result = cli("train", "sft", "--data", data, "--model", tmp_path / "no-model-needed", "--output", output)
    assert result.exit_code == 2, result.output
    assert "it is the training data (--data)" in result.output
    assert digest(data) == before


# ------------------------------------------------------------------ memory index


def test_a_memory_index_in_the_store_is_refused(cli, store_copy):
    before = digest(store_copy)
    result = cli("memory", "stats", "--memory-backend", f"lance:{store_copy}", "--db", store_copy)
    assert result.exit_code == 2 and "it is the store (--db)" in result.output
    assert digest(store_copy) == before
