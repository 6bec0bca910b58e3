"""Export files on disk: kind by extension, atomic writes, side files, and records read back line by line."""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl
import pytest

from factory.errors import ConfigError, ExportValidationError
from factory.export import FILE_KINDS, MANIFEST_SUFFIX, file_kind, iter_records, side_path, write_rows

FRAME = pl.DataFrame({"prompt": ["a", "b"], "score": [1.0, 0.5], "tags": [["x"], []]})


@pytest.mark.parametrize(("name", "kind"), [("d.jsonl", "jsonl"), ("d.parquet", "parquet"), ("D.JSONL", "jsonl"),
                                            ("dir.v2/d.Parquet", "parquet")])
def test_the_kind_comes_from_the_extension(name, kind):
    assert file_kind(Path(name)) == kind and kind in FILE_KINDS.values()


@pytest.mark.parametrize("name", ["d.json", "d.csv", "d", "d.jsonl.gz"])
def test_other_extensions_are_refused(name):
    with pytest.raises(ConfigError, match="export files end in .jsonl or .parquet"):
        file_kind(Path(name))


def test_side_files_sit_beside_the_main_file_with_its_kind():
    assert side_path(Path("out/dpo.jsonl"), "scalar") == Path("out/dpo.scalar.jsonl")
    assert side_path(Path("out/rm.parquet"), "scalar") == Path("out/rm.scalar.parquet")
    assert Path("out/dpo.jsonl" + MANIFEST_SUFFIX).name == "dpo.jsonl.manifest.json"


@pytest.mark.parametrize("name", ["rows.jsonl", "rows.parquet"])
def test_rows_written_read_back_identically(tmp_path, name):
    path = tmp_path / "deep" / name
    write_rows(FRAME, path)
    records = list(iter_records(path))
    assert records == [(1, {"prompt": "a", "score": 1.0, "tags": ["x"]}, None),
                       (2, {"prompt": "b", "score": 0.5, "tags": []}, None)]
    assert [p.name for p in path.parent.iterdir()] == [name]  # no temp file left behind


def test_a_failed_write_keeps_the_previous_file_and_leaves_no_temp(tmp_path, monkeypatch):
    path = tmp_path / "rows.jsonl"
    write_rows(FRAME, path)
    before = path.read_bytes()

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        write_rows(FRAME.head(1), path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["rows.jsonl"]


def test_a_bad_extension_writes_nothing(tmp_path):
    with pytest.raises(ConfigError):
        write_rows(FRAME, tmp_path / "rows.csv")
    assert list(tmp_path.iterdir()) == []


def test_unreadable_jsonl_lines_are_reported_with_their_line(tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b'{"ok": 1}\n\n{"broken": }\n[1, 2]\n{"caf\xe9": 1}\n{"ok": 2}\n')
    assert list(iter_records(path)) == [
        (1, {"ok": 1}, None),
        (2, None, "empty line"),
        (3, None, "not JSON (Expecting value at column 12)"),
        (4, None, "not a JSON object"),
        (5, None, "not UTF-8 text"),  # latin-1
        (6, {"ok": 2}, None),
    ]


@pytest.mark.parametrize("content", [b"this is not a Parquet file\n", b"PAR1", b""])
def test_a_parquet_file_that_is_not_parquet_is_a_validation_error(tmp_path, content):
    path = tmp_path / "rows.parquet"
    path.write_bytes(content)
    with pytest.raises(ExportValidationError) as caught:
        list(iter_records(path))
    assert caught.value.exit_code == 2
    [problem] = caught.value.problems
    assert problem.startswith(f"{path}: cannot be read as Parquet: ")


def test_a_cut_off_parquet_file_is_a_validation_error(tmp_path):
    path = tmp_path / "rows.parquet"
    write_rows(FRAME, path)
    path.write_bytes(path.read_bytes()[:-20])
    with pytest.raises(ExportValidationError, match="cannot be read as Parquet"):
        list(iter_records(path))
