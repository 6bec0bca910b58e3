"""Every format, exported from a real run, loads with ``datasets`` and trains its TRL trainer as is (no mapping).

One optimiser step each on the tiny locally built model; the manifest feeds the trainer where it has
something to say (KTO's class weights). GRPO's reward function re-runs our own answer verifier on each
completion, from the ``answer`` column the export carries.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch (the 'train' extra) is not installed")
trl = pytest.importorskip("trl", reason="trl (the 'train' extra) is not installed")
datasets = pytest.importorskip("datasets", reason="datasets (the 'train' extra) is not installed")

from factory.export import export  # noqa: E402
from factory.store import Store  # noqa: E402
from factory.verifiers import check_final_answer  # noqa: E402
from tests._trl import common_args, train_one_step  # noqa: E402


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    """Every test here trains the tiny model (see tests/conftest.py)."""


@pytest.fixture
def tiny(tiny_model) -> str:
    return tiny_model


def exported(db: Path, fmt: str, folder: Path):
    with Store.open(db, read_only=True) as store:
        result = export(store, fmt, ["r1"], folder / f"{fmt}.jsonl")
    data = datasets.load_dataset("json", data_files=str(result.path), split="train", cache_dir=str(folder / "hf"))
    return result, data


def test_dpo_export_trains_dpo(exported_run, tiny, tmp_path):
    _, data = exported(exported_run, "dpo", tmp_path)
    train_one_step(trl.DPOTrainer(model=tiny, args=trl.DPOConfig(**common_args(tmp_path), max_length=1024),
                                  train_dataset=data))


def test_kto_export_trains_kto_with_the_manifest_weights(exported_run, tiny, tmp_path):
    result, data = exported(exported_run, "kto", tmp_path)
    weights = json.loads(result.manifest_path.read_text())["kto"]
    config = trl.KTOConfig(**common_args(tmp_path), max_length=1024, desirable_weight=weights["desirable_weight"],
                           undesirable_weight=weights["undesirable_weight"])
    train_one_step(trl.KTOTrainer(model=tiny, args=config, train_dataset=data))


def test_reward_export_trains_a_reward_model_with_margins(exported_run, tiny, tmp_path):
    _, data = exported(exported_run, "reward", tmp_path)
    assert "margin" in data.column_names
    train_one_step(trl.RewardTrainer(model=tiny, args=trl.RewardConfig(**common_args(tmp_path), max_length=1024),
                                     train_dataset=data))


def test_sft_export_trains_sft_on_assistant_turns(exported_run, tiny, tmp_path):
    _, data = exported(exported_run, "sft", tmp_path)
    config = trl.SFTConfig(**common_args(tmp_path), max_length=1024, assistant_only_loss=True)
    train_one_step(trl.SFTTrainer(model=tiny, args=config, train_dataset=data))


def test_grpo_export_trains_grpo_with_our_verifier_as_reward(exported_run, tiny, tmp_path):
    _, data = exported(exported_run, "grpo", tmp_path)
    seen: list[dict] = []

    def answer_reward(prompts, completions, answer, task_id, **kwargs) -> list[float | None]:
        """1 for a correct ``Final:`` line, 0 otherwise; None for a task without an answer (code tasks)."""
        seen.append({"task_id": task_id, "answer": answer})
        return [None if expected is None else float(check_final_answer(c[-1]["content"], expected)[0])
                for c, expected in zip(completions, answer)]

    def brevity(prompts, completions, **kwargs) -> list[float]:
        # the tiny model answers nonsense, so the verifier's reward is flat; this one gives the step a gradient
        return [-len(c[-1]["content"]) / 100 for c in completions]

    config = trl.GRPOConfig(**common_args(tmp_path), num_generations=2, max_completion_length=8)
    train_one_step(trl.GRPOTrainer(model=tiny, reward_funcs=[answer_reward, brevity], args=config,
                                   train_dataset=data))
    assert seen and all(len(s["task_id"]) == len(s["answer"]) for s in seen)  # columns reached the reward function
