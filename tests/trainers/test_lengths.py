"""Long multi-turn prompts: the length limit comes from the data, and a prompt over it loses its oldest turns.

The example export is trained on the tiny model that ``--model tiny`` builds into the (per-test) cache, as a
newcomer would.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch", reason="torch (the 'train' extra) is not installed")
pytest.importorskip("trl", reason="trl (the 'train' extra) is not installed")
datasets = pytest.importorskip("datasets")

from factory.export import export  # noqa: E402
from factory.store import Store  # noqa: E402

SYSTEM = {"role": "system", "content": "You fix code. Use the tools."}
TASK = {"role": "user", "content": "factorial(0) returns 0. Fix solution.py so the tests pass."}


def turn(i: int) -> list[dict]:
    """An assistant call and its (long) tool result: one turn, never split."""
    call = {"role": "assistant", "content": f"Step {i}: run the tests.",
            "tool_calls": [{"type": "function", "function": {"name": "run",
                                                             "arguments": json.dumps({"command": "pytest -q"})}}]}
    return [call, {"role": "tool", "name": "run", "content": f"run {i}: " + "FAILED test_zero " * 20}]


def long_row() -> dict:
    prompt = [SYSTEM, TASK, *turn(1), *turn(2), {"role": "user", "content": "Keep going."}, *turn(3)]
    return {"prompt": prompt, "chosen": [{"role": "assistant", "content": "Fixed: return 1 for n <= 1."}],
            "rejected": [{"role": "assistant", "content": "I deleted the tests."}]}


def short_row() -> dict:
    return {"prompt": [SYSTEM, TASK], "chosen": [{"role": "assistant", "content": "Final: fixed."}],
            "rejected": [{"role": "assistant", "content": "Final: no."}]}


def test_a_prompt_over_the_limit_loses_its_oldest_turns_whole(tiny_model):
    from transformers import AutoTokenizer

    from factory.trainers._lengths import fit_prompts

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    rows = datasets.Dataset.from_list([long_row(), short_row()])
    _, measured = fit_prompts(rows, tokenizer, ("chosen", "rejected"), max_length=None, context=4096)
    assert (measured.source, measured.rows_cut, measured.max_length) == ("data", 0, measured.longest_row)
    _, capped = fit_prompts(rows, tokenizer, ("chosen", "rejected"), max_length=None, context=measured.longest_row - 1)
    assert capped.source == "context" and capped.max_length == measured.longest_row - 1 and capped.rows_cut == 1

    # room for the system message, the task prompt and the last two turns, not the first
    fitted, fit = fit_prompts(rows, tokenizer, ("chosen", "rejected"), max_length=measured.longest_row - 60,
                              context=None)
    prompt = fitted[0]["prompt"]
    assert [m["role"] for m in prompt] == ["system", "user", "assistant", "tool", "user", "assistant", "tool"]
    assert prompt[0]["content"] == SYSTEM["content"] and prompt[1]["content"] == TASK["content"]
    assert prompt[2]["content"] == "Step 2: run the tests."  # the oldest turn went, call and result together
    assert (fit.rows_cut, fit.messages_cut, fit.rows_over) == (1, 2, 0) and fit.tokens_cut >= 60
    assert fitted[1]["prompt"] == rows[1]["prompt"]  # a row that fits is left alone

    # however small the limit, the system message, the task prompt and the latest turn stay
    fitted, fit = fit_prompts(rows, tokenizer, ("chosen", "rejected"), max_length=64, context=None)
    assert [m["role"] for m in fitted[0]["prompt"]] == ["system", "user", "assistant", "tool"]
    assert fitted[0]["prompt"][2]["content"] == "Step 3: run the tests."
    assert fit.rows_over == 2  # both rows are still over: TRL's to truncate or drop, and counted


def test_cli_reports_the_prompts_it_cut(cli, tiny_model, tmp_path):
    data = tmp_path / "dpo.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in (long_row(), short_row())))
    result = cli("train", "dpo", "--data", data, "--model", tiny_model, "--output", tmp_path / "out", "--max-length",
                 "300", "--max-steps", "1", "--batch-size", "2")
    assert result.exit_code == 0, result.output
    fit = json.loads((tmp_path / "out" / "train_result.json").read_text())["metrics"]["prompt_fit"]
    assert fit["source"] == "option" and fit["max_length"] == 300 and fit["rows_cut"] == 1
    assert fit["messages_cut"] >= 2 and fit["tokens_cut"] > 0
    assert (f"1 prompt(s) cut from the left at message boundaries: {fit['messages_cut']} message(s), "
            f"{fit['tokens_cut']} token(s)") in result.output


def test_dpo_with_the_tiny_model_trains_on_every_row_of_the_example_export(cli, exported_run, tmp_path):
    """The export's code-task prompt carries every tool's schema (over TRL's 1024 default): nothing is dropped."""
    from factory.trainers import ensure_tiny_model, tiny_model_dir

    with Store.open(exported_run, read_only=True) as store:
        data = export(store, "dpo", ["r1"], tmp_path / "dpo.jsonl").path
    result = cli("train", "dpo", "--data", data, "--model", "tiny", "--output", tmp_path / "out", "--max-steps", "1",
                 "--batch-size", "4", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    fit = summary["metrics"]["prompt_fit"]
    assert fit["source"] == "data" and fit["max_length"] == fit["longest_row"] > 1024
    assert fit["rows_cut"] == fit["rows_over"] == 0
    assert not any("dropped" in warning for warning in summary["warnings"])
    assert summary["metrics"]["loss_mask"]["assistant_only"] is True
    assert summary["provenance"]["policy"]["path"] == str(tiny_model_dir().resolve())
    built = tiny_model_dir() / "config.json"
    stamp = built.stat().st_mtime_ns
    assert ensure_tiny_model() == tiny_model_dir() and built.stat().st_mtime_ns == stamp  # built once, then reused
