"""Training keeps its updates: float32 master weights, the share of trainable elements that moved, the dtypes.

A policy loaded in bfloat16 (what the loader gives on a GPU) is trained a few steps at a DPO-sized learning rate
on the CPU: with float32 master weights nearly every trainable element moves. The control steps the same bf16
weights in place, as training did before, and loses most updates to rounding.
"""

from __future__ import annotations

import json
import shutil

import pytest

torch = pytest.importorskip("torch", reason="torch (the 'train' extra) is not installed")
pytest.importorskip("trl", reason="trl (the 'train' extra) is not installed")

from factory.export import export  # noqa: E402
from factory.store import Store  # noqa: E402
from factory.trainers._models import load_policy, resolve_policy  # noqa: E402
from factory.trainers._precision import MovementProbe  # noqa: E402

LR = 5e-6


def rows() -> str:
    system = {"role": "system", "content": "Answer with Final: <n>."}
    return "".join(json.dumps({"prompt": [system, {"role": "user", "content": f"What is {i} + {i}?"}],
                               "chosen": [{"role": "assistant", "content": f"Final: {2 * i}"}],
                               "rejected": [{"role": "assistant", "content": f"Final: {2 * i + 1}"}]}) + "\n"
                   for i in range(4))


def test_a_policy_loaded_in_bf16_keeps_float32_master_weights_and_moves(tiny_model, one_torch_thread, tmp_path):
    from factory.trainers import DPOConfig

    data = tmp_path / "dpo.jsonl"
    data.write_text(rows())
    config = DPOConfig(data_file=str(data), model_name_or_path=tiny_model, output_dir=str(tmp_path / "out"),
                       max_steps=3, per_device_train_batch_size=2, learning_rate=LR, seed=0)

    def bf16_loader(source, dtype=None):  # what the loader picks on a GPU, whatever the trainer asks for
        return load_policy(source, dtype="bfloat16")

    from factory.trainers._preference import build_preference_trainer
    from factory.trainers._run import run_training

    notes: dict = {}
    result = run_training("dpo", config, "dpo",
                          lambda *args: build_preference_trainer("dpo", *args, notes), load_model=bf16_loader)
    precision = result.metrics["precision"]
    assert (precision["loaded_dtype"], precision["upcast_from"]) == ("bfloat16", "bfloat16")
    assert (precision["trainable_dtype"], precision["compute_dtype"]) == ("float32", "float32")
    assert precision["trainable_elements"] == precision["sampled_elements"] > 0  # the tiny model is sampled whole
    assert precision["moved_share"] >= 0.99, precision
    assert not any("trainable elements changed" in w for w in result.warnings)
    assert json.loads((tmp_path / "out" / "train_result.json").read_text())["metrics"]["precision"] == precision

    # the control: the same steps on bf16 weights updated in place keep few of their updates
    model, _ = load_policy(resolve_policy(tiny_model), dtype="bfloat16")
    probe = MovementProbe(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    for _ in range(3):
        optimizer.zero_grad()
        model(input_ids=torch.arange(1, 65).reshape(2, 32), labels=torch.arange(1, 65).reshape(2, 32)).loss.backward()
        optimizer.step()
    assert probe.moved_share(model) < 0.5


def test_auto_objective_tells_the_scalar_file_from_the_pairs_by_its_columns(exported_run, tmp_path):
    from factory.trainers import load_training_data

    with Store.open(exported_run, read_only=True) as store:
        export(store, "reward", ["r1"], tmp_path / "export" / "reward.jsonl")
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("reward.jsonl", "reward.scalar.jsonl"):  # without their manifest
        shutil.copy(tmp_path / "export" / name, bare / name)
    expected = ("reward", "reward-scalar")
    assert load_training_data(bare / "reward.scalar.jsonl", expected).format == "reward-scalar"
    assert load_training_data(bare / "reward.jsonl", expected).format == "reward"
