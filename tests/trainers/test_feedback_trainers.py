"""Hint distillation, RW-SFT and Span-KTO on the tiny model: each does what its formula says, where it says.

- ``hint``: the KL at the hinted turn falls, and that turn's tokens move more than the other turns' (a ratio);
- ``rw-sft``: a span of weight 0 has exactly zero gradient at its logits;
- ``span-kto``: positive spans' log-ratios to the reference rise and negative spans' fall;
- each trains through ``factory train NAME --model tiny`` on the export fixtures (tests/data/feedback).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch (the 'train' extra) is not installed")
pytest.importorskip("trl", reason="trl (the 'train' extra) is not installed")

from factory.errors import ConfigError  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "data" / "feedback"

# Plain-text turns with few words in common, so that what one turn's training does to another is not the same
# tokens moving in both.
CONVERSATION = [
    {"role": "user", "content": "Make the tests pass."},
    {"role": "assistant", "content": "Let me look at the code first."},
    {"role": "user", "content": "Go on."},
    {"role": "assistant", "content": "I will delete the test."},
    {"role": "user", "content": "And then?"},
    {"role": "assistant", "content": "Done, all green."},
]
HINT = {"role": "user", "content": "Hint: fix the function, not the test."}
TURN = 3  # the message index of assistant turn 1, the hinted one


@pytest.fixture(autouse=True)
def _quiet_machine(one_torch_thread, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


@pytest.fixture
def policy(tiny_model):
    from factory.trainers import load_policy, resolve_policy

    return load_policy(resolve_policy(tiny_model), dtype="float32")


def _config(cls, tmp_path: Path, **values):
    values = {"per_device_train_batch_size": 2, **values}
    return cls(output_dir=str(tmp_path / "out"), seed=0, logging_steps=1, lr_scheduler_type="constant",
               disable_tqdm=True, **values)


def _turn_logps(model, tokenizer, messages) -> list:
    """Each assistant turn's token log-probabilities under ``model``, the conversation given whole."""
    from factory.trainers._feedback import assistant_runs, template_for

    rendered = tokenizer.apply_chat_template(messages, chat_template=template_for(tokenizer), tokenize=True,
                                             return_dict=True, return_assistant_tokens_mask=True)
    ids = torch.tensor([rendered["input_ids"]])
    with torch.no_grad():
        logps = torch.log_softmax(model(input_ids=ids).logits[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0]
    return [logps[start - 1:end - 1] for start, end in assistant_runs(rendered["assistant_masks"])]


def _prime(model, tokenizer) -> None:
    """Teach the random tiny model that the hint changes turn 1 (fix, not delete), so the teacher differs.

    A random model barely reads its context: with or without the hint it predicts alike, and there is nothing
    to distil. Forty steps on the two conversations make the hint matter (KL about 0.86 nats per token).
    """
    from factory.trainers._feedback import template_for

    def ids(messages):
        return torch.tensor([tokenizer.apply_chat_template(messages, chat_template=template_for(tokenizer),
                                                           tokenize=True, return_dict=True)["input_ids"]])

    fixed = {"role": "assistant", "content": "I will fix the function."}
    sequences = [ids(CONVERSATION[:TURN] + [HINT, fixed]), ids(CONVERSATION)]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(40):
        loss = sum(model(input_ids=s, labels=s).loss for s in sequences)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def test_hint_distillation_lowers_the_turns_kl_and_leaves_the_other_turns_nearly_alone(policy, tmp_path):
    from factory.trainers import HintConfig
    from factory.trainers._feedback import hint_examples, template_for
    from factory.trainers._hint import HintCollator, HintTrainer

    model, tokenizer = policy
    _prime(model, tokenizer)
    row = {"prompt": CONVERSATION[:TURN], "teacher_prompt": CONVERSATION[:TURN] + [HINT],
           "completion": [CONVERSATION[TURN]], "turn": 1, "run_id": "r", "task_id": "t", "branch_index": 0}
    examples = hint_examples([(1, row)], tokenizer, template_for(tokenizer), tmp_path / "hints.jsonl")
    before = _turn_logps(model, tokenizer, CONVERSATION)
    trainer = HintTrainer(model=model, args=_config(HintConfig, tmp_path, max_steps=4, learning_rate=1e-3,
                                                    per_device_train_batch_size=1),
                          train_dataset=examples, data_collator=HintCollator(tokenizer.pad_token_id),
                          processing_class=tokenizer)
    trainer.train()
    kl = [entry["kl"] for entry in trainer.state.log_history if "kl" in entry]
    assert len(kl) == 4 and kl[0] > 0.1 and kl[-1] < 0.6 * kl[0], kl
    after = _turn_logps(model, tokenizer, CONVERSATION)
    moved = [float((a - b).abs().mean()) for a, b in zip(after, before, strict=True)]
    target, others = moved[1], [moved[0], moved[2]]
    assert target > 2 * max(others), moved  # measured: 1.18 against 0.19 and 0.44


def test_the_hinted_turn_must_render_alike_with_and_without_the_hint(policy, tmp_path):
    from factory.trainers._feedback import hint_examples, template_for

    _, tokenizer = policy
    row = {"prompt": CONVERSATION[:TURN], "teacher_prompt": CONVERSATION[:TURN] + [HINT],
           "completion": [{"role": "user", "content": "not the assistant"}], "turn": 1}
    with pytest.raises(ConfigError, match=r"hints\.jsonl:7: field 'completion': every message must be the"):
        hint_examples([(7, row)], tokenizer, template_for(tokenizer), tmp_path / "hints.jsonl")


def _spans(tokenizer, polarity: list[str]):
    from factory.trainers._feedback import SpanCollator, span_examples, template_for

    examples = span_examples([(1, {"messages": CONVERSATION, "polarity": polarity})], tokenizer,
                             template_for(tokenizer), Path("spans.jsonl"))
    return examples, SpanCollator(tokenizer.pad_token_id)(examples)


def test_rw_sft_gives_a_span_of_weight_zero_exactly_zero_gradient(policy, tmp_path):
    from factory.trainers import RWSFTConfig
    from factory.trainers._rwsft import rw_sft_loss

    model, tokenizer = policy
    _, batch = _spans(tokenizer, ["neutral", "positive", "neutral", "negative", "neutral", "neutral"])
    logits = model(input_ids=batch["input_ids"]).logits.detach().requires_grad_(True)
    loss, figures = rw_sft_loss(logits, batch, _config(RWSFTConfig, tmp_path, w_neg=0.0, w_neu=0.5).weights())
    loss.backward()
    grad = logits.grad[0, :-1].abs().sum(-1)  # position p predicts token p + 1, whose span is batch["span"][0, p]
    span, sign = batch["span"][0], batch["polarity"]
    negative = (span >= 0) & (sign[span.clamp(min=0)] == -1)
    positive = (span >= 0) & (sign[span.clamp(min=0)] == 1)
    assert negative.sum() > 0 and torch.all(grad[negative] == 0)
    assert torch.all(grad[positive] > 0)
    assert torch.all(grad[span < 0] == 0)  # prompts and headers: never in the loss
    assert set(figures) == {"nll_negative", "nll_neutral", "nll_positive"}


def test_a_polarity_on_a_users_message_is_refused_with_its_line_and_field(policy):
    _, tokenizer = policy
    with pytest.raises(ConfigError, match=r"spans\.jsonl:1: field 'polarity\[0\]': 'negative' on a 'user' message"):
        _spans(tokenizer, ["negative", "positive", "neutral", "negative", "neutral", "neutral"])


def test_span_kto_raises_positive_spans_and_lowers_negative_ones_against_the_reference(policy, tmp_path):
    from factory.trainers import SpanKTOConfig
    from factory.trainers._feedback import SpanCollator
    from factory.trainers._run import frozen_reference
    from factory.trainers._spankto import SpanKTOTrainer, span_logps

    model, tokenizer = policy
    examples, batch = _spans(tokenizer, ["neutral", "positive", "neutral", "negative", "neutral", "positive"])
    reference = frozen_reference(model)
    config = _config(SpanKTOConfig, tmp_path, max_steps=4, learning_rate=1e-3, beta=0.5)
    trainer = SpanKTOTrainer(model=model, ref_model=reference, args=config, train_dataset=examples * 2,
                             data_collator=SpanCollator(tokenizer.pad_token_id), processing_class=tokenizer)
    trainer.train()
    with torch.no_grad():
        ratio = span_logps(model, batch)[1] - span_logps(reference, batch)[1]
    sign = batch["polarity"]
    assert torch.all(ratio[sign > 0] > 0.5) and torch.all(ratio[sign < 0] < -0.5), ratio
    logged = [entry for entry in trainer.state.log_history if "z_ref" in entry]
    assert logged[-1]["rho_positive"] > logged[0]["rho_positive"]
    assert logged[-1]["rho_negative"] < logged[0]["rho_negative"]
    assert trainer.z_ref != 0.0



@pytest.fixture
def tiny_cached(tiny_model):
    """``--model tiny`` finds the session's tiny model in this test's cache (the same build, not built again)."""
    import shutil

    from factory.trainers import tiny_model_dir

    target = tiny_model_dir()
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(tiny_model, target)
    return target


@pytest.mark.parametrize(("trainer", "data", "extra", "figures"), [
    ("hint", "hints.jsonl", ("--set", "kl_direction=reverse", "--set", "max_target_turns_per_rollout=1"),
     {"kl", "kl_clipped_share", "temperature", "target_tokens"}),
    ("rw-sft", "spans.jsonl", ("--set", "w_neg=0.0"), {"nll_negative", "nll_neutral"}),
    ("span-kto", "spans.jsonl", ("--set", "beta=0.5"), {"z_ref", "kto_loss", "neutral_nll", "rho_negative"}),
])
def test_each_feedback_trainer_trains_the_tiny_model_from_the_cli(cli, tiny_cached, tmp_path, trainer, data, extra,
                                                                   figures):
    result = cli("train", trainer, "--data", FIXTURES / data, "--model", "tiny", "--output", tmp_path / "out",
                 "--max-steps", "1", "--batch-size", "4", "--lr", "1e-3", "--seed", "0", *extra, "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["trainer"] == trainer and summary["metrics"]["steps"] == 1
    logged = summary["metrics"]["first_loss"]
    assert logged is not None and logged == logged  # a number, not NaN
    written = json.loads((tmp_path / "out" / "train_result.json").read_text())
    assert figures <= set(written["log_history"][0])
    provenance = written["provenance"]
    assert provenance["data"]["file_sha256"].startswith("sha256:") and provenance["seed"] == 0
    assert provenance["policy"]["path"] == str(tiny_cached.resolve())
    for key, value in (item.split("=") for item in extra[1::2]):
        assert str(provenance["trl_config"][key]) == value
    if trainer == "hint":  # fb1's branch 1 has hints at turns 0 and 1: the limit keeps turn 0
        assert summary["metrics"]["hint_rows"] == {**summary["metrics"]["hint_rows"], "rows": 4, "after_turn_limit": 3,
                                                   "trained": 3}
        assert any("max_target_turns_per_rollout=1: 1 later hinted turn(s) left out" in w for w in summary["warnings"])
    else:
        assert summary["metrics"]["span_rows"]["spans"]["negative"] == 5


@pytest.mark.slow
def test_hint_distillation_end_to_end_on_the_embedded_model(cli, tmp_path):
    """Fork the example code tasks, accept the automatic proposals, LoRA-distil the hints, fork the result, power.

    Run with ``pytest -m slow -s`` to see each step's time, what was trained on and the power verdict.
    """
    import shutil
    import time

    from factory.trainers import load_policy, resolve_policy, save_policy

    pytest.importorskip("llama_cpp", reason="the embedded model needs the 'local' extra")
    pytest.importorskip("gguf", reason="reading the embedded GGUF needs the 'train' extra's gguf package")
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed")
    root = Path(__file__).resolve().parents[2]
    tasks = tmp_path / "code-tasks.jsonl"
    lines = (root / "examples" / "tasks.jsonl").read_text().splitlines()
    tasks.write_text("".join(line + "\n" for line in lines if "files" in json.loads(line)))
    db = tmp_path / "hint.duckdb"
    # Kept small: the trained policy forks through transformers (float32 on the CPU), several times slower
    # than the embedded engine the base forks with. The base forks through the embedded engine: forked through
    # transformers (3 turns of 160 tokens), its 6 failed branches gave no proposal with a hint.
    fork = ("--branches", "2", "--max-turns", "4", "--max-tokens", "256", "--sandbox", "bwrap", "--db", db)

    def step(name: str, *args) -> str:
        started = time.perf_counter()
        result = cli(*args)
        assert result.exit_code == 0, result.output
        print(f"[hint loop] {name}: {time.perf_counter() - started:.0f} s", flush=True)
        return result.stdout

    # The power check below therefore compares the trained policy on transformers with the base on llama.cpp
    # (the same weights, dequantized for training).
    base_dir = save_policy(*load_policy(resolve_policy("local")), tmp_path / "base")["model"]
    before = json.loads(step("fork local", "fork", tasks, "--model", "local", *fork, "--run-id", "before", "--json"))
    proposed = json.loads(step("feedback propose", "feedback", "propose", "before", "--db", db, "--json"))
    hinted = [p["feedback_id"] for p in proposed["proposals"] if p.get("hint")]
    assert hinted, f"no proposal with a hint on {before['verified'] - before['passed']} failed branch(es)"
    step("feedback accept", "feedback", "accept", *hinted, "--db", db)
    export = json.loads(step("export hints", "export", "hints", "--run", "before", "--db", db, "--out",
                             tmp_path / "data" / "hints.jsonl", "--json"))
    summary = json.loads(step("train hint (LoRA)", "train", "hint", "--data", tmp_path / "data" / "hints.jsonl",
                              "--model", f"hf:{base_dir}", "--lora", "--output", tmp_path / "policy",
                              "--max-steps", "4", "--batch-size", "2", "--lr", "1e-4", "--json"))
    assert summary["adapter_dir"] and summary["metrics"]["steps"] == 4
    history = json.loads((tmp_path / "policy" / "train_result.json").read_text())["log_history"]
    kl = [round(entry["kl"], 4) for entry in history if "kl" in entry]
    after = json.loads(step("fork hf:", "fork", tasks, "--model", f"hf:{summary['model_dir']}", *fork,
                            "--run-id", "after", "--json"))
    power = json.loads(step("power", "power", "--runs", "before", "after", "--db", db, "--json"))
    assert power["n"] > 0 and power["verdict"]
    print(f"[hint loop] before: {before['passed']}/{before['verified']} passed; {len(hinted)} hinted proposal(s) "
          f"accepted, {export['manifest']['rows']} hint row(s); train: KL per step {kl}; after: "
          f"{after['passed']}/{after['verified']} passed", flush=True)
    print(f"[hint loop] power: {power['k_a']}/{power['n']} vs {power['k_b']}/{power['n']}, p={power['p_value']}; "
          f"{power['verdict']}", flush=True)
