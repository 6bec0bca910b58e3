"""``factory train``: every trainer trains the tiny model from a real export, through the CLI a user runs.

Each test exports from the real run of tests/_runs.py (replay model, bwrap sandboxes, real verifiers), trains
two optimizer steps on the tiny local model with one thread and a private ``HF_HOME``, and checks what a user
would: the saved weights differ from the starting ones, the loss moved, and the result records what the model
depends on.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch (the 'train' extra) is not installed")
pytest.importorskip("trl", reason="trl (the 'train' extra) is not installed")
safetensors = pytest.importorskip("safetensors.torch")

from factory.export import export  # noqa: E402
from factory.store import Store  # noqa: E402

STEPS = ("--max-steps", "2", "--batch-size", "2", "--lr", "1e-3", "--seed", "0")


@pytest.fixture(autouse=True)
def _quiet_machine(one_torch_thread, tmp_path, monkeypatch):
    """One thread (HF_HOME is the test's own folder: tests/conftest.py)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def exported(db: Path, fmt: str, folder: Path, suffix: str = ".jsonl") -> Path:
    with Store.open(db, read_only=True) as store:
        return export(store, fmt, ["r1"], folder / f"{fmt}{suffix}").path


def weights(folder: Path) -> dict:
    found: dict = {}
    for path in sorted(Path(folder).glob("*.safetensors")):
        found.update(safetensors.load_file(str(path)))
    assert found, f"no safetensors in {folder}"
    return found


def changed(before: dict, after: dict) -> list[str]:
    """Tensors present in both whose values differ (a new head, absent before, does not count)."""
    return [name for name, tensor in after.items()
            if name in before and before[name].shape == tensor.shape and not torch.equal(before[name], tensor)]


def train(cli, name: str, data: Path, model: str, output: Path, *extra: str) -> dict:
    result = cli("train", name, "--data", data, "--model", model, "--output", output, *STEPS, *extra, "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary == {k: v for k, v in json.loads((output / "train_result.json").read_text()).items()
                       if k != "log_history"}
    return summary


def test_the_option_table_is_what_the_trainer_configs_say():
    """`factory train NAME --help` reads a written-out table (no TRL import); it must match the configs."""
    from factory.trainers import CONFIG_FIELDS, describe_fields, load_trainer, trainer_names

    assert set(CONFIG_FIELDS) == set(trainer_names())
    for name in trainer_names():
        assert CONFIG_FIELDS[name] == describe_fields(load_trainer(name)[0]), (
            f"{name}: the installed TRL documents its fields otherwise; print the table afresh with "
            "`python -m factory.trainers._fields` and paste it into factory/trainers/_fields.py")


def assert_trained(summary: dict, base: str, *, steps: int = 2) -> None:
    metrics = summary["metrics"]
    assert metrics["steps"] == steps
    assert metrics["first_loss"] is not None and metrics["loss_moved"], metrics
    moved = changed(weights(Path(base)), weights(Path(summary["model_dir"])))
    assert moved, "the saved checkpoint equals the starting weights"


def test_dpo_trains_from_a_dpo_export_and_records_what_it_depends_on(cli, exported_run, tiny_model, tmp_path):
    data = exported(exported_run, "dpo", tmp_path)
    summary = train(cli, "dpo", data, tiny_model, tmp_path / "out", "--max-length", "512")
    assert_trained(summary, tiny_model)
    manifest = json.loads(data.with_name(data.name + ".manifest.json").read_text())
    provenance = summary["provenance"]
    assert provenance["data"]["dataset_hash"] == manifest["dataset_hash"]
    assert provenance["data"]["run_ids"] == ["r1"] and provenance["data"]["rows"] == manifest["rows"]
    assert provenance["policy"]["kind"] == "folder" and provenance["seed"] == 0
    assert provenance["config"]["use_cpu"] is True and provenance["config"]["bf16"] is False
    assert provenance["config"]["gradient_checkpointing"] is False
    assert provenance["versions"]["trl"]
    assert summary["adapter_dir"] is None
    assert (tmp_path / "out" / "loss.png").stat().st_size > 0


def test_dpo_with_lora_saves_the_adapter_and_a_merged_checkpoint(cli, exported_run, tiny_model, tmp_path):
    from transformers import AutoModelForCausalLM

    data = exported(exported_run, "dpo", tmp_path)
    summary = train(cli, "dpo", data, tiny_model, tmp_path / "out", "--lora", "--max-length", "512",
                    "--set", "lora_r=4", "--set", "beta=0.2")
    assert (Path(summary["adapter_dir"]) / "adapter_config.json").is_file()
    assert summary["provenance"]["trl_config"]["beta"] == 0.2
    assert_trained(summary, tiny_model)
    merged = AutoModelForCausalLM.from_pretrained(summary["model_dir"])
    assert not any("lora" in name for name, _ in merged.named_parameters())  # merged, not an adapter


def test_kto_takes_its_class_weights_from_the_manifest(cli, exported_run, tiny_model, tmp_path):
    data = exported(exported_run, "kto", tmp_path)
    manifest = json.loads(data.with_name(data.name + ".manifest.json").read_text())["kto"]
    summary = train(cli, "kto", data, tiny_model, tmp_path / "out", "--max-length", "512")
    assert_trained(summary, tiny_model)
    config = summary["provenance"]["trl_config"]
    assert (config["desirable_weight"], config["undesirable_weight"]) == (
        manifest["desirable_weight"], manifest["undesirable_weight"])
    assert any("from the manifest" in w for w in summary["warnings"])


def test_sft_trains_on_the_assistant_turns(cli, exported_run, tiny_model, tmp_path):
    data = exported(exported_run, "sft", tmp_path, ".parquet")
    summary = train(cli, "sft", data, tiny_model, tmp_path / "out", "--max-length", "512")
    assert_trained(summary, tiny_model)
    assert summary["provenance"]["trl_config"]["assistant_only_loss"] is True


def test_reward_model_from_pairs_with_margins(cli, exported_run, tiny_model, tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    data = exported(exported_run, "reward", tmp_path)
    summary = train(cli, "reward", data, tiny_model, tmp_path / "out", "--max-length", "512")
    assert summary["metrics"]["objective"] == "pairwise"
    assert_trained(summary, tiny_model)
    scorer = AutoModelForSequenceClassification.from_pretrained(summary["model_dir"])
    tokenizer = AutoTokenizer.from_pretrained(summary["model_dir"])
    assert scorer.config.num_labels == 1
    text = tokenizer.apply_chat_template([{"role": "user", "content": "2+2?"},
                                          {"role": "assistant", "content": "Final: 4"}], tokenize=False)
    with torch.no_grad():
        score = scorer(**tokenizer(text, return_tensors="pt")).logits
    assert score.shape == (1, 1) and torch.isfinite(score).all()


def test_regression_reward_model_from_the_scalar_file(cli, exported_run, tiny_model, tmp_path):
    exported(exported_run, "reward", tmp_path)
    scalar = tmp_path / "reward.scalar.jsonl"
    summary = train(cli, "reward", scalar, tiny_model, tmp_path / "out", "--max-length", "512")
    assert summary["metrics"]["objective"] == "regression"
    assert summary["provenance"]["data"]["format"] == "reward-scalar"
    assert summary["provenance"]["data"]["dataset_hash"]  # the scalar file is described by its pair file's manifest
    assert_trained(summary, tiny_model)


def test_grpo_rewards_completions_with_the_task_verifiers(cli, exported_run, tiny_model, tmp_path):
    data = exported(exported_run, "grpo", tmp_path)
    summary = train(cli, "grpo", data, tiny_model, tmp_path / "out", "--num-generations", "2",
                    "--max-completion-length", "8")
    metrics = summary["metrics"]
    assert metrics["steps"] == 2
    # every completion of the answer tasks and of the code task went through a verifier (tests: in bwrap)
    assert metrics["reward_scored"] == 4 and metrics.get("reward_unscored", 0) == 0
    history = json.loads((tmp_path / "out" / "train_result.json").read_text())["log_history"]
    assert any("rewards/verifiers/mean" in entry for entry in history)


def test_grpo_learns_from_a_verifier_that_separates_completions(cli, tiny_model, tmp_path, replay_file):
    """The tiny model's babble fails the answer and tests verifiers alike (no advantage, no update); a rules
    task scores each completion by the share of banned letters it avoids, so the group's rewards differ."""
    from factory.tasks import Rules, Task
    from tests._runs import fork_run

    task = Task(id="no-vowels", prompt="Reply without using the letters a, e, i, o, u, t, n or s.",
                rules=Rules(banned_phrases=list("aeioutns")))
    db = tmp_path / "rules.duckdb"
    fork_run(db, replay_file([{"prompt_contains": "letters", "response": {"text": "Hmm, why my rhythm."}}]),
             branches=2, tasks=[task])
    data = exported(db, "grpo", tmp_path)
    summary = train(cli, "grpo", data, tiny_model, tmp_path / "out", "--num-generations", "4",
                    "--max-completion-length", "12", "--batch-size", "4", "--set", "temperature=1.5")
    history = json.loads((tmp_path / "out" / "train_result.json").read_text())["log_history"]
    assert any(entry.get("rewards/verifiers/std", 0) > 0 for entry in history), history
    assert summary["metrics"]["reward_rules_passes"] >= 0 and summary["metrics"]["reward_scored"] == 8
    assert_trained(summary, tiny_model)


def test_resume_continues_from_the_last_checkpoint(cli, exported_run, tiny_model, tmp_path):
    data = exported(exported_run, "dpo", tmp_path)
    out = tmp_path / "out"
    first = cli("train", "dpo", "--data", data, "--model", tiny_model, "--output", out, "--max-steps", "1",
                "--batch-size", "2", "--save-steps", "1", "--max-length", "256", "--json")
    assert first.exit_code == 0, first.output
    assert (out / "checkpoint-1").is_dir()
    summary = train(cli, "dpo", data, tiny_model, out, "--resume", "--save-steps", "1", "--max-length", "256")
    assert summary["provenance"]["resumed_from"].endswith("checkpoint-1")
    assert summary["metrics"]["steps"] == 2


def test_bad_input_is_named_by_file_line_and_field(cli, exported_run, tiny_model, tmp_path):
    kto = exported(exported_run, "kto", tmp_path)
    result = cli("train", "dpo", "--data", kto, "--model", tiny_model, "--output", tmp_path / "o1")
    assert result.exit_code == 2 and f"{kto}: field 'format'" in result.stderr

    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps({"prompt": "p", "chosen": "a", "rejected": "b"}) + "\n"
                      + json.dumps({"prompt": "p", "chosen": "", "rejected": "b"}) + "\n")
    result = cli("train", "dpo", "--data", broken, "--model", tiny_model, "--output", tmp_path / "o2")
    assert result.exit_code == 2 and f"{broken}:2: field 'chosen'" in result.stderr

    config = tmp_path / "c.yaml"
    config.write_text("beta: 0.1\nbetta: 0.2\n")
    dpo = exported(exported_run, "dpo", tmp_path)
    result = cli("train", "dpo", "--data", dpo, "--model", tiny_model, "--output", tmp_path / "o3",
                 "--config", config)
    assert result.exit_code == 2 and f"{config}:2: field 'betta'" in result.stderr

    result = cli("train", "dpo", "--data", dpo, "--model", tmp_path / "nowhere", "--output", tmp_path / "o4")
    assert result.exit_code == 2 and "nowhere" in result.stderr

    result = cli("train", "dpo", "--data", dpo, "--model", tiny_model, "--output", tmp_path / "o5", "--resume")
    assert result.exit_code == 2 and "checkpoint" in result.stderr
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()  # nothing half-written


def test_rows_trl_drops_for_length_are_counted(cli, exported_run, tiny_model, tmp_path):
    """TRL drops a DPO row whose prompt alone fills --max-length: all of them is an error, some a warning."""
    dpo = exported(exported_run, "dpo", tmp_path)
    rows = len(dpo.read_text().splitlines())
    # The tiny model's chat template makes the answer tasks' prompts 117 tokens, the code task's 220.
    result = cli("train", "dpo", "--data", dpo, "--model", tiny_model, "--output", tmp_path / "short",
                 "--max-length", "64", *STEPS)
    assert result.exit_code == 2
    assert [line for line in result.stderr.splitlines() if line.startswith("error:")] == [  # besides TRL's bars
        f"error: --max-length 64: all {rows} row(s) of {dpo} are too long for it (TRL drops a row that would leave "
        "nothing to learn from once cut), so nothing is left to train on; raise --max-length"]
    assert "Traceback" not in result.output

    summary = train(cli, "dpo", dpo, tiny_model, tmp_path / "some", "--max-length", "160")
    [warning] = [w for w in summary["warnings"] if "--max-length" in w]
    assert warning == (f"--max-length 160: TRL dropped 1 of {rows} row(s) of {dpo} as too long; "
                       "raise --max-length to keep them")


def test_two_processes_train_one_model_and_report_once(exported_run, tiny_model, tmp_path):
    """The multi-process path GPUs use (one process per device, gradients all-reduced), on two CPU processes."""
    import subprocess
    import sys

    data = exported(exported_run, "dpo", tmp_path)
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "factory.cli", "train", "dpo",
         "--data", str(data), "--model", tiny_model, "--output", str(out), *STEPS, "--max-length", "256", "--json"],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)  # one JSON document: only the main process reports
    assert summary["provenance"]["world_size"] == 2
    assert_trained(summary, tiny_model)


def test_the_data_is_checked_against_its_manifest(exported_run, tmp_path):
    from factory.trainers import load_training_data

    data_file = exported(exported_run, "dpo", tmp_path)
    data = load_training_data(data_file, "dpo")
    assert data.file_sha256 == json.loads(data_file.with_name(data_file.name + ".manifest.json").read_text())[
        "file_sha256"]
    assert not [w for w in data.warnings if "changed since" in w]
    data_file.write_text("".join(data_file.read_text().splitlines(keepends=True)[:-1]))  # a row dropped by hand
    assert any("changed since it was exported" in w for w in load_training_data(data_file, "dpo").warnings)


def test_checking_training_data_imports_neither_polars_nor_the_store(exported_run, tmp_path):
    """Every trainer validates its file first; that costs no import a plain TRL script would not make."""
    import subprocess
    import sys

    data = exported(exported_run, "dpo", tmp_path)
    code = ("import sys\nfrom factory.export import validate_file\nimport factory.trainers\n"
            f"validate_file({str(data)!r}, 'dpo')\n"
            "print(sorted(m for m in ('polars', 'duckdb', 'pydantic') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
