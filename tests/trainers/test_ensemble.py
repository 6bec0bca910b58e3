"""A reward-model ensemble on the tiny model: trained through `factory train reward --ensemble`, reloaded, and used by
`factory train grpo --reward-model DIR --uncertainty-penalty λ` (real TRL, real peft adapters, real sandboxes)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch (the 'train' extra) is not installed")
pytest.importorskip("trl", reason="trl (the 'train' extra) is not installed")
pytest.importorskip("peft", reason="peft (the 'train' extra) is not installed")

from click.testing import CliRunner  # noqa: E402

from factory.cli import main  # noqa: E402
from factory.errors import ConfigError  # noqa: E402
from factory.trainers import EnsembleReward, RewardEnsemble, read_detector_log  # noqa: E402
from factory.trainers._ensemble import ENSEMBLE_MANIFEST, _bootstrap_hash, bootstrap_indices  # noqa: E402

MEMBERS = 3
QUESTIONS = [("What is 2+2?", "4"), ("Name a colour.", "Blue"), ("Say hi.", "Hi"), ("Count to 3.", "1 2 3"),
             ("What is 3+5?", "8"), ("Name a fruit.", "Apple")]


def conversation(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def verbose_pairs(path: Path) -> Path:
    """Preference pairs with a verbose bias: the chosen answer wraps the rejected one in pleasantries."""
    rows = [{"prompt": [{"role": "user", "content": q}],
             "chosen": conversation(f"Great question! The answer is {a}. Let me know if you need anything else."),
             "rejected": conversation(a), "margin": 1.0} for q, a in QUESTIONS]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def invoke(*args: object):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def ensemble_dir(tiny_model, tmp_path_factory) -> Path:
    """Three members, one optimizer step each, trained through the CLI (one torch thread)."""
    folder = tmp_path_factory.mktemp("ensemble")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = invoke("train", "reward", "--data", verbose_pairs(folder / "pairs.jsonl"), "--model", tiny_model,
                        "--output", folder / "rm", "--ensemble", MEMBERS, "--max-steps", "1", "--batch-size", "2",
                        "--lr", "1e-3", "--seed", "7", "--json")
    finally:
        torch.set_num_threads(threads)
    assert result.exit_code == 0, result.output
    return folder / "rm"


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    """Scores and trains the tiny model (see tests/conftest.py)."""


PROMPTS = [[{"role": "user", "content": q}] for q, _ in QUESTIONS[:4]]
COMPLETIONS = [conversation(text) for text in ("4", "Blue, a lovely colour. Anything else?", "Hi!", "1, 2, 3.")]


def test_members_differ_by_seed_and_resample_and_the_manifest_says_how(ensemble_dir):
    manifest = json.loads((ensemble_dir / ENSEMBLE_MANIFEST).read_text())
    members = manifest["members"]
    assert [m["seed"] for m in members] == [7, 8, 9]
    rows = manifest["data"]["rows"]
    assert [m["bootstrap_hash"] for m in members] == [_bootstrap_hash(bootstrap_indices(rows, s)) for s in (7, 8, 9)]
    assert len({m["bootstrap_hash"] for m in members}) == MEMBERS
    assert all((ensemble_dir / m["adapter"] / "adapter_config.json").is_file() for m in members)
    summary = json.loads((ensemble_dir / "train_result.json").read_text())
    assert summary["metrics"]["ensemble"]["members"] == MEMBERS and summary["model_dir"] is None
    scores = RewardEnsemble.load(ensemble_dir).member_scores(PROMPTS, COMPLETIONS)
    assert len(scores) == MEMBERS and all(len(s) == len(COMPLETIONS) for s in scores)
    for i in range(MEMBERS):
        for j in range(i + 1, MEMBERS):
            assert max(abs(a - b) for a, b in zip(scores[i], scores[j])) > 1e-3, (i, j, scores)


def test_the_reloaded_ensemble_scores_as_the_trained_members_did(ensemble_dir, tmp_path):
    """The manifest keeps each member's scores of four training rows, taken from the trained model in memory; a
    reload gives them again, and a manifest whose scores no longer match (another base) is refused."""
    ensemble = RewardEnsemble.load(ensemble_dir, check=False)
    manifest = ensemble.manifest
    inputs = manifest["check_inputs"]
    again = ensemble.member_scores([r["prompt"] for r in inputs], [r["completion"] for r in inputs])
    assert again == [m["check_scores"] for m in manifest["members"]]
    assert RewardEnsemble.load(ensemble_dir).member_scores(PROMPTS, COMPLETIONS) == ensemble.member_scores(
        PROMPTS, COMPLETIONS)
    moved = tmp_path / "moved"
    moved.mkdir()
    for member in manifest["members"]:
        (moved / member["name"]).symlink_to(ensemble_dir / member["name"])
    manifest["members"][1]["check_scores"] = [s + 0.5 for s in manifest["members"][1]["check_scores"]]
    (moved / ENSEMBLE_MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ConfigError, match="member-1 scores its check texts"):
        RewardEnsemble.load(moved)


def test_the_penalty_lowers_each_reward_by_lambda_times_the_members_std(ensemble_dir):
    ensemble = RewardEnsemble.load(ensemble_dir)
    scores = ensemble.member_scores(PROMPTS, COMPLETIONS)
    logged: dict[str, float] = {}
    plain = EnsembleReward(ensemble, 0.0)(PROMPTS, COMPLETIONS)
    penalised = EnsembleReward(ensemble, 0.3)(PROMPTS, COMPLETIONS, log_metric=logged.__setitem__)
    for i, column in enumerate(zip(*scores)):
        assert plain[i] == pytest.approx(statistics.fmean(column), abs=1e-12)
        assert plain[i] - penalised[i] == pytest.approx(0.3 * statistics.pstdev(column), abs=1e-12)
    assert logged["ensemble/std"] == pytest.approx(statistics.fmean(map(statistics.pstdev, zip(*scores))))
    with pytest.raises(ConfigError, match="uncertainty-penalty"):
        EnsembleReward(ensemble, -0.1)


def grpo_rows(path: Path) -> Path:
    from factory.tasks import Rules, Task

    rows = [{"prompt": [{"role": "user", "content": q}],
             "task_spec": Task(id=f"t{i}", prompt=q, rules=Rules(banned_phrases=list("aeiou"))).model_dump_json()}
            for i, (q, _) in enumerate(QUESTIONS[:2])]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_grpo_with_the_ensemble_rewards_the_penalised_mean_and_logs_the_std(ensemble_dir, tiny_model, tmp_path):
    out = tmp_path / "grpo"
    result = invoke("train", "grpo", "--data", grpo_rows(tmp_path / "grpo.jsonl"), "--model", tiny_model,
                    "--output", out, "--reward-model", ensemble_dir, "--uncertainty-penalty", "0.5",
                    "--max-steps", "1", "--batch-size", "2", "--num-generations", "2", "--max-completion-length", "6",
                    "--seed", "0", "--json")
    assert result.exit_code == 0, result.output
    saved = json.loads((out / "train_result.json").read_text())
    assert saved["metrics"]["reward_model"]["members"] == MEMBERS
    assert saved["metrics"]["reward_model"]["uncertainty_penalty"] == 0.5
    assert saved["metrics"]["reward_model"]["mean_std"] > 0
    assert saved["log_history"][0]["ensemble/std"] > 0 and "rewards/reward_model/mean" in saved["log_history"][0]
    (step,) = read_detector_log(out / "hacking_log.jsonl")
    assert len(step.reward_std) == len(step.lengths) == 2 and min(step.reward_std) > 0
    assert set(step.rewards_by_function) == {"verifiers", "reward_model"}


def test_a_penalty_needs_a_reward_model_and_a_bad_std_line_is_named(tmp_path):
    data = grpo_rows(tmp_path / "grpo.jsonl")
    result = CliRunner().invoke(main, ["train", "grpo", "--data", str(data), "--output", str(tmp_path / "o"),
                                       "--uncertainty-penalty", "0.2"])
    assert result.exit_code != 0 and "--uncertainty-penalty needs --reward-model" in result.output
    log = tmp_path / "log.jsonl"
    log.write_text('{"step": 1, "lengths": [3, 4], "rewards": [0.1, 0.2], "reward_std": [0.5]}\n')
    with pytest.raises(ConfigError, match=r"log.jsonl:1.*reward_std"):
        read_detector_log(log)
