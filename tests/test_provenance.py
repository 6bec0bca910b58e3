"""Canonical hashing and run provenance."""

from __future__ import annotations

import hashlib
import subprocess

import pytest

from factory import __version__
from factory.provenance import canonical_json, content_hash, git_sha, package_version
from factory.settings import factory_home


def test_canonical_json_ignores_key_order_and_whitespace():
    assert canonical_json({"b": 1, "a": [1, {"d": 2, "c": "é"}]}) == '{"a":[1,{"c":"é","d":2}],"b":1}'
    assert content_hash({"x": 1, "y": 2}) == content_hash({"y": 2, "x": 1})
    assert content_hash({"x": 1}) == "sha256:" + hashlib.sha256(b'{"x":1}').hexdigest()


def test_nan_is_not_canonical():
    with pytest.raises(ValueError):
        canonical_json({"x": float("nan")})


def test_git_sha_inside_and_outside_a_repository(tmp_path):
    assert git_sha(tmp_path) is None
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "f.txt").write_text("one\n")
    env = ["-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run(["git", *env, "-C", str(tmp_path), "add", "f.txt"], check=True)
    subprocess.run(["git", *env, "-C", str(tmp_path), "commit", "-qm", "one"], check=True)
    sha = git_sha(tmp_path)
    assert sha is not None and len(sha) == 40
    (tmp_path / "f.txt").write_text("two\n")
    assert git_sha(tmp_path) == f"{sha}-dirty"


def test_package_version():
    assert package_version() == __version__


def test_factory_home_follows_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("FACTORY_HOME", str(tmp_path / "h"))
    assert factory_home() == tmp_path / "h"
    monkeypatch.delenv("FACTORY_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert factory_home() == tmp_path / "cache" / "factory"
