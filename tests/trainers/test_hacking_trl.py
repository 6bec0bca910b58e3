"""The reward-hacking detector in a real TRL GRPO loop on the tiny model, and through `factory train grpo`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch (the 'train' extra) is not installed")
trl = pytest.importorskip("trl", reason="trl (the 'train' extra) is not installed")
datasets = pytest.importorskip("datasets", reason="datasets (the 'train' extra) is not installed")

from factory.errors import TrainingStoppedError  # noqa: E402
from factory.trainers import DetectorSettings, read_detector_log, replay_detector, watch_rewards  # noqa: E402

MAX_COMPLETION = 16


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    """Trains the tiny model (see tests/conftest.py)."""


PROMPTS = [[{"role": "user", "content": q}] for q in ("What is 2+2?", "Name a colour.", "Say hi.", "Count to 3.")]


def prompts_dataset(folder: Path, count: int = 4):
    rows = [{"prompt": prompt} for prompt in PROMPTS[:count]]
    path = folder / "prompts.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return datasets.load_dataset("json", data_files=str(path), split="train", cache_dir=str(folder / "hf"))


def grpo(tiny_model: str, folder: Path, reward_funcs, callback, steps: int) -> trl.GRPOTrainer:
    config = trl.GRPOConfig(output_dir=str(folder / "out"), max_steps=steps, per_device_train_batch_size=4,
                            num_generations=4, max_completion_length=MAX_COMPLETION, learning_rate=1e-3,
                            use_cpu=True, bf16=False, report_to="none", logging_steps=1, save_strategy="no",
                            disable_tqdm=True, seed=0, beta=0.0)
    return trl.GRPOTrainer(model=tiny_model, reward_funcs=reward_funcs, args=config,
                           train_dataset=prompts_dataset(folder, 2), callbacks=[callback])


def test_the_callback_records_every_logging_step_and_the_log_replays(tiny_model, tmp_path):
    """warn: the completions' token counts (TRL's completion_ids) and rewards per logging step, in the detector
    and in hacking_log.jsonl, which `detect` replays to the same report; the plot beside it."""
    calls = []

    def pays_for_length(prompts, completions, completion_ids, **kwargs):
        calls.append([len(ids) for ids in completion_ids])
        return [len(ids) / MAX_COMPLETION for ids in completion_ids]

    settings = DetectorSettings(warmup_steps=2, window=1)
    funcs, callback = watch_rewards([pays_for_length], "warn", settings, tmp_path / "out")
    trainer = grpo(tiny_model, tmp_path, funcs, callback, steps=4)
    trainer.train()
    assert [s.mean_length for s in callback.detector.steps] == [sum(c) / len(c) for c in calls]
    assert len(calls) == 4 and callback.detector.status.value == "OK"
    logged = read_detector_log(tmp_path / "out" / "hacking_log.jsonl")
    assert [obs.lengths for obs in logged] == calls
    assert replay_detector(logged, settings) == callback.detector.report()
    assert (tmp_path / "out" / "hacking.png").stat().st_size > 0
    assert callback.result()["report"]["steps"][-1]["length_z"] is not None


def eos_prone(tiny_model: str, folder: Path, target_logit: float = 2.0) -> str:
    """The tiny model with its end-of-turn logit raised so that it stops early (it otherwise runs to the length cap,
    leaving a length reward nothing to creep into): the output head is untied and the end token's row gets the
    direction of the mean final hidden state, scaled to put that token's logit near ``target_logit``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in PROMPTS]
    with torch.no_grad():
        states = torch.cat([model.model(**tokenizer(t, return_tensors="pt")).last_hidden_state[0] for t in texts])
        mean = states.mean(0)
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
        model.config.tie_word_embeddings = False
        row = model.lm_head.weight[tokenizer.eos_token_id]
        row += (target_logit - (states @ row).mean()) * mean / mean.dot(mean)
    model.save_pretrained(folder / "eos-prone")
    tokenizer.save_pretrained(folder / "eos-prone")
    return str(folder / "eos-prone")


def test_a_reward_that_pays_for_length_trips_the_detector_and_stop_ends_training(tiny_model, tmp_path):
    """Real length creep: a policy that starts out stopping early, rewarded per token, learns to stop later; the
    learning rate warms up over the detector's warm-up, so the baseline is the starting policy. The length rule fires,
    then HARD_STOP; training ends at that step with a checkpoint, and the reason is kept."""

    def pays_for_length(prompts, completions, completion_ids, **kwargs):
        return [len(ids) / 32 for ids in completion_ids]

    settings = DetectorSettings(warmup_steps=3, window=1)
    funcs, callback = watch_rewards([pays_for_length], "stop", settings, tmp_path / "out")
    config = trl.GRPOConfig(output_dir=str(tmp_path / "out"), max_steps=14, per_device_train_batch_size=16,
                            num_generations=4, max_completion_length=32, learning_rate=3e-4, warmup_steps=4,
                            top_k=50, use_cpu=True, bf16=False, report_to="none", logging_steps=1,
                            save_strategy="no", disable_tqdm=True, seed=0, beta=0.0)
    trainer = trl.GRPOTrainer(model=eos_prone(tiny_model, tmp_path), reward_funcs=funcs, args=config,
                              train_dataset=prompts_dataset(tmp_path), callbacks=[callback])
    trainer.train()
    steps = callback.detector.steps
    first = callback.detector.first_alarm
    print("\ntiny GRPO, length reward:", [(r.step, round(r.mean_length, 1), r.length_z and round(r.length_z, 2),
                                            r.status.value) for r in steps])
    assert first is not None and "length" in first.signals, [(r.mean_length, r.length_z, r.status) for r in steps]
    stopped = callback.detector.stopped_at
    assert stopped is not None and trainer.state.global_step == stopped < 14
    assert steps[-1].mean_length > steps[0].mean_length + 5  # the length crept
    assert (tmp_path / "out" / f"checkpoint-{stopped}").is_dir()
    assert f"step {stopped}" in callback.stop_reason and callback.result()["stop_reason"] == callback.stop_reason
    assert TrainingStoppedError.exit_code == 4


def test_factory_train_grpo_writes_the_series_the_log_and_the_plot(cli, exported_run, tiny_model, tmp_path):
    from tests.trainers.test_train import exported

    data = exported(exported_run, "grpo", tmp_path)
    out = tmp_path / "out"
    result = cli("train", "grpo", "--data", data, "--model", tiny_model, "--output", out, "--max-steps", "2",
                 "--batch-size", "2", "--num-generations", "2", "--max-completion-length", "8", "--seed", "0",
                 "--set", "hacking_warmup_steps=2", "--json")
    assert result.exit_code == 0, result.output
    outcome = json.loads((out / "train_result.json").read_text())["metrics"]["hacking_detector"]
    assert outcome["mode"] == "warn" and outcome["final_status"] == "OK" and outcome["stop_reason"] is None
    assert len(outcome["report"]["steps"]) == 2
    replay = cli("train", "detect", out / "hacking_log.jsonl", "--warmup-steps", "2", "--json")
    assert json.loads(replay.stdout) == outcome["report"]
    assert (out / "hacking.png").is_file() and (out / "loss.png").is_file()
    off = cli("train", "grpo", "--data", data, "--model", tiny_model, "--output", tmp_path / "off", "--max-steps",
              "1", "--batch-size", "2", "--num-generations", "2", "--max-completion-length", "8",
              "--hacking-detector", "off", "--json")
    assert off.exit_code == 0 and "hacking_detector" not in json.loads(off.stdout)["metrics"]
    assert not (tmp_path / "off" / "hacking_log.jsonl").exists()


def test_the_recorder_weighs_the_functions_into_the_total_and_keeps_each(tmp_path):
    """Two reward functions (one async, one leaving a completion unscored), TRL's weights: the total is the weighted
    sum of what was scored, and each function's rewards are kept."""
    import asyncio

    def correct(prompts, completions, **kwargs):
        return [1.0, None, 0.0]

    async def brief(prompts, completions, **kwargs):
        return [0.5, 0.5, None]

    funcs, callback = watch_rewards([correct, brief], "warn", DetectorSettings(), tmp_path, weights=[1.0, 2.0])
    ids = [[1, 2, 3], [4], [5, 6]]
    assert funcs[0](prompts=["p"] * 3, completions=["a", "b", "c"], completion_ids=ids) == [1.0, None, 0.0]
    assert asyncio.run(funcs[1](prompts=["p"] * 3, completions=["a", "b", "c"], completion_ids=ids)) == [0.5, 0.5, None]
    assert [f.__name__ for f in funcs] == ["correct", "brief"]
    observation = callback.recorder.drain(step=7)
    assert observation.step == 7 and observation.lengths == [3, 1, 2]
    assert observation.rewards == [2.0, 1.0, 0.0]
    assert observation.rewards_by_function == {"correct": [1.0, None, 0.0], "brief": [0.5, 0.5, None]}
    assert callback.recorder.drain(step=8) is None  # nothing generated since
    unwatched, none = watch_rewards([correct], "off", DetectorSettings(), tmp_path)
    assert unwatched == [correct] and none is None


@pytest.mark.slow
def test_the_detector_fires_before_a_length_and_correctness_reward_saturates(tiny_model, tmp_path):
    """Issue 35's real case, on fixed seeds: a reward paying per token plus a correctness term (the first token is the
    prompt's target, one the starting policy picks a fifth of the time or so); warn mode lets training run on, so the
    total reward's saturation (its 3-step moving average 90 % of the way from the first to the highest value) can be
    seen. The first alarm must come before it (bench/bench_hacking.py runs the same with a reward-model ensemble)."""
    import statistics

    policy = eos_prone(tiny_model, tmp_path)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tokenizer = AutoModelForCausalLM.from_pretrained(policy), AutoTokenizer.from_pretrained(policy)
    targets = {}
    for prompt in PROMPTS:
        ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        with torch.no_grad():
            probs = model(**ids).logits[0, -1].softmax(-1)
        targets[prompt[-1]["content"]] = next(t for t in probs.argsort(descending=True).tolist()
                                              if t != tokenizer.eos_token_id)

    def pays_for_length(prompts, completions, completion_ids, **kwargs):
        return [len(ids) / 32 for ids in completion_ids]

    def correctness(prompts, completions, completion_ids, **kwargs):
        return [float(bool(ids) and ids[0] == targets[p[-1]["content"]]) for p, ids in zip(prompts, completion_ids)]

    settings = DetectorSettings(warmup_steps=4, window=2)
    funcs, callback = watch_rewards([pays_for_length, correctness], "warn", settings, tmp_path / "out")
    config = trl.GRPOConfig(output_dir=str(tmp_path / "out"), max_steps=20, per_device_train_batch_size=16,
                            num_generations=4, max_completion_length=32, learning_rate=1e-4, warmup_steps=4,
                            top_k=50, use_cpu=True, bf16=False, report_to="none", logging_steps=1,
                            save_strategy="no", disable_tqdm=True, seed=0, beta=0.0)
    trainer = trl.GRPOTrainer(model=policy, reward_funcs=funcs, args=config, train_dataset=prompts_dataset(tmp_path),
                              callbacks=[callback])
    trainer.train()
    steps = callback.detector.steps
    rewards = [s.mean_reward for s in steps]
    smooth = [statistics.fmean(rewards[max(0, i - 2):i + 1]) for i in range(len(rewards))]
    saturated = next(s.step for s, v in zip(steps, smooth) if v >= smooth[0] + 0.9 * (max(smooth) - smooth[0]))
    first = callback.detector.first_alarm
    print("\ntiny GRPO, length + correctness:", [(s.step, round(s.mean_length, 1), round(s.mean_reward, 3),
                                                  s.status.value) for s in steps], "saturated at", saturated)
    assert max(smooth) > smooth[0] + 0.2  # the length reward did climb
    assert first is not None and first.step < saturated, (first, saturated)
