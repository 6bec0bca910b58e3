"""One optimiser step of each TRL trainer on the tiny model, fed the exact row shapes our exporter writes.

Each dataset goes through a JSONL file and ``datasets.load_dataset("json")``, as a user's export would, and is
passed to the trainer with no column mapping: provenance columns ride along and must be tolerated.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch (the 'train' extra) is not installed")
pytest.importorskip("transformers", reason="transformers (the 'train' extra) is not installed")
trl = pytest.importorskip("trl", reason="trl (the 'train' extra) is not installed")
datasets = pytest.importorskip("datasets", reason="datasets (the 'train' extra) is not installed")

from tests._trl import common_args, train_one_step  # noqa: E402

RUN_TOOLS = json.dumps(
    [
        {
            "type": "function",
            "function": {
                "name": "run",
                "description": "Run a shell command.",
                "parameters": {
                    "type": "object",
                    "properties": {"command": {"type": "string"}},
                    "required": ["command"],
                },
            },
        }
    ]
)
SYSTEM = {"role": "system", "content": "You are a coding agent. End with a line 'Final: <answer>'."}


def prompt(question: str) -> list[dict]:
    return [SYSTEM, {"role": "user", "content": question}]


def tool_trajectory(command: str, output: str, answer: str) -> list[dict]:
    """Assistant and tool messages of an agentic branch: one tool call, its result, the answer."""
    call = {"id": "c1", "type": "function", "function": {"name": "run", "arguments": json.dumps({"command": command})}}
    return [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "name": "run", "content": output},
        {"role": "assistant", "content": f"Final: {answer}"},
    ]


def answer_only(answer: str) -> list[dict]:
    return [{"role": "assistant", "content": f"Final: {answer}"}]


def provenance(index: int) -> dict:
    return {"run_id": "run-0001", "task_id": f"task-{index}", "verifier_versions": ["pytest@1", "judge@2"]}


# Two tasks, each once with the tool schema and once with `tools` null, so both occur in every dataset.
QUESTIONS = [("What is 17 + 25?", "42", "41"), ("What is 9 * 8?", "72", "71")]


def preference_rows() -> list[dict]:
    rows = []
    for index, (question, good, bad) in enumerate(QUESTIONS * 2):
        rows.append(
            {
                "prompt": prompt(question),
                "chosen": tool_trajectory("pytest -q", "1 passed", good),
                "rejected": answer_only(bad),
                "tools": RUN_TOOLS if index < 2 else None,
                **provenance(index),
                "chosen_branch": 0,
                "rejected_branch": 1,
                "chosen_score": 1.0,
                "rejected_score": 0.25,
            }
        )
    return rows


def kto_rows() -> list[dict]:
    rows = []
    for index, (question, good, bad) in enumerate(QUESTIONS):
        branches = [(tool_trajectory("pytest -q", "1 passed", good), True), (answer_only(bad), False)]
        for branch, (completion, label) in enumerate(branches):
            rows.append(
                {
                    "prompt": prompt(question),
                    "completion": completion,
                    "label": label,
                    **provenance(index),
                    "branch": branch,
                    "score": 1.0 if label else 0.0,
                }
            )
    # KTO samples sequentially and estimates its KL term by pairing each prompt with its batch neighbour's
    # completion, so neighbours must come from different tasks: batches of 2 here are (task 0, task 1).
    return [rows[0], rows[3], rows[2], rows[1]]


def reward_rows() -> list[dict]:
    rows = []
    for index, (question, good, bad) in enumerate(QUESTIONS * 2):
        rows.append(
            {
                "prompt": prompt(question),
                "chosen": tool_trajectory("pytest -q", "1 passed", good),
                "rejected": answer_only(bad),
                "margin": 0.75,
                **provenance(index),
                "chosen_branch": 0,
                "rejected_branch": 1,
                "chosen_score": 1.0,
                "rejected_score": 0.25,
            }
        )
    return rows


def sft_rows() -> list[dict]:
    rows = []
    for index, (question, good, _) in enumerate(QUESTIONS * 2):
        rows.append(
            {
                "messages": prompt(question) + tool_trajectory("pytest -q", "1 passed", good),
                "tools": RUN_TOOLS if index < 2 else None,
                **provenance(index),
                "branch": 0,
                "score": 1.0,
            }
        )
    return rows


def grpo_rows() -> list[dict]:
    return [
        {
            "prompt": prompt("What is 17 + 25?"),
            "task_id": "task-0",
            "answer": "42",
            "tests": None,
            "verifiers": ["final_answer@1"],
        },
        {
            "prompt": prompt("Make tests/test_add.py pass."),
            "task_id": "task-1",
            "answer": None,
            "tests": json.dumps({"command": "pytest -q tests/test_add.py"}),
            "verifiers": ["pytest@1"],
        },
    ]


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    """Every test here trains or runs the tiny model (see tests/conftest.py)."""


@pytest.fixture
def tiny(tiny_model) -> str:
    return tiny_model


@pytest.fixture
def load_rows(tmp_path: Path):
    """Round-trip rows through a JSONL file and `datasets.load_dataset("json")`, as an export is read."""

    def load(rows: list[dict]):
        path = tmp_path / "export.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        return datasets.load_dataset("json", data_files=str(path), split="train", cache_dir=str(tmp_path / "hf"))

    return load


def test_template_passes_trl_checks(tiny):
    from transformers import AutoTokenizer
    from trl.chat_template_utils import (
        is_chat_template_prefix_preserving,
        is_chat_template_stop_token_trained,
        supports_tool_calling,
    )

    tokenizer = AutoTokenizer.from_pretrained(tiny)
    assert supports_tool_calling(tokenizer)
    assert is_chat_template_prefix_preserving(tokenizer)
    assert is_chat_template_stop_token_trained(tokenizer)


def test_dpo_conversational_with_tool_calls(tiny, load_rows, tmp_path):
    dataset = load_rows(preference_rows())
    config = trl.DPOConfig(**common_args(tmp_path), max_length=512)
    trainer = trl.DPOTrainer(model=tiny, args=config, train_dataset=dataset)
    decode = trainer.processing_class.decode
    with_tools, without_tools = trainer.train_dataset[0], trainer.train_dataset[2]
    # The `tools` JSON string reaches the system turn; a null `tools` renders no tool block.
    assert "<tools>" in decode(with_tools["prompt_ids"]) and "<tools>" not in decode(without_tools["prompt_ids"])
    # The prompt ends at the assistant header. DPO in TRL 1.16 has no assistant-only mask: the whole trajectory,
    # the tool's output included, is the completion whose log-probability is compared.
    assert decode(with_tools["prompt_ids"]).endswith("<|im_start|>assistant\n")
    chosen = decode(with_tools["chosen_ids"])
    assert chosen.startswith("<tool_call>") and "1 passed" in chosen and chosen.endswith("Final: 42<|im_end|>\n")
    train_one_step(trainer)


def test_kto_unpaired(tiny, load_rows, tmp_path):
    dataset = load_rows(kto_rows())
    config = trl.KTOConfig(**common_args(tmp_path), max_length=512, desirable_weight=1.0, undesirable_weight=1.0)
    trainer = trl.KTOTrainer(model=tiny, args=config, train_dataset=dataset)
    train_one_step(trainer)


def test_reward_model_with_margin(tiny, load_rows, tmp_path):
    dataset = load_rows(reward_rows())
    config = trl.RewardConfig(**common_args(tmp_path), max_length=512)
    trainer = trl.RewardTrainer(model=tiny, args=config, train_dataset=dataset)
    assert "margin" in trainer.train_dataset.column_names
    train_one_step(trainer)


def test_sft_messages_with_tools_assistant_only(tiny, load_rows, tmp_path):
    dataset = load_rows(sft_rows())
    config = trl.SFTConfig(**common_args(tmp_path), max_length=512, assistant_only_loss=True)
    trainer = trl.SFTTrainer(model=tiny, args=config, train_dataset=dataset)
    decode = trainer.processing_class.decode
    with_tools, without_tools = trainer.train_dataset[0], trainer.train_dataset[2]
    assert "<tools>" in decode(with_tools["input_ids"]) and "<tools>" not in decode(without_tools["input_ids"])
    # Only assistant turns are trained on: the tool's output "1 passed" never appears in the labels.
    trained = [token for token, label in zip(with_tools["input_ids"], with_tools["labels"]) if label != -100]
    trained_text = decode(trained)
    assert "Final: 42<|im_end|>" in trained_text and "<tool_call>" in trained_text
    assert "1 passed" not in trained_text and "What is" not in trained_text
    train_one_step(trainer)


def test_grpo_with_reward_kwargs(tiny, load_rows, tmp_path):
    dataset = load_rows(grpo_rows())
    seen: list[dict] = []

    def final_answer_reward(prompts, completions, answer, **kwargs) -> list[float | None]:
        seen.append({"answer": answer, **{key: kwargs[key] for key in ("task_id", "tests", "verifiers")}})
        texts = [completion[-1]["content"] for completion in completions]
        # None means "does not apply" to TRL: tasks without a reference answer are judged by other rewards.
        return [
            None if expected is None else float(f"Final: {expected}" in text) for text, expected in zip(texts, answer)
        ]

    def brevity_reward(prompts, completions, **kwargs) -> list[float]:
        # Varies between the two sampled completions, so group advantages are non-zero and the step moves weights.
        return [-len(completion[-1]["content"]) / 100 for completion in completions]

    # generation_batch_size = per_device_train_batch_size (2) x steps_per_generation (1): one prompt, two samples.
    config = trl.GRPOConfig(**common_args(tmp_path), num_generations=2, max_completion_length=8)
    trainer = trl.GRPOTrainer(
        model=tiny, reward_funcs=[final_answer_reward, brevity_reward], args=config, train_dataset=dataset
    )
    train_one_step(trainer)

    assert seen, "the reward function was never called"
    # One prompt, two generations: each dataset column arrives as a list with one entry per completion, the
    # prompt's value repeated and unchanged (a JSON null stays None, a list of str stays a list).
    call = seen[0]
    row = next(row for row in grpo_rows() if row["task_id"] == call["task_id"][0])
    for column in ("answer", "task_id", "tests", "verifiers"):
        assert call[column] == [row[column]] * 2
