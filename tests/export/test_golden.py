"""Committed golden samples of every format: a fresh export of the fixture run must match them, and they load.

Regenerate after an intended format change with ``FACTORY_REGEN_GOLDEN=1 pytest tests/export/test_golden.py``
and review the diff: every change to these files is a change to what trainers read.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from factory.export import export, validate_file
from factory.store import Store

GOLDEN = Path(__file__).parent / "golden"
FILES = {"dpo": "dpo.jsonl", "kto": "kto.jsonl", "reward": "reward.jsonl", "reward.scalar": "reward.scalar.jsonl",
         "sft": "sft.jsonl", "grpo": "grpo.jsonl", "ppo": "ppo.jsonl"}


def normalized(path: Path) -> list[dict]:
    """Rows with floats rounded and durations masked.

    Platform noise in the last bits of a Bradley–Terry fit, or pytest's "in 0.93s" inside a tool result, is
    not a format change.
    """
    def fix(value):
        if isinstance(value, float):
            return round(value, 6)
        if isinstance(value, str):
            return re.sub(r"\bin \d+\.\d+s\b", "in <duration>", value)
        if isinstance(value, list):
            return [fix(v) for v in value]
        if isinstance(value, dict):
            return {k: fix(v) for k, v in value.items()}
        return value

    return [fix(json.loads(line)) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def fresh(exported_run, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("fresh")
    with Store.open(exported_run, read_only=True) as store:
        for fmt in ("dpo", "kto", "reward", "sft", "grpo", "ppo"):
            export(store, fmt, ["r1"], folder / f"{fmt}.jsonl")
    if os.environ.get("FACTORY_REGEN_GOLDEN"):
        for name in FILES.values():
            (GOLDEN / name).write_text((folder / name).read_text())
    return folder


@pytest.mark.parametrize("name", sorted(FILES))
def test_a_fresh_export_matches_the_golden_sample(fresh, name):
    assert normalized(fresh / FILES[name]) == normalized(GOLDEN / FILES[name])


@pytest.mark.parametrize("fmt", ["dpo", "kto", "reward", "sft", "grpo", "ppo"])
def test_golden_samples_validate_and_load_with_datasets(fmt):
    datasets = pytest.importorskip("datasets")
    path = GOLDEN / FILES[fmt]
    rows = validate_file(path, fmt)
    loaded = datasets.load_dataset("json", data_files=str(path), split="train")
    assert loaded.num_rows == rows > 0
    first = json.loads(path.read_text().splitlines()[0])
    assert set(loaded.column_names) == set(first)
