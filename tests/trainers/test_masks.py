"""DPO and KTO learn from the policy's own tokens: tool results leave the loss, the assistant's turns stay in it.

Each test builds the trainer ``factory train`` builds (real TRL, the tiny model), nudges the policy away from its
frozen reference so that the loss is not at its starting value, and compares the loss and every parameter's
gradient on rows that differ in one place. In these rows the tool result closes each completion (as a run that
ends on its ``submit`` result does), so nothing the policy wrote comes after it: what is left to differ is whether
its tokens are in the loss. TRL's own trainer, on the same rows, is the control that shows the test can fail.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch (the 'train' extra) is not installed")
trl = pytest.importorskip("trl", reason="trl (the 'train' extra) is not installed")
datasets = pytest.importorskip("datasets")

from factory.errors import ConfigError  # noqa: E402
from factory.trainers import CHAT_TEMPLATE  # noqa: E402
from factory.trainers._data import TrainingData  # noqa: E402
from factory.trainers._models import load_policy, resolve_policy  # noqa: E402

SYSTEM = {"role": "system", "content": "You fix code. Use the tools."}
TASK = {"role": "user", "content": "factorial(0) returns 0. Fix solution.py so the tests pass."}
TOOLS = json.dumps([{"type": "function", "function": {
    "name": "run", "description": "Run a shell command.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}])


def call(text: str, command: str) -> dict:
    return {"role": "assistant", "content": text,
            "tool_calls": [{"type": "function", "function": {"name": "run",
                                                             "arguments": json.dumps({"command": command})}}]}


def result(text: str) -> dict:
    return {"role": "tool", "name": "run", "content": text}


def dpo_row(chosen_result: str = "2 passed in 0.01s", chosen_text: str = "I fixed the base case.") -> dict:
    return {"prompt": [SYSTEM, TASK],
            "chosen": [call(chosen_text, "python -m pytest -q"), result(chosen_result)],
            "rejected": [call("I changed the tests.", "rm test_solution.py"), result("removed")],
            "tools": TOOLS}


def kto_rows(first_result: str = "2 passed in 0.01s", first_text: str = "I fixed the base case.") -> list[dict]:
    return [{"prompt": [SYSTEM, TASK], "completion": [call(first_text, "python -m pytest -q"),
                                                      result(first_result)], "label": True, "tools": TOOLS},
            {"prompt": [SYSTEM, TASK], "completion": [call("I changed the tests.", "rm test_solution.py"),
                                                      result("removed")], "label": False, "tools": TOOLS}]


@pytest.fixture
def policy(tiny_model, one_torch_thread):
    """A fresh policy and tokenizer for each build (the trainer takes its reference copy at build time)."""

    def load():
        return load_policy(resolve_policy(tiny_model))

    return load


def data_of(rows: list[dict], tmp_path: Path) -> TrainingData:
    return TrainingData(tmp_path / "rows.jsonl", "dpo", datasets.Dataset.from_list(rows), None, "sha256:-")


def config(kind: str, tmp_path: Path, **fields):
    from factory.trainers import DPOConfig, KTOConfig

    cls = DPOConfig if kind == "dpo" else KTOConfig
    batch = 1 if kind == "dpo" else 2  # KTO's KL estimate needs a neighbour in the batch
    return cls(output_dir=str(tmp_path / "out"), per_device_train_batch_size=batch, seed=0, **fields)


def nudge(model) -> None:
    """Move the policy off its reference, the same way every time, so that the loss depends on the rows."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.02)


def loss_and_grads(trainer) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    rows = [trainer.train_dataset[i] for i in range(len(trainer.train_dataset))]
    batch = trainer.data_collator(rows)
    model = trainer.model
    nudge(model)
    model.zero_grad()
    loss = trainer.compute_loss(model, batch)
    loss.backward()
    return loss.detach(), {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}


def built(kind: str, rows: list[dict], policy, tmp_path: Path, **fields):
    from factory.trainers._preference import build_preference_trainer

    model, tokenizer = policy()
    notes: dict = {}
    trainer = build_preference_trainer(kind, config(kind, tmp_path, **fields), model, tokenizer,
                                       data_of(rows, tmp_path), notes)
    return trainer, notes


def trl_control(kind: str, rows: list[dict], policy, tmp_path: Path):
    """TRL's own trainer on the same rows: every completion token in the loss, tool results included."""
    from factory.trainers._run import frozen_reference

    model, tokenizer = policy()
    cls = trl.DPOTrainer if kind == "dpo" else trl.KTOTrainer
    return cls(model=model, ref_model=frozen_reference(model), args=config(kind, tmp_path, max_length=512),
               train_dataset=datasets.Dataset.from_list(rows), processing_class=tokenizer)


def same(a: tuple, b: tuple) -> bool:
    (loss_a, grads_a), (loss_b, grads_b) = a, b
    return (torch.allclose(loss_a, loss_b, rtol=1e-5, atol=1e-7) and grads_a.keys() == grads_b.keys()
            and all(torch.allclose(grads_a[k], grads_b[k], rtol=1e-4, atol=1e-7) for k in grads_a))


@pytest.mark.parametrize("kind", ["dpo", "kto"])
def test_a_tool_results_text_leaves_the_loss_and_an_assistant_token_moves_it(kind, policy, tmp_path):
    rows = {"dpo": lambda **kw: [dpo_row(**{("chosen_" + k): v for k, v in kw.items()})],
            "kto": lambda **kw: kto_rows(**{("first_" + k): v for k, v in kw.items()})}[kind]
    base = rows()
    other_tool_text = rows(result="1 failed, 1 passed in 0.02s")
    other_assistant = rows(text="I fixed the base-case.")

    trainer, notes = built(kind, base, policy, tmp_path)
    assert notes["loss_mask"]["assistant_only"] is True and notes["loss_mask"]["template_source"] == "own"
    assert 0 < notes["loss_mask"]["loss_tokens"] < notes["loss_mask"]["completion_tokens"]
    reference = loss_and_grads(trainer)
    assert torch.isfinite(reference[0]) and reference[1]
    assert same(reference, loss_and_grads(built(kind, other_tool_text, policy, tmp_path)[0]))
    assert not same(reference, loss_and_grads(built(kind, other_assistant, policy, tmp_path)[0]))
    # the control: TRL alone puts the tool result's tokens in the loss
    assert not same(loss_and_grads(trl_control(kind, base, policy, tmp_path)),
                    loss_and_grads(trl_control(kind, other_tool_text, policy, tmp_path)))


def test_the_mask_covers_the_assistants_text_and_tool_calls_and_nothing_else(policy, tmp_path):
    trainer, _ = built("dpo", [dpo_row()], policy, tmp_path)
    batch = trainer.data_collator([trainer.train_dataset[0]])
    tokenizer = trainer.processing_class
    chosen = batch["input_ids"][0][batch["completion_mask"][0].bool()]
    text = tokenizer.decode(chosen)
    assert text.startswith("I fixed the base case.\n<tool_call>") and text.endswith("</tool_call><|im_end|>")
    assert "2 passed" not in text and "<|im_start|>tool" not in text and "factorial(0)" not in text


def unmarked_tokenizer(policy):
    model, tokenizer = policy()
    tokenizer.chat_template = CHAT_TEMPLATE.replace("{%- generation -%}", "").replace("{%- endgeneration -%}", "")
    return model, tokenizer


def test_a_template_that_cannot_mark_assistant_turns_is_refused_unless_allowed(policy, tmp_path):
    from factory.trainers._masks import plan_loss_mask

    _, tokenizer = unmarked_tokenizer(policy)
    rows = datasets.Dataset.from_list([dpo_row()])
    with pytest.raises(ConfigError, match="--allow-unmasked"):
        plan_loss_mask(tokenizer, rows, allow_unmasked=False)
    plan = plan_loss_mask(tokenizer, rows, allow_unmasked=True)
    assert plan.to_dict() == {"assistant_only": False, "template_source": None, "allow_unmasked": True,
                              "reason": plan.reason}
    assert "--allow-unmasked" in plan.reason


def test_cli_refuses_an_unmarked_template_and_records_allow_unmasked(cli, tiny_model, policy, tmp_path):
    model, tokenizer = unmarked_tokenizer(policy)
    folder = tmp_path / "unmarked"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    data = tmp_path / "dpo.jsonl"
    data.write_text(json.dumps(dpo_row()) + "\n" + json.dumps(dpo_row(chosen_text="Fixed it.")) + "\n")
    common = ("train", "dpo", "--data", data, "--model", folder, "--max-steps", "1", "--batch-size", "2")
    refused = cli(*common, "--output", tmp_path / "no")
    assert refused.exit_code != 0 and "--allow-unmasked" in refused.output
    assert not (tmp_path / "no" / "train_result.json").exists()
    allowed = cli(*common, "--output", tmp_path / "yes", "--allow-unmasked")
    assert allowed.exit_code == 0, allowed.output
    recorded = json.loads((tmp_path / "yes" / "train_result.json").read_text())
    assert recorded["metrics"]["loss_mask"]["allow_unmasked"] is True
    assert recorded["metrics"]["loss_mask"]["assistant_only"] is False
    assert recorded["provenance"]["trl_config"]["allow_unmasked"] is True
    assert "every completion token" in allowed.output
