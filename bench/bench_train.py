"""DPO training overhead: ``factory train dpo`` against a plain TRL ``DPOTrainer`` script, in one run.

Goal (issue): on the same data and tiny model, ``factory train dpo`` has at
most 5% overhead against a plain TRL script, in training steps/s and in peak
memory (RSS), both measured in the same run.

1. ``setup`` (untimed): a tiny random Llama (``factory.trainers.build_tiny_model``,
   ``--hidden`` x ``--layers``, large enough that a step costs tens of ms so
   fixed per-step costs show fairly), and a DPO file of ``--pairs`` rows in the
   exporter's conversational format (``prompt``: system + user messages,
   ``chosen`` / ``rejected``: one assistant message each, every message with the
   exporter's null ``name`` / ``tool_call_id`` / ``tool_calls`` keys, plus
   ``tools``, ``margin`` and provenance columns as in
   ``tests/export/golden/dpo.jsonl``) of seeded, lognormally varied lengths,
   checked with ``factory export validate FILE --format dpo``. No manifest is
   written (``factory train`` warns and goes on); both sides read the same file.

2. ``factory``: ``factory train dpo --data FILE --model DIR --output OUT
   --max-steps N --batch-size B --lr LR --max-length L --seed S --set
   disable_tqdm=true --json`` in a fresh process: loads and validates the data,
   loads the policy, trains, saves ``OUT/model``, ``train_result.json`` and
   ``loss.png``.

3. ``baseline``: this file run again as a plain script (``--baseline-child``,
   which imports nothing from ``factory``): ``AutoTokenizer`` and
   ``AutoModelForCausalLM.from_pretrained``, ``datasets.load_dataset("json")``
   (a fresh cache folder per run, as ours uses), ``trl.DPOConfig`` with the
   same settings our CLI applies on a CPU (``use_cpu``, no bf16, no activation
   checkpointing, ``logging_steps=1``, ``save_strategy="no"``,
   ``report_to="none"``, ``disable_tqdm``) and the same steps, batch size,
   learning rate, max length and seed, ``trl.DPOTrainer(...).train()``, then
   ``trainer.save_model(OUT/model)`` (ours saves a checkpoint too).

Both sides run in fresh processes with the same environment
(``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` = ``--threads``, which torch
honours; ``HF_HOME`` in the work folder; offline), alternating ABBA over
``--repeats`` rounds after one untimed warm-up pair of 4-step runs (it fills
the page cache with torch and friends). One torch thread by default: on a 2-core machine
shared with other work, two threads that must meet at every op's barrier
slow down 10-50x whenever another process takes a core, which swamps any
difference between the sides. For each run the parent takes, the same way
for both sides:

- steps/s as the trainer reports it: ``global_step / train_runtime`` (TRL's
  timer around its training loop; ours read from ``train_result.json``'s log,
  the baseline's from ``train().metrics``); also the wall time of the whole
  ``trainer.train()`` call (ours: ``metrics.train_seconds``, from which our
  ``metrics.steps_per_second`` is computed);
- wall seconds of the whole process, from spawn to exit;
- peak RSS of the process, ``ru_maxrss`` from ``os.wait4`` (ours also reports
  its own, read in-process after saving: printed as a check), and its CPU
  seconds.

Medians are reported, with ratios factory / baseline. The effective TRL
configs of the two sides are compared key by key (paths aside), so that a
setting that differs is printed, not silently measured.

``--profile`` (untimed against the goal) finds where an overhead goes: one run
of each side under ``cProfile``, phase by phase (the leftover of the process
wall is start-up and imports), and, in a fresh process that has already
imported what the baseline imports, the RSS and seconds each further package
``factory train dpo`` imports adds.

The machine may be shared: before each run the parent waits (up to
``--quiet-wait`` seconds) for other processes to go quiet, and prints the
CPU-seconds other processes used during each run, and the load average at
start and end; treat runs where others were busy with suspicion.

Usage: python bench/bench_train.py [--steps 40] [--repeats 3] [--pairs 400] [--hidden 128] [--layers 2]
       [--batch-size 2] [--max-length 256] [--lr 5e-6] [--threads 1] [--seed 0] [--workdir DIR]
       [--quiet-wait 10] [--no-warmup] [--profile] [--quick] [--json]
       python bench/bench_train.py --grpo [--steps 4] [--generations 4] [--threads 1] [--json]

``--grpo`` measures multi-turn GRPO instead (issue 30): a few steps on the tiny model of the task and scripted
episodes of ``tests/trainers/test_multi_turn.py`` (read_file, write_file ``return 42`` or ``41``, submit; steered
by ``sequence_bias``), in this process, ours (:class:`factory.trainers._environment.Episodes`: a bwrap sandbox per
rollout, the fork's verification pipeline after each episode) against a plain TRL environment with the same tools
over a dict in memory, rewarded in Python. It prints rollouts/s for both and where each run's wall time went:
the sandboxes (start, tool calls, collect/close/verify), generation (TRL's ``_generate`` less the tools' sandbox
time), the loss's forward and backward (``training_step`` less ``_generate_and_score_completions``), and the rest.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _results import cpu_busy_seconds, loadavg  # bench/ is on sys.path

GOAL = 0.05  # at most 5% overhead
QUIET_SHARE = 0.10  # a run is undisturbed when other processes used at most this share of one core meanwhile
WORDS = ["sort", "parse", "list", "string", "file", "number", "date", "csv", "json", "http", "count", "sum", "reverse",
         "merge", "split", "filter", "map", "tree", "graph", "path", "queue", "stack", "cache", "retry", "timeout",
         "error", "log", "config", "table", "row", "column", "index", "key", "value", "token", "batch", "stream",
         "socket", "thread", "lock", "async", "test", "mock", "fixture", "the", "a", "of", "and", "then", "so",
         "because", "we", "it", "is", "returns", "first", "next", "carry", "one", "two", "seven", "twelve."]
# Config keys that name places or are filled in per run, not settings that change the work.
PATH_KEYS = {"output_dir", "logging_dir", "data_file", "model_name_or_path", "run_name", "hub_model_id"}
# Phases of a run the profile times: (label, substrings of cProfile's "file:line(name)"). The top-level ones do not
# overlap, so the process wall left over is start-up and imports; indented ones are parts of the phase above them.
PHASES = {
    "factory": [
        ("load + validate data (load_training_data; imports datasets)", "trainers/_data.py:",
         "(load_training_data)"),
        ("  validate_file", "(validate_file)"),
        ("  file sha256", "trainers/_data.py:", "(_sha256)"),
        ("  datasets.load_dataset", "datasets/load.py:", "(load_dataset)"),
        ("load policy (load_policy)", "trainers/_models.py:", "(load_policy)"),
        ("DPOConfig(...)", "trainers/_config.py:", "(__post_init__)"),
        ("DPOTrainer(...)", "trl/trainer/dpo_trainer.py:", "(__init__)"),
        ("trainer.train()", "transformers/trainer.py:", "(train)"),
        ("save (save_policy)", "trainers/_models.py:", "(save_policy)"),
        ("provenance (_versions)", "trainers/_run.py:", "(_versions)"),
        ("loss.png (_plot_losses)", "trainers/_run.py:", "(_plot_losses)"),
    ],
    "baseline": [
        ("datasets.load_dataset", "datasets/load.py:", "(load_dataset)"),
        ("load policy (from_pretrained)", "bench_train.py:", "(_load_policy)"),
        ("DPOConfig(...)", "trl/trainer/dpo_config.py:", "(__post_init__)"),
        ("DPOTrainer(...)", "trl/trainer/dpo_trainer.py:", "(__init__)"),
        ("trainer.train()", "transformers/trainer.py:", "(train)"),
        ("save (trainer.save_model)", "transformers/trainer.py:", "(save_model)"),
    ],
}






def wait_quiet(limit_s: float, busy_share: float = 0.15) -> float | None:
    """Wait (up to ``limit_s``) until other processes use under ``busy_share`` of the CPUs; the last share seen."""
    deadline = time.monotonic() + limit_s
    share = None
    while True:
        before = cpu_busy_seconds()
        time.sleep(2.0)
        after = cpu_busy_seconds()
        if before is None or after is None:
            return None
        share = (after - before) / 2.0 / (os.cpu_count() or 1)
        if share < busy_share or time.monotonic() > deadline:
            return share


# ------------------------------------------------------------------ the baseline: a plain TRL script


def _load_policy(model_dir: str, dtype: str = "float32") -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer  # imported already: the load alone is timed

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    return model, tokenizer


def baseline_child(args: argparse.Namespace) -> None:
    """The plain TRL DPO script: load, train, save; one JSON line of figures on stdout."""
    import dataclasses
    import resource

    # Every import first, outside the profiled phases (our CLI, too, has imported torch, transformers and trl
    # before it loads anything).
    import datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401  (used in _load_policy)
    from trl import DPOConfig, DPOTrainer

    out = Path(args.output)
    dataset = datasets.load_dataset("json", data_files=args.data, split="train", cache_dir=str(out / "hf-cache"))
    model, tokenizer = _load_policy(args.model, args.weights_dtype)
    before = [p.detach().clone() for p in model.parameters() if p.requires_grad]
    checkpointing = ({"activation_checkpointing": False}
                     if "activation_checkpointing" in {f.name for f in dataclasses.fields(DPOConfig)}
                     else {"gradient_checkpointing": False})
    config = DPOConfig(
        output_dir=str(out), max_steps=args.steps, per_device_train_batch_size=args.batch_size,
        learning_rate=args.lr, max_length=args.max_length, seed=args.seed, use_cpu=True, bf16=False,
        logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True, **checkpointing)
    trainer = DPOTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer)
    started = time.perf_counter()
    output = trainer.train()
    train_seconds = time.perf_counter() - started
    trainer.save_model(str(out / "model"))
    after = [p.detach() for p in model.parameters() if p.requires_grad]
    moved = sum(int((a != b).sum()) for a, b in zip(after, before)) / sum(b.numel() for b in before)
    print(json.dumps({
        "moved_share": moved, "weights_dtype": str(after[0].dtype).removeprefix("torch."),
        "steps": int(trainer.state.global_step), "train_runtime": output.metrics["train_runtime"],
        "train_seconds": train_seconds, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "train_loss": output.metrics.get("train_loss"), "trl_config": config.to_dict()}, default=str))


# ------------------------------------------------------------------ setup


def words(rng: random.Random, chars: int) -> str:
    text, n = [], 0
    while n < chars:
        word = rng.choice(WORDS)
        text.append(word)
        n += len(word) + 1
    return " ".join(text)


def lognormal_chars(rng: random.Random, median: float, low: int, high: int) -> int:
    return int(min(high, max(low, rng.lognormvariate(math.log(median), 0.6))))


def message(role: str, content: str) -> dict[str, Any]:
    return {"role": role, "content": content, "name": None, "tool_call_id": None, "tool_calls": None}


_RUN_TOOL = json.dumps([{"type": "function", "function": {
    "name": "run", "description": "Run a shell command in the sandbox.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}])


def agent_turns(rng: random.Random, final: str) -> list[dict[str, Any]]:
    """An agent completion as the exporter writes it: a tool call, the tool's (summarised) result, the reply."""
    call = {**message("assistant", words(rng, lognormal_chars(rng, 30, 5, 200))),
            "tool_calls": [{"id": None, "type": "function", "function": {
                "name": "run", "arguments": json.dumps({"command": "python -m pytest -q"})}}]}
    return [call, {**message("tool", words(rng, lognormal_chars(rng, 150, 20, 800))), "name": "run"},
            message("assistant", final)]


def write_dpo_file(path: Path, pairs: int, seed: int, *, multi_turn: bool = False) -> dict[str, float]:
    """``pairs`` DPO rows in the exporter's conversational shape; returns length statistics (characters).

    With ``multi_turn``, each completion is an agent's: a tool call, its result and a final reply, so that about
    half of each completion's tokens are the tool's (masked out of ``factory train dpo``'s loss, not TRL's).
    """
    from factory.rollouts._agent import ANSWER_SYSTEM_PROMPT

    rng = random.Random(seed)
    lengths = []
    with path.open("w", encoding="utf-8") as handle:
        for i in range(pairs):
            answer = rng.randint(0, 999)
            user = f"{words(rng, lognormal_chars(rng, 50, 10, 400))}? Reply as `Final: <n>`."
            good = f"{words(rng, lognormal_chars(rng, 60, 5, 500))}\nFinal: {answer}"
            bad = f"{words(rng, lognormal_chars(rng, 60, 5, 500))}\nFinal: {answer + 1 + i % 7}"
            chosen, rejected = ((agent_turns(rng, good), agent_turns(rng, bad)) if multi_turn
                                else ([message("assistant", good)], [message("assistant", bad)]))
            row = {
                "prompt": [message("system", ANSWER_SYSTEM_PROMPT), message("user", user)],
                "chosen": chosen, "rejected": rejected,
                "tools": _RUN_TOOL if multi_turn else None, "margin": 1.0, "run_id": "bench-train",
                "task_id": f"task-{i // 4:05d}",
                "chosen_branch": 0, "rejected_branch": 1 + i % 3, "chosen_score": 1.0, "rejected_score": 0.0,
                "chosen_reward": 1.0, "rejected_reward": 0.0, "chosen_strength": 1.0, "rejected_strength": -1.0,
                "verifier_versions": ["answer@1"],
            }
            handle.write(json.dumps(row, separators=(",", ":")) + "\n")
            lengths.append(len(ANSWER_SYSTEM_PROMPT) + len(user) + max(
                sum(len(m["content"]) for m in side) for side in (chosen, rejected)))
    lengths.sort()
    return {"median": lengths[len(lengths) // 2], "p90": lengths[int(len(lengths) * 0.9)], "max": lengths[-1]}


def token_lengths(model_dir: Path, data: Path, max_length: int) -> dict[str, float]:
    """Prompt + longer completion tokens per row, as the chat template renders them (how many get truncated)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    counts = []
    for line in data.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        tools = json.loads(row["tools"]) if row.get("tools") else None
        counts.append(max(len(tokenizer.apply_chat_template(row["prompt"] + row[side], tools=tools, tokenize=True,
                                                            return_dict=True)["input_ids"])
                          for side in ("chosen", "rejected")))
    counts.sort()
    return {"median": counts[len(counts) // 2], "p90": counts[int(len(counts) * 0.9)], "max": counts[-1],
            "truncated": sum(c > max_length for c in counts) / len(counts)}


# ------------------------------------------------------------------ running one side


def child_env(args: argparse.Namespace, work: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads), HF_HOME=str(work / "hf-home"),
               HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONWARNINGS="ignore")
    return env


def factory_command(args: argparse.Namespace, data: Path, model: Path, out: Path) -> list[str]:
    return ["-m", "factory.cli", "train", "dpo", "--data", str(data), "--model", str(model), "--output", str(out),
            "--max-steps", str(args.steps), "--batch-size", str(args.batch_size), "--lr", str(args.lr),
            "--max-length", str(args.max_length), "--seed", str(args.seed), "--set", "disable_tqdm=true", "--json"]


def baseline_command(args: argparse.Namespace, data: Path, model: Path, out: Path) -> list[str]:
    return [str(Path(__file__).resolve()), "--baseline-child", "--data", str(data), "--model", str(model),
            "--output", str(out), "--steps", str(args.steps), "--batch-size", str(args.batch_size),
            "--lr", str(args.lr), "--max-length", str(args.max_length), "--seed", str(args.seed),
            "--weights-dtype", "bfloat16" if args.bf16_weights else "float32"]


def spawn(argv: list[str], env: dict[str, str], log: Path) -> tuple[str, float, float, float, float | None]:
    """Run ``python ARGV``: its stdout, wall seconds, peak RSS MiB and CPU seconds, and other processes' CPU-seconds
    on the machine meanwhile (``None`` without ``/proc/stat``)."""
    busy = cpu_busy_seconds()
    started = time.perf_counter()
    with log.open("w") as err:
        proc = subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE, stderr=err, env=env, text=True)
        stdout = proc.stdout.read() if proc.stdout else ""
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise SystemExit(f"{' '.join(argv[:4])} ... exited {proc.returncode}; its stderr ends:\n{tail}")
    cpu = usage.ru_utime + usage.ru_stime
    after = cpu_busy_seconds()
    others = None if busy is None or after is None else max(0.0, after - busy - cpu)
    return stdout, wall, usage.ru_maxrss / 1024, cpu, others


def run_side(side: str, args: argparse.Namespace, data: Path, model: Path, work: Path, tag: str) -> dict[str, Any]:
    out = work / f"{side}-{tag}"
    argv = (factory_command if side == "factory" else baseline_command)(args, data, model, out)
    quiet = wait_quiet(args.quiet_wait) if args.quiet_wait > 0 else None
    stdout, wall, rss, cpu, others = spawn(argv, child_env(args, work), work / f"{side}-{tag}.log")
    if side == "factory":
        summary = json.loads(stdout)
        result = json.loads((out / "train_result.json").read_text())
        end = next(e for e in reversed(result["log_history"]) if "train_runtime" in e)
        figures = {"steps": summary["metrics"]["steps"], "train_runtime": end["train_runtime"],
                   "train_seconds": summary["metrics"]["train_seconds"],
                   "own_peak_rss_mb": summary["metrics"]["peak_rss_mb"], "train_loss": summary["metrics"]["train_loss"],
                   "trl_config": result["provenance"]["trl_config"],
                   "moved_share": summary["metrics"]["precision"]["moved_share"],
                   "weights_dtype": summary["metrics"]["precision"]["trainable_dtype"]}
    else:
        figures = json.loads(stdout.strip().splitlines()[-1])
        figures["own_peak_rss_mb"] = figures.pop("peak_rss_mb")
    if figures["steps"] != args.steps:
        raise SystemExit(f"{side}: trained {figures['steps']} step(s), not {args.steps}")
    figures.update(side=side, wall=wall, peak_rss_mb=rss, cpu_seconds=cpu, others_cpu_seconds=others,
                   busy_before=quiet,
                   steps_per_second=figures["steps"] / figures["train_runtime"],
                   call_steps_per_second=figures["steps"] / figures["train_seconds"])
    return figures


def config_differences(ours: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    diffs = []
    for key in sorted(set(ours) | set(theirs)):
        if key in PATH_KEYS or key.startswith(("lora_", "merge_adapter", "resume", "use_lora", "allow_unmasked")):
            continue
        a, b = ours.get(key, "<absent>"), theirs.get(key, "<absent>")
        if json.dumps(a, default=str, sort_keys=True) != json.dumps(b, default=str, sort_keys=True):
            diffs.append(f"{key}: factory {a!r} vs baseline {b!r}")
    return diffs


# ------------------------------------------------------------------ profile


def profile_side(side: str, args: argparse.Namespace, data: Path, model: Path, work: Path) -> dict[str, float]:
    """One run of ``side`` under cProfile: its wall, each phase's cumulative seconds, and what is left over."""
    import pstats

    out, prof = work / f"{side}-profile", work / f"{side}.prof"
    argv = (factory_command if side == "factory" else baseline_command)(args, data, model, out)
    _, wall, *_ = spawn(["-m", "cProfile", "-o", str(prof), *argv], child_env(args, work),
                        work / f"{side}-profile.log")
    stats = pstats.Stats(str(prof)).stats  # type: ignore[attr-defined]
    found: dict[str, float] = {"process wall (profiled)": wall}
    for label, *parts in PHASES[side]:
        found[label] = max((cumulative for (file, line, name), (_, _, _, cumulative, _) in stats.items()
                            if all(p in f"{file}:{line}({name})" for p in parts)), default=0.0)
    phases = sum(v for k, v in found.items() if not k.startswith(" ") and k != "process wall (profiled)")
    found["rest: start-up, imports, CLI, result files"] = wall - phases
    return found


# What each side imports before training: the baseline's modules, and the factory modules `factory train dpo` adds.
BASELINE_IMPORTS = "import datasets, torch, transformers, trl; trl.DPOConfig; trl.DPOTrainer"
FACTORY_IMPORTS = "import factory.cli._train, factory.trainers._dpo, factory.export"
IMPORT_PROBE = """
import json, sys, time
from pathlib import Path
def rss():
    return next(int(l.split()[1]) for l in Path("/proc/self/status").read_text().splitlines()
                if l.startswith("VmRSS")) / 1024
{baseline}
before, start = set(m.partition(".")[0] for m in sys.modules), rss()
steps, mark = [], time.perf_counter()
def step(name):
    global mark
    now = time.perf_counter()
    steps.append((name, rss() - start - sum(d for _, d, _ in steps), now - mark))
    mark = now
for name in {order}:
    __import__(name)
    step(name)
{factory}
step("factory and the rest")
new = sorted(set(m.partition(".")[0] for m in sys.modules) - before - {{"factory"}})
print(json.dumps({{"baseline_rss": start, "steps": steps, "new": new}}))
"""


def import_memory(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """RSS (MiB) and import seconds that the modules only ``factory train dpo`` imports add on top of the baseline's,
    package by package (in a fresh process, after the baseline's own imports)."""
    env = child_env(args, work)

    def probe(order: list[str]) -> dict[str, Any]:
        code = IMPORT_PROBE.format(baseline=BASELINE_IMPORTS, factory=FACTORY_IMPORTS, order=order)
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
        return json.loads(done.stdout.strip().splitlines()[-1])

    extra = probe([])["new"]  # the third-party packages factory pulls in, then each one's share in a fresh process
    return probe(extra)


# ------------------------------------------------------------------ main


def median(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps per run (both sides)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each side (alternating; medians)")
    parser.add_argument("--pairs", type=int, default=400, help="DPO pairs in the data file")
    parser.add_argument("--hidden", type=int, default=128, help="tiny model's hidden size (multiple of 16)")
    parser.add_argument("--layers", type=int, default=2, help="tiny model's transformer layers")
    parser.add_argument("--batch-size", type=int, default=2, help="per_device_train_batch_size")
    parser.add_argument("--max-length", type=int, default=256, help="tokens per row (DPOConfig.max_length)")
    parser.add_argument("--lr", type=float, default=5e-6, help="learning rate")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each child (OMP_NUM_THREADS)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", default=None, help="where the model, data and outputs go (default: a temp dir)")
    parser.add_argument("--quiet-wait", type=float, default=10.0,
                        help="before each run, wait up to this many seconds for other processes to go quiet (0: no)")
    parser.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up pair")
    parser.add_argument("--profile", action="store_true", help="also profile one run of each side (cProfile)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 8 steps, 1 repeat, no warm-up")
    parser.add_argument("--bf16-weights", action="store_true",
                        help="the policy saved in bfloat16: factory keeps float32 master weights, the plain TRL script "
                             "loads bf16 and steps it in place; adds the share of trainable elements that moved")
    parser.add_argument("--weights-dtype", default="float32", help=argparse.SUPPRESS)  # the baseline child's
    parser.add_argument("--multi-turn", action="store_true",
                        help="agent rows (tool call, tool result, reply): factory masks the tool's tokens out of the "
                             "loss, the plain TRL script does not, so the ratio is the masking's overhead")
    parser.add_argument("--grpo", action="store_true",
                        help="instead: multi-turn GRPO on the tiny model (rollouts/s; shares of time in sandboxes, "
                             "generation and backward), ours against the same tools in memory")
    parser.add_argument("--generations", type=int, default=4, help="--grpo: rollouts per step (num_generations)")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON document at the end")
    # The baseline child (this file as a plain TRL script):
    parser.add_argument("--baseline-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--output", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.baseline_child:
        baseline_child(args)
        return
    if args.quick:
        args.steps, args.repeats, args.no_warmup = 8, 1, True

    # With --json, stdout is one JSON document: the running commentary and the table go to stderr.
    commentary = contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext()
    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp, commentary:
        work = Path(args.workdir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        report = bench_grpo(args, work) if args.grpo else bench(args, work)
    if args.json:
        print(json.dumps(report, indent=2, default=str))


def bench(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from _results import print_table, record  # bench/ is on sys.path

    from factory.trainers import build_tiny_model

    started = time.perf_counter()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load {loadavg()}; "
          f"{args.threads} torch thread(s) per child", flush=True)
    model = build_tiny_model(work / "tiny", arch="llama", hidden_size=args.hidden, layers=args.layers,
                             seed=args.seed)
    if args.bf16_weights:  # a bf16 checkpoint, as a GPU-trained policy is saved
        from transformers import AutoModelForCausalLM

        AutoModelForCausalLM.from_pretrained(model, dtype="bfloat16").save_pretrained(model)
    config = json.loads((model / "config.json").read_text())
    params = sum(math.prod(shape) for shape in _safetensor_shapes(model / "model.safetensors"))
    data = work / "dpo.jsonl"
    chars = write_dpo_file(data, args.pairs, args.seed, multi_turn=args.multi_turn)
    tokens = token_lengths(model, data, args.max_length)
    check = subprocess.run([sys.executable, "-m", "factory.cli", "export", "validate", str(data), "--format", "dpo"],
                           capture_output=True, text=True, env=child_env(args, work))
    if check.returncode != 0:
        raise SystemExit(f"factory export validate failed:\n{check.stdout}{check.stderr}")
    print(f"model: tiny llama, hidden {config['hidden_size']}, {config['num_hidden_layers']} layers, "
          f"{config['num_attention_heads']} heads ({config['num_key_value_heads']} kv), vocab "
          f"{config['vocab_size']}, {params / 1e6:.2f}M parameters (float32)")
    print(f"data: {args.pairs} pairs, prompt + longer completion {chars['median']} chars median "
          f"({chars['p90']} p90, {chars['max']} max) = {tokens['median']} tokens median ({tokens['p90']} p90, "
          f"{tokens['max']} max), {tokens['truncated']:.0%} over max_length {args.max_length}; "
          f"validate: {check.stdout.strip().splitlines()[-1] if check.stdout.strip() else 'ok'}")
    print(f"train: {args.steps} steps, batch {args.batch_size}, lr {args.lr:g}, max_length {args.max_length}, "
          f"seed {args.seed}, CPU fp32, no activation checkpointing, logging_steps 1, no tqdm, "
          f"save_strategy no; {args.repeats} repeat(s), ABBA{'' if args.no_warmup else ' after a warm-up pair'}",
          flush=True)

    if not args.no_warmup:  # a few steps are enough to bring every library into the page cache
        warmup = argparse.Namespace(**{**vars(args), "steps": min(args.steps, 4)})
        for side in ("factory", "baseline"):
            run_side(side, warmup, data, model, work, "warmup")
        print(f"  warm-up pair done ({time.perf_counter() - started:.0f} s so far)", flush=True)

    runs: dict[str, list[dict[str, Any]]] = {"factory": [], "baseline": []}
    for i in range(args.repeats):
        for side in (("factory", "baseline") if i % 2 == 0 else ("baseline", "factory")):
            r = run_side(side, args, data, model, work, str(i))
            runs[side].append(r)
            others = "" if r["others_cpu_seconds"] is None else f"  others {r['others_cpu_seconds']:.1f} CPU-s"
            print(f"  {i}  {side:<8}  {r['steps_per_second']:6.2f} steps/s (train() {r['train_seconds']:6.2f} s)  "
                  f"wall {r['wall']:6.2f} s  peak RSS {r['peak_rss_mb']:7.1f} MiB (own figure "
                  f"{r['own_peak_rss_mb']:.1f})  CPU {r['cpu_seconds']:5.1f} s  loss {r['train_loss']:.4f}{others}",
                  flush=True)

    diffs = config_differences(runs["factory"][0]["trl_config"], runs["baseline"][0]["trl_config"])
    print("TRL config: identical apart from paths" if not diffs else
          "TRL config differences:\n    " + "\n    ".join(diffs))

    ours, base = runs["factory"], runs["baseline"]
    rows = [
        ("steps/s (global_step / train_runtime)", "steps_per_second", "{:.2f}"),
        ("steps/s (steps / trainer.train() wall)", "call_steps_per_second", "{:.2f}"),
        ("trainer.train() seconds", "train_seconds", "{:.2f} s"),
        ("process wall seconds", "wall", "{:.2f} s"),
        ("peak RSS MiB (wait4)", "peak_rss_mb", "{:.1f}"),
        ("CPU seconds (user + sys)", "cpu_seconds", "{:.1f} s"),
    ]
    if args.bf16_weights:
        rows.append(("share of trainable elements moved", "moved_share", "{:.4f}"))
    print(f"\nmedians of {args.repeats}: {'':30} {'factory':>12} {'baseline':>12} {'factory/baseline':>17}")
    medians: dict[str, dict[str, float]] = {}
    for label, key, fmt in rows:
        a, b = median(ours, key), median(base, key)
        ratio = a / b if b else math.inf  # a bf16 baseline may move no element at all
        medians[key] = {"factory": a, "baseline": b, "ratio": ratio}
        print(f"  {label:<42} {fmt.format(a):>12} {fmt.format(b):>12} {ratio:>16.3f}x")
    speed, memory = medians["steps_per_second"]["ratio"], medians["peak_rss_mb"]["ratio"]
    speed_ok, memory_ok = speed >= 1 - GOAL, memory <= 1 + GOAL
    overhead = {"steps_per_second": 1 - speed, "peak_rss_mb": memory - 1, "wall": medians["wall"]["ratio"] - 1}
    print(f"  overhead: steps/s {overhead['steps_per_second']:+.1%} (goal <= 5%: "
          f"{'met' if speed_ok else 'MISSED'}), peak RSS {overhead['peak_rss_mb']:+.1%} (goal <= 5%: "
          f"{'met' if memory_ok else 'MISSED'}), process wall {overhead['wall']:+.1%}", flush=True)
    # Steps/s is what other processes disturb most; where some runs were disturbed and some not, the quiet ones
    # alone give a second reading (not the goal's figure, which is over every run).
    quiet = {side: [r for r in rs if r["others_cpu_seconds"] is not None
                    and r["others_cpu_seconds"] <= QUIET_SHARE * r["wall"]] for side, rs in runs.items()}
    quiet_speed = None
    if all(quiet.values()) and sum(map(len, quiet.values())) < 2 * args.repeats:
        quiet_speed = median(quiet["factory"], "steps_per_second") / median(quiet["baseline"], "steps_per_second")
        print(f"  undisturbed runs only (others used <= {QUIET_SHARE:.0%} of a core; {len(quiet['factory'])} "
              f"factory, {len(quiet['baseline'])} baseline): steps/s ratio {quiet_speed:.3f}x")
    elif not all(quiet.values()):
        print(f"  other processes used > {QUIET_SHARE:.0%} of a core during every run of one side: "
              "steps/s figures are unreliable (rerun on a quiet machine, or with more --repeats)")

    def fig(key: str, fmt: str) -> tuple[str, str, str]:
        m = medians[key]
        return fmt.format(m["factory"]), fmt.format(m["baseline"]), f"{m['ratio']:.3f}x"

    label = "dpo multi-turn, masked vs TRL unmasked," if args.multi_turn else "dpo"
    if args.bf16_weights:
        label += " bf16 checkpoint, float32 master vs TRL bf16 weights,"
        record("train", f"{label} share of elements moved (median)", *fig("moved_share", "{:.4f}"))
    record("train", f"{label} steps/s (median)", *fig("steps_per_second", "{:.2f}"), ">= 0.95x", speed_ok)
    record("train", f"{label} peak RSS MiB (median)", *fig("peak_rss_mb", "{:.0f}"), "<= 1.05x", memory_ok)
    record("train", f"{label} process wall (median)", *fig("wall", "{:.1f} s"))
    record("train", f"{label} trainer.train() (median)", *fig("train_seconds", "{:.2f} s"))

    profile: dict[str, Any] = {}
    if args.profile:
        print("\nprofile (one cProfile run each; cumulative seconds, profiler overhead included):", flush=True)
        for side in ("factory", "baseline"):
            profile[side] = profile_side(side, args, data, model, work)
            for label, seconds in profile[side].items():
                print(f"  {side:<8} {label:<62} {seconds:7.2f} s")
        imports = import_memory(args, work)
        print(f"imports (unprofiled): the baseline's ({BASELINE_IMPORTS}) take {imports['baseline_rss']:.0f} MiB RSS; "
              f"on top of them, `factory train dpo`'s add:")
        for name, mib, seconds in sorted(imports["steps"], key=lambda step: -step[1]):
            print(f"  {name:<40} {mib:+7.1f} MiB  {seconds:6.3f} s")
        print(f"  {'total':<40} {sum(m for _, m, _ in imports['steps']):+7.1f} MiB  "
              f"{sum(t for _, _, t in imports['steps']):6.3f} s")
        profile["imports"] = {name: {"rss_mb": mib, "seconds": seconds} for name, mib, seconds in imports["steps"]}

    print(f"\nload {loadavg()}; total {time.perf_counter() - started:.0f} s")
    print_table()
    strip = {"trl_config"}
    return {
        "model": {"arch": "llama", "hidden_size": config["hidden_size"], "layers": config["num_hidden_layers"],
                  "vocab_size": config["vocab_size"], "parameters": params},
        "data": {"pairs": args.pairs, "chars": chars, "tokens": tokens},
        "settings": {"steps": args.steps, "batch_size": args.batch_size, "lr": args.lr,
                     "max_length": args.max_length, "seed": args.seed, "threads": args.threads,
                     "repeats": args.repeats},
        "runs": {side: [{k: v for k, v in r.items() if k not in strip} for r in rs] for side, rs in runs.items()},
        "medians": medians, "overhead": overhead, "undisturbed_steps_per_second_ratio": quiet_speed,
        "config_differences": diffs,
        "goal": {"max_overhead": GOAL, "steps_per_second_met": speed_ok, "peak_rss_met": memory_ok},
        "profile": profile,
    }


# ------------------------------------------------------------------ multi-turn GRPO (--grpo)

class _MemoryWorkspace:
    """The baseline's environment: the same five tools over a dict in memory (no sandbox), the same result texts.

    What a plain TRL script would write for this task: the answer checked in Python, no sandbox, no verifier.
    """

    def __init__(self) -> None:
        self.files: dict[str, str] = {}
        self.submitted: str | None = None

    def reset(self, **row: Any) -> None:
        spec = json.loads(row["task_spec"])
        self.files, self.submitted = dict(spec["files"]), None

    def get_reward(self) -> float:
        return float("return 42" in self.files.get("answer.py", ""))

    def read_file(self, path: str) -> str:
        """Read a text file from the workspace.

        Args:
            path: Path relative to the workspace.
        """
        return self.files.get(path, f"error: no file {path}")

    def write_file(self, path: str, content: str) -> str:
        """Create or overwrite a file in the workspace.

        Args:
            path: Path relative to the workspace.
            content: The file's new text.
        """
        self.files[path] = content
        return f"wrote {len(content.encode())} bytes to {path}"

    def list_files(self, path: str | None = None) -> str:
        """List files in the workspace (recursively).

        Args:
            path: Directory; default the workspace root.
        """
        return "\n".join(sorted(self.files))

    def run(self, command: str, timeout: float | None = None) -> str:
        """Run a shell command in the workspace sandbox (no network).

        Args:
            command: The shell command.
            timeout: Seconds (capped by the sandbox limit).
        """
        return "error: no shell here"

    def submit(self, answer: str) -> str:
        """Submit the final answer; this ends the task.

        Args:
            answer: The final answer (for code tasks, a one-line summary of the fix).
        """
        self.submitted = answer
        return f"submitted: {answer}"


def _timed(trainer: Any, name: str, clock: dict[str, float]) -> None:
    """Wrap ``trainer.<name>`` (bench-only instrumentation) so that its wall time adds to ``clock[name]``."""
    inner = getattr(trainer, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            clock[name] = clock.get(name, 0.0) + time.perf_counter() - started

    setattr(trainer, name, wrapper)


def grpo_run(side: str, args: argparse.Namespace, work: Path, model: Path) -> dict[str, Any]:
    """One multi-turn GRPO run of ``args.steps`` steps: ours (sandboxes, verifiers) or the in-memory baseline."""
    import datasets
    import torch
    import trl
    from transformers import AutoTokenizer

    from factory.trainers._environment import Episodes, multi_turn_rows, parse_tool_calls_with

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository: the tests' scripted task
    from tests.trainers.test_multi_turn import rows_file, steering

    torch.set_num_threads(args.threads)
    tokenizer = parse_tool_calls_with(AutoTokenizer.from_pretrained(model))
    folder = work / f"grpo-{side}"
    folder.mkdir(exist_ok=True)
    rows = datasets.load_dataset("json", data_files=str(rows_file(folder)), split="train",
                                 cache_dir=str(folder / "hf"))
    config = trl.GRPOConfig(
        output_dir=str(folder / "out"), max_steps=args.steps, per_device_train_batch_size=args.generations,
        num_generations=args.generations, max_completion_length=400, learning_rate=1e-3, use_cpu=True, bf16=False,
        report_to="none", logging_steps=1, save_strategy="no", disable_tqdm=True, seed=args.seed, beta=0.0,
        max_tool_calling_iterations=4, generation_kwargs={"sequence_bias": steering(tokenizer)})
    episodes = Episodes("bwrap") if side == "factory" else None
    with episodes if episodes is not None else contextlib.nullcontext():
        trainer = trl.GRPOTrainer(
            model=str(model), reward_funcs=[episodes] if episodes is not None else None, args=config,
            train_dataset=multi_turn_rows(rows, folder) if episodes is not None else rows.map(lambda _: {}),
            processing_class=tokenizer,
            environment_factory=episodes.factories() if episodes is not None else _MemoryWorkspace)
        clock: dict[str, float] = {}
        for name in ("training_step", "_generate_and_score_completions", "_generate", "_calculate_rewards"):
            _timed(trainer, name, clock)
        started = time.perf_counter()
        trainer.train()
        wall = time.perf_counter() - started
        sandbox = dict(episodes.seconds) if episodes is not None else {}
    tools = sandbox.get("tools", 0.0)
    rollouts = args.steps * args.generations
    rewards = [e.get("reward") for e in trainer.state.log_history if "reward" in e]
    parts = {
        "sandboxes (start + tools + collect/close/verify)": sum(sandbox.values()),
        "generation (less the tools' sandbox time)": clock["_generate"] - tools,
        "loss forward + backward (training_step less generate-and-score)":
            clock["training_step"] - clock["_generate_and_score_completions"],
    }
    parts["other (log-probs, rewards outside sandboxes, optimizer, logging)"] = wall - sum(parts.values())
    return {"side": side, "wall": wall, "rollouts": rollouts, "rollouts_per_second": rollouts / wall,
            "seconds": parts, "sandbox_seconds": sandbox, "mean_reward": statistics.fmean(rewards) if rewards else None,
            "counts": dict(episodes.counts) if episodes is not None else {}}


def bench_grpo(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Multi-turn GRPO on the tiny model: ours (bwrap sandboxes, the fork's verifiers) against in-memory tools."""
    from _results import print_table, record

    from factory.trainers import build_tiny_model

    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load {loadavg()}; {args.threads} torch "
          f"thread(s); {args.steps} step(s) x {args.generations} rollouts, scripted by sequence_bias "
          "(read_file, write_file 42|41, submit)", flush=True)
    model = build_tiny_model(work / "tiny", seed=args.seed)
    runs = {}
    for side in ("baseline", "factory"):
        busy = cpu_busy_seconds()
        runs[side] = grpo_run(side, args, work, model)
        runs[side]["others_cpu_seconds"] = None if busy is None else max(0.0, cpu_busy_seconds() - busy
                                                                         - runs[side]["wall"] * args.threads)
        r = runs[side]
        print(f"  {side:<8} {r['rollouts']} rollouts in {r['wall']:.2f} s = {r['rollouts_per_second']:.2f} "
              f"rollouts/s, mean reward {r['mean_reward']}", flush=True)
        for label, seconds in r["seconds"].items():
            print(f"      {label:<68} {seconds:7.2f} s  {seconds / r['wall']:6.1%}")
    ours, base = runs["factory"], runs["baseline"]
    ratio = ours["rollouts_per_second"] / base["rollouts_per_second"]
    print(f"  sandbox seconds by phase (ours): {ours['sandbox_seconds']}; counts {ours['counts']}")
    record("train", "grpo multi-turn rollouts/s (bwrap + verifiers vs in-memory tools)",
           f"{ours['rollouts_per_second']:.2f}", f"{base['rollouts_per_second']:.2f}", f"{ratio:.3f}x")
    for label, seconds in ours["seconds"].items():
        record("train", f"grpo multi-turn share: {label.split(' (')[0]}", f"{seconds / ours['wall']:.1%}",
               f"{base['seconds'][label] / base['wall']:.1%}")
    print(f"\nload {loadavg()}")
    print_table()
    return {"settings": {"steps": args.steps, "generations": args.generations, "threads": args.threads,
                         "seed": args.seed}, "runs": runs, "rollouts_per_second_ratio": ratio}


def _safetensor_shapes(path: Path) -> list[list[int]]:
    """Tensor shapes from a safetensors header (no torch import in the parent)."""
    with path.open("rb") as handle:
        size = int.from_bytes(handle.read(8), "little")
        header = json.loads(handle.read(size))
    return [entry["shape"] for name, entry in header.items() if name != "__metadata__"]


if __name__ == "__main__":
    main()
