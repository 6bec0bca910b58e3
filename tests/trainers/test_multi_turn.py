"""Multi-turn GRPO on the tiny model: TRL's tool loop driving our sandbox environment, rewarded by our verifiers.

What is forced, and how: the tiny model is random and calls no tool by itself, so its sampling is steered
through TRL's own ``generation_kwargs`` with transformers' ``sequence_bias`` (a logits bias on token
sequences, keyed on the tokens before them): from the prompt, a +100 bias makes it write
``read_file answer.py``; after that tool's result, ``write_file answer.py`` with ``return 42`` or
``return 41`` (both biased alike, so the model's own logits pick one per rollout: the group gets passes and
fails); after ``wrote ... bytes``, ``submit``; after ``submitted: ...``, end of turn. The biases fire only where
the tool results the environment actually returned are in the context. Nothing else is scripted: TRL parses
the calls and runs the tool loop, our environment carries them out in real bwrap sandboxes (seeded with the
task's files, tests out of reach), the isolated tests verifier scores the episodes, and the loss is the
model's own log-probabilities (the bias only picks what is sampled).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch (the 'train' extra) is not installed")
trl = pytest.importorskip("trl", reason="trl (the 'train' extra) is not installed")
datasets = pytest.importorskip("datasets", reason="datasets (the 'train' extra) is not installed")

from factory.tasks import Task  # noqa: E402
from factory.trainers._environment import (  # noqa: E402
    Episodes,
    multi_turn_rows,
    parse_tool_calls_with,
    policy_token_counts,
)

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

TASK = Task(id="answer-42", prompt="answer() must return 42. Fix answer.py so the test passes.",
            files={"answer.py": "def answer():\n    return 0\n"},
            tests={"test_answer.py": "from answer import answer\n\n\ndef test_answer():\n    assert answer() == 42\n"},
            test_command="python -m pytest -q")


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    """Trains the tiny model (see tests/conftest.py)."""


def call(name: str, **arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call><|im_end|>"


def written(value: int) -> str:
    return f"def answer():\n    return {value}\n"


def rows_file(folder: Path) -> Path:
    """One GRPO export row for TASK, as `factory export grpo` writes it (the fork agent's opening messages)."""
    from factory.rollouts import ToolCallingAgent

    opening = ToolCallingAgent(None).opening(TASK)  # type: ignore[arg-type]  # the opening needs no model
    path = folder / "grpo.jsonl"
    spec = json.dumps(TASK.model_dump(mode="json"))
    path.write_text(json.dumps({"prompt": opening, "task_id": TASK.id, "task_spec": spec}) + "\n")
    return path


def tool_suffix(tokenizer, name: str, content: str) -> list[int]:
    """The tokens TRL appends after a tool call: the tool message and the next assistant header."""
    dummy = [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": name, "arguments": {}}}]}]
    prefix = tokenizer.apply_chat_template(dummy, tokenize=True, return_dict=False)
    full = tokenizer.apply_chat_template(dummy + [{"role": "tool", "name": name, "content": content}],
                                         add_generation_prompt=True, tokenize=True, return_dict=False)
    end = max(i for i, t in enumerate(prefix) if t == tokenizer.eos_token_id) + 1
    return full[end:]


def steering(tokenizer, context: int = 24) -> list[list]:
    """transformers' ``sequence_bias``: +100 on each token of the scripted turns, keyed on the context before it."""
    from factory.rollouts import ToolCallingAgent

    after_prompt = tokenizer.apply_chat_template(ToolCallingAgent(None).opening(TASK),  # type: ignore[arg-type]
                                                 add_generation_prompt=True, tokenize=True, return_dict=False)
    turns = [(after_prompt[-12:], call("read_file", path="answer.py")),
             *[(tool_suffix(tokenizer, "read_file", TASK.files["answer.py"]), call(
                 "write_file", path="answer.py", content=written(v))) for v in (42, 41)],
             (tool_suffix(tokenizer, "write_file", f"wrote {len(written(42))} bytes to answer.py"),
              call("submit", answer="answer() returns 42")),
             (tool_suffix(tokenizer, "submit", "submitted: answer() returns 42"), "<|im_end|>")]
    bias = {}
    for before, text in turns:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        for i in range(len(ids)):
            bias[tuple((list(before) + ids[:i])[-context:] + [ids[i]])] = 100.0
    return [[list(key), value] for key, value in bias.items()]


def sandbox_leftovers(owner: str) -> list[str]:
    """What this process's sandboxes for ``owner`` left in its sandbox folder."""
    from factory.sandbox import sandbox_root

    folder = sandbox_root() / f"{owner}-{os.getpid()}"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def trainer_for(tiny_model: str, folder: Path, episodes: Episodes, reward_funcs, generations: int = 4,
                **settings) -> trl.GRPOTrainer:
    from transformers import AutoTokenizer

    tokenizer = parse_tool_calls_with(AutoTokenizer.from_pretrained(tiny_model))
    data = datasets.load_dataset("json", data_files=str(rows_file(folder)), split="train",
                                 cache_dir=str(folder / "hf"))
    config = trl.GRPOConfig(
        output_dir=str(folder / "out"), max_steps=1, per_device_train_batch_size=generations,
        num_generations=generations, max_completion_length=400, learning_rate=1e-2, use_cpu=True, bf16=False,
        report_to="none",
        logging_steps=1, save_strategy="no", disable_tqdm=True, seed=1, beta=0.0, temperature=1.0,
        max_tool_calling_iterations=4, generation_kwargs={"sequence_bias": steering(tokenizer)}, **settings)
    return trl.GRPOTrainer(model=tiny_model, reward_funcs=reward_funcs, args=config,
                           train_dataset=multi_turn_rows(data, folder / "grpo.jsonl"), processing_class=tokenizer,
                           environment_factory=episodes.factories())


def test_episodes_call_the_agents_tools_in_a_sandbox_and_are_rewarded_by_the_tests(tiny_model, tmp_path):
    seen = {}

    def watch(prompts, completions, completion_ids, **kwargs):
        """A zero-weight reward function: what TRL handed the reward functions."""
        seen.update(completions=completions, completion_ids=completion_ids)
        return [0.0] * len(completions)

    with Episodes("bwrap") as episodes:
        trainer = trainer_for(tiny_model, tmp_path, episodes, [watch, episodes], reward_weights=[0.0, 1.0])
        before = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
        trainer.train()
        tokenizer = trainer.processing_class
        assert episodes.open_sandboxes() == 0
    completions = seen["completions"]
    for completion, ids in zip(completions, seen["completion_ids"]):
        roles = [m["role"] for m in completion]
        assert roles[:4] == ["assistant", "tool", "assistant", "tool"], roles
        # read_file ran in a sandbox seeded with the task's files, and its result is in the policy's context
        assert completion[1]["content"] == TASK.files["answer.py"]
        assert TASK.files["answer.py"] in tokenizer.decode(ids)
        assert completion[0]["tool_calls"][0]["function"]["name"] == "read_file"
    wrote = [c[2]["tool_calls"][0]["function"]["arguments"]["content"] for c in completions]
    assert set(wrote) == {written(42), written(41)}, wrote  # the group holds passes and fails
    # the policy's own tokens: the ids less the tool messages TRL inserted (what the hacking detector counts)
    own = policy_token_counts(completions, seen["completion_ids"], tokenizer)
    assert all(0 < n < len(ids) for n, ids in zip(own, seen["completion_ids"]))
    logged = trainer.state.log_history[0]
    assert sum(own) / len(own) == pytest.approx(logged["completions/mean_length"])  # TRL's count: sum(tool_mask)
    # rewards come from the isolated tests verifier: 1 for `return 42`, 0 for `return 41`
    passes = sum(w == written(42) for w in wrote)
    assert logged["rewards/verifiers/mean"] == pytest.approx(passes / len(wrote))
    assert episodes.counts["scored"] == 4 and episodes.counts["tests_passes"] == passes
    assert episodes.counts["sandboxes_started"] == episodes.counts["sandboxes_closed"] == 4
    assert episodes.counts["tool_calls"] == 12
    moved = sum(not torch.equal(before[k], v) for k, v in trainer.model.named_parameters())
    assert moved > 0
    assert sandbox_leftovers(episodes.owner) == []


def test_no_sandbox_is_left_behind_when_training_fails(tiny_model, tmp_path):
    """A reward function that fails after every episode's reset: the trainer stops, the sweep closes them all."""

    def broken(prompts, completions, **kwargs):
        raise RuntimeError("induced failure")

    with pytest.raises(RuntimeError, match="induced failure"), Episodes("bwrap") as episodes:
        trainer_for(tiny_model, tmp_path, episodes, [broken, episodes], generations=2).train()
    assert episodes.counts["sandboxes_started"] == 2 and episodes.open_sandboxes() == 0
    assert episodes.counts["sandboxes_closed"] == 2
    assert sandbox_leftovers(episodes.owner) == []


@pytest.mark.slow
def test_multi_turn_grpo_on_the_embedded_model_then_fork_and_power(cli, tmp_path, monkeypatch):
    """The loop on the embedded model and the example code tasks (files and tests): fork the base, export GRPO
    prompts, a few steps of multi-turn LoRA GRPO, fork the trained checkpoint, and `factory power` against the base.

    Both forks run through the same engine (transformers, float32: the GGUF dequantized), so that the power check
    compares training, not engines. A few steps on three tasks cannot be expected to move the pass rate; the test
    checks that the loop runs end to end and prints the verdict (``pytest -m slow -s``).
    """
    pytest.importorskip("gguf", reason="reading the embedded GGUF needs the 'train' extra's gguf package")
    import time

    from factory.trainers import load_policy, resolve_policy, save_policy

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    root = Path(__file__).resolve().parents[2]
    code_tasks = [line for line in (root / "examples" / "tasks.jsonl").read_text().splitlines()
                  if line.strip() and json.loads(line).get("files")]
    assert len(code_tasks) >= 3
    tasks = tmp_path / "code-tasks.jsonl"
    tasks.write_text("\n".join(code_tasks) + "\n")
    db = tmp_path / "loop.duckdb"
    fork = ("--branches", "2", "--max-turns", "3", "--max-tokens", "96", "--sandbox", "bwrap", "--db", db)

    def step(name: str, *args) -> dict:
        started = time.perf_counter()
        result = cli(*args)
        assert result.exit_code == 0, result.output
        print(f"[multi-turn loop] {name}: {time.perf_counter() - started:.0f} s", flush=True)
        return json.loads(result.stdout) if "--json" in args else {}

    base_dir = save_policy(*load_policy(resolve_policy("local")), tmp_path / "base")["model"]
    base = step("fork base", "fork", tasks, "--model", f"hf:{base_dir}", *fork, "--run-id", "base", "--json")
    step("export grpo", "export", "grpo", "--run", "base", "--db", db, "--out", tmp_path / "grpo.jsonl")
    summary = step("train grpo --multi-turn (LoRA)", "train", "grpo", "--data", tmp_path / "grpo.jsonl", "--model",
                   f"hf:{base_dir}", "--lora", "--multi-turn", "--output", tmp_path / "policy", "--max-steps", "3",
                   "--batch-size", "2", "--num-generations", "2", "--max-completion-length", "192", "--lr", "5e-5",
                   "--set", "max_tool_calling_iterations=3", "--json")
    metrics = summary["metrics"]
    assert summary["adapter_dir"] and metrics["steps"] == 3
    assert metrics["multi_turn"]["open_sandboxes_at_end"] == 0
    assert metrics["reward_sandboxes_started"] == metrics["reward_sandboxes_closed"] == 6
    after = step("fork trained", "fork", tasks, "--model", f"hf:{summary['model_dir']}", *fork, "--run-id", "after",
                 "--json")
    power = step("power", "power", "--runs", "base", "after", "--db", db, "--json")
    assert power["n"] > 0 and power["verdict"]
    print(f"[multi-turn loop] base: {base['passed']}/{base['verified']} passed; train: {metrics['steps']} steps, "
          f"rewards {metrics.get('first_reward')} -> {metrics.get('last_reward')}, tool calls "
          f"{metrics.get('reward_tool_calls', 0)}, {metrics['train_seconds']:.0f} s; after: "
          f"{after['passed']}/{after['verified']} passed", flush=True)
    print(f"[multi-turn loop] power: {power['k_a']}/{power['n']} vs {power['k_b']}/{power['n']}, "
          f"p={power['p_value']}; {power['verdict']}", flush=True)


def test_an_infrastructure_failure_is_unscored_not_zero(monkeypatch):
    """A sandbox backend that cannot start (registered at the edge, as any backend is): the episode's tools say so,
    its reward is None (TRL leaves it out of the group's mean), and it is counted as an infrastructure error."""
    from factory.errors import SandboxError
    from factory.sandbox import SANDBOXES, NoSandbox, register_sandbox

    monkeypatch.setattr(SANDBOXES, "_entries", dict(SANDBOXES._entries))

    @register_sandbox("unstartable")
    class Unstartable(NoSandbox):
        """Fails to start, as a backend whose engine is gone does."""

        async def start(self) -> None:
            raise SandboxError("the engine is gone")

    with Episodes("unstartable") as episodes:
        environment = episodes.factories()["workspace"]()
        environment.reset(task_spec=json.dumps(TASK.model_dump(mode="json")))
        assert environment.read_file("answer.py") == ("error: the sandbox did not start: SandboxError: "
                                                      "the engine is gone")
        completion = [{"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "read_file", "arguments": {"path": "answer.py"}}}]},
            {"role": "tool", "name": "read_file", "content": "error: ..."}]
        assert episodes(prompts=[[]], completions=[completion], environments=[environment]) == [None]
    assert episodes.counts["infra_errors"] == 1 and episodes.counts["scored"] == 0


def test_the_environments_tools_are_the_fork_agents():
    """What TRL renders from the environment's methods: the agent's tool names, descriptions and arguments."""
    import inspect

    from transformers.utils import get_json_schema

    from factory.rollouts import AGENT_TOOLS

    with Episodes("bwrap") as episodes:
        tools = {name: get_json_schema(method) for name, method in inspect.getmembers(
            episodes.factories()["workspace"](), predicate=inspect.ismethod)
            if not name.startswith("_") and name != "reset"}
        answer_tools = [name for name, _ in inspect.getmembers(episodes.factories()["answer"](),
                                                               predicate=inspect.ismethod)
                        if not name.startswith("_") and name != "reset"]
    assert sorted(tools) == sorted(tool.name for tool in AGENT_TOOLS) and answer_tools == []
    for tool in AGENT_TOOLS:
        rendered = tools[tool.name]["function"]
        assert rendered["description"] == tool.description
        assert set(rendered["parameters"]["properties"]) == set(tool.parameters["properties"])
        assert sorted(rendered["parameters"].get("required", [])) == sorted(tool.parameters["required"])
