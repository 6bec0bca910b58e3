"""The closed loop a user runs: fork -> verify -> rank -> export -> train -> fork the trained policy -> power.

The fast test drives every step through the CLI on the tiny model (the replay model forks the first run);
the slow one (``pytest -m slow``) runs the loop on the embedded model: a LoRA DPO step on its own data, then
a second fork of the trained checkpoint and the power check between the two runs.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

pytest.importorskip("trl", reason="trl (the 'train' extra) is not installed")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

from factory.provenance import file_sha256  # noqa: E402
from factory.store import Store  # noqa: E402
from tests._runs import REPLIES, TASKS  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _quiet_machine(one_torch_thread, tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def ok(result) -> str:
    assert result.exit_code == 0, result.output
    return result.stdout


def test_fork_verify_rank_export_train_dpo_then_reload_and_generate(cli, tiny_model, tmp_path, write_jsonl,
                                                                   replay_file):
    tasks = write_jsonl([task.model_dump(mode="json", exclude_none=True) for task in TASKS])
    db = tmp_path / "loop.duckdb"
    ok(cli("fork", tasks, "--model", f"replay:{replay_file(REPLIES)}", "--branches", "4", "--sandbox", "bwrap",
           "--db", db, "--run-id", "r1"))
    ranking = json.loads(ok(cli("rank", "r1", "--db", db, "--json")))
    assert ranking
    ok(cli("export", "dpo", "--run", "r1", "--db", db, "--out", tmp_path / "data" / "dpo.jsonl"))
    summary = json.loads(ok(cli("train", "dpo", "--data", tmp_path / "data" / "dpo.jsonl", "--model", tiny_model,
                                "--output", tmp_path / "policy", "--max-steps", "2", "--batch-size", "2",
                                "--lr", "1e-3", "--max-length", "512", "--db", db, "--json")))
    assert summary["metrics"]["steps"] == 2 and summary["metrics"]["loss_moved"]
    assert summary["provenance"]["data"]["run_ids"] == ["r1"]
    # the export and the model are recorded under the run they came from, for `factory view`
    with Store.open(db, read_only=True) as store:
        recorded = {row["kind"]: row for row in store.artifacts("r1").iter_rows(named=True)}
    assert sorted(recorded) == ["export", "model"]
    model = recorded["model"]
    assert model["path"] == str((tmp_path / "policy").resolve())
    assert model["sha256"] == "sha256:" + file_sha256(tmp_path / "policy" / "train_result.json")
    headline = json.loads(model["meta"])
    assert headline["metrics"]["steps"] == 2 and headline["metrics"]["last_loss"] == summary["metrics"]["last_loss"]
    assert headline["model_dir"] == summary["model_dir"] and headline["data"]["run_ids"] == ["r1"]

    # the checkpoint reloads as a plain transformers model and generates
    model_dir = summary["model_dir"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 17 + 25?"}],
                                           add_generation_prompt=True, return_tensors="pt", return_dict=True)
    output = model.generate(**prompt, max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert output.shape[1] > prompt["input_ids"].shape[1]

    # ... and forks again, as the policy of a new run on the same tasks
    ok(cli("fork", tasks, "--model", f"hf:{model_dir}", "--branches", "4", "--max-turns", "1", "--max-tokens", "8",
           "--sandbox", "bwrap", "--db", db, "--run-id", "r2"))
    power = json.loads(ok(cli("power", "--runs", "r1", "r2", "--db", db, "--json")))
    assert power["n"] == 12 and power["arm_b"] == "r2"


@pytest.mark.slow
def test_closed_loop_on_the_embedded_model(cli, tmp_path):
    """Fork the embedded model, DPO it with LoRA on its own ranked branches, fork the result, compare the runs.

    A third run forks the untrained policy through the same engine as the trained one (transformers, float32),
    the control that separates what DPO did from what changing the engine did.

    Run with ``pytest -m slow -s`` to see each step's time and the power verdict.
    """
    pytest.importorskip("llama_cpp", reason="the embedded model needs the 'local' extra")
    tasks = ROOT / "examples" / "tasks.jsonl"
    db = tmp_path / "loop.duckdb"
    fork = ("--branches", "4", "--max-turns", "2", "--max-tokens", "96", "--sandbox", "bwrap", "--db", db)
    timings: dict[str, float] = {}

    def step(name: str, *args) -> str:
        started = time.perf_counter()
        out = ok(cli(*args))
        timings[name] = time.perf_counter() - started
        print(f"[closed loop] {name}: {timings[name]:.0f} s", flush=True)
        return out

    before = json.loads(step("fork local", "fork", tasks, "--model", "local", *fork, "--run-id", "before", "--json"))
    step("rank", "rank", "before", "--db", db)
    export = json.loads(step("export dpo", "export", "dpo", "--run", "before", "--db", db, "--out",
                             tmp_path / "data" / "dpo.jsonl", "--strategy", "all-pairs", "--json"))
    summary = json.loads(step("train dpo (LoRA)", "train", "dpo", "--data", tmp_path / "data" / "dpo.jsonl",
                              "--model", "local", "--lora", "--output", tmp_path / "policy", "--max-steps", "4",
                              "--batch-size", "2", "--lr", "5e-5", "--max-length", "768", "--json"))
    assert summary["adapter_dir"] and summary["metrics"]["steps"] == 4
    assert summary["provenance"]["policy"]["kind"] == "gguf"
    after = json.loads(step("fork hf:", "fork", tasks, "--model", f"hf:{summary['model_dir']}", *fork,
                            "--run-id", "after", "--json"))
    power = json.loads(step("power", "power", "--runs", "before", "after", "--db", db, "--json"))
    assert power["n"] > 0 and power["verdict"]
    # The control: the same policy untrained, dequantized and forked by the same engine, so that the comparison
    # with `after` measures DPO, not llama.cpp's Q4 against transformers' float32.
    from factory.trainers import load_policy, resolve_policy, save_policy

    base_dir = save_policy(*load_policy(resolve_policy("local")), tmp_path / "base")["model"]
    step("fork hf: (untrained)", "fork", tasks, "--model", f"hf:{base_dir}", *fork, "--run-id", "base")
    control = json.loads(step("power (control)", "power", "--runs", "base", "after", "--db", db, "--json"))
    assert control["n"] == power["n"]
    metrics = summary["metrics"]
    print(f"[closed loop] before: {before['passed']}/{before['verified']} passed; export: {export['manifest']['rows']} "
          f"pairs; train: {metrics['steps']} steps, loss {metrics['first_loss']} -> {metrics['last_loss']}, "
          f"{metrics['train_seconds']:.0f} s; after: {after['passed']}/{after['verified']} passed", flush=True)
    print(f"[closed loop] power: {power['k_a']}/{power['n']} vs {power['k_b']}/{power['n']}, "
          f"p={power['p_value']}; {power['verdict']}", flush=True)
    print(f"[closed loop] control (untrained, same engine): {control['k_a']}/{control['n']} vs "
          f"{control['k_b']}/{control['n']}, p={control['p_value']}; {control['verdict']}", flush=True)
