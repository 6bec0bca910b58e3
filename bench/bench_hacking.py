"""The uncertainty penalty against length creep, for real: GRPO on the tiny model over λ ∈ {0, 0.1, 0.3, 0.5}.

The question left open (issue 35 item 4): with an ensemble reward model
penalised by its members' disagreement (mean − λ·std), how much does a
smaller λ keep of the benefit? One run, on the CPU, in four steps:

1. ``policy`` (untimed): the tests' tiny model with its end-of-turn logit
   raised so that it starts out stopping early (``eos_prone`` of
   ``tests/trainers/test_hacking_trl.py``), leaving a reward that pays for
   length room to creep into.
2. ``reward model``: preference pairs with a verbose bias, from the policy's
   own samples (``--pairs-samples`` per prompt, at most ``--rm-cap`` tokens):
   of two samples of one prompt the longer is chosen. ``factory train reward
   --ensemble 3`` (the library call) trains three LoRA members on bootstrap
   resamples with seeds ``seed``, ``seed+1``, ``seed+2``. Each member's
   correlation of score with length on held-out samples is printed: the
   reward model learned that length reads as quality.
3. ``sweep``: for each λ, a fresh copy of the policy trained by TRL's GRPO for
   ``--steps`` steps (same seed, data, settings) with two reward functions:
   the ensemble (:class:`factory.trainers.EnsembleReward`, mean − λ·std) and a
   correctness term (1 when the completion's first token is the prompt's
   target token: a token the starting policy emits as its first 5-30 % of the
   time, so it is learnable and has nothing to do with length). ``beta`` > 0,
   so TRL logs the KL to the starting policy. The reward-hacking detector
   watches every run (``--warmup`` steps of baseline, window ``--window``).
4. ``figures``: per λ, the length creep (mean completion length over the last
   quarter of the steps minus the first quarter's, in tokens, and the first
   step whose mean length reaches 90 % of the cap), the
   correctness reward and the KL over the last quarter, the ensemble's mean
   std, the detector's first alarm and the step at which the reward model's
   reward saturates (its 3-step moving average first reaches 90 % of the way
   from its first to its highest value). Ratios are against λ = 0 of the same
   run. Curves: ``OUT/lambda_sweep.png`` (and ``--docs`` copies it with the
   λ = 0 run's detector plot into docs/).

Run: ``.venv/bin/python bench/bench_hacking.py [--steps 40] [--out DIR] [--docs]``.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._results import loadavg, print_table, record  # noqa: E402

LAMBDAS = (0.0, 0.1, 0.3, 0.5)


def sample_completions(model_dir: str, prompts: list, count: int, cap: int, seed: int) -> list[list[tuple[str, int]]]:
    """``count`` sampled completions (text, length in tokens) per prompt, at most ``cap`` new tokens."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    found = []
    for prompt in prompts:
        ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, return_tensors="pt",
                                            return_dict=True)
        with torch.no_grad():
            out = model.generate(**ids, do_sample=True, top_k=50, max_new_tokens=cap,
                                 num_return_sequences=count, pad_token_id=tokenizer.pad_token_id)
        rows = []
        for seq in out[:, ids["input_ids"].shape[1]:].tolist():
            seq = seq[:seq.index(tokenizer.eos_token_id)] if tokenizer.eos_token_id in seq else seq
            seq = [t for t in seq if t != tokenizer.pad_token_id]
            rows.append((tokenizer.decode(seq, skip_special_tokens=True), len(seq)))
        found.append(rows)
    return found


def verbose_pairs(prompts: list, samples: list[list[tuple[str, int]]], path: Path) -> int:
    """Pairs of samples of one prompt whose lengths differ: the longer is chosen (a verbose bias)."""
    rows = []
    for prompt, group in zip(prompts, samples):
        for (a, la), (b, lb) in zip(group[0::2], group[1::2]):
            if la == lb or not a.strip() or not b.strip():  # the export format refuses empty content
                continue
            (long, _), (short, _) = ((a, la), (b, lb)) if la > lb else ((b, lb), (a, la))
            rows.append({"prompt": prompt, "chosen": [{"role": "assistant", "content": long}],
                         "rejected": [{"role": "assistant", "content": short}], "margin": 0.0})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return len(rows)


def first_token_targets(model_dir: str, prompts: list) -> list[int]:
    """Per prompt, a first token the starting policy emits 5-30 % of the time (not the end token)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    targets = []
    for prompt in prompts:
        ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, return_tensors="pt",
                                            return_dict=True)
        with torch.no_grad():
            probs = model(**ids).logits[0, -1].softmax(-1)
        order = [t for t in probs.argsort(descending=True).tolist() if t != tokenizer.eos_token_id]
        fitting = [t for t in order if 0.05 <= probs[t] <= 0.30]
        targets.append(fitting[0] if fitting else order[1])
    return targets


def saturation_step(steps: list[int], values: list[float]) -> int | None:
    """The first step whose 3-step moving average is 90 % of the way from the first to the highest average."""
    if len(values) < 3:
        return None
    smooth = [statistics.fmean(values[max(0, i - 2):i + 1]) for i in range(len(values))]
    low, high = smooth[0], max(smooth)
    if high - low <= 1e-9:
        return None
    return next(step for step, v in zip(steps, smooth) if v >= low + 0.9 * (high - low))


def run_grpo(policy: str, dataset, ensemble, penalty: float, targets: dict[str, int], args, out: Path) -> dict:
    """One GRPO run at ``penalty``; its per-step series and the detector's report."""
    import trl
    from transformers import set_seed

    from factory.trainers import DetectorSettings, EnsembleReward, watch_rewards

    reward_model = EnsembleReward(ensemble, penalty)

    def correctness(prompts, completions, completion_ids, **kwargs):
        return [float(bool(ids) and ids[0] == targets[p[-1]["content"]]) for p, ids in zip(prompts, completion_ids)]

    settings = DetectorSettings(warmup_steps=args.warmup, window=args.window)
    funcs, watcher = watch_rewards([reward_model, correctness], "warn", settings, out)
    set_seed(args.seed)
    config = trl.GRPOConfig(output_dir=str(out), max_steps=args.steps, per_device_train_batch_size=16,
                            num_generations=4, max_completion_length=args.cap, learning_rate=args.lr,
                            warmup_steps=args.warmup, top_k=50, use_cpu=True, bf16=False, report_to="none",
                            logging_steps=1, save_strategy="no", disable_tqdm=True, seed=args.seed,
                            beta=args.beta)
    trainer = trl.GRPOTrainer(model=policy, reward_funcs=funcs, args=config, train_dataset=dataset,
                              callbacks=[watcher])
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    logs = [e for e in trainer.state.log_history if "completions/mean_length" in e]
    report = watcher.detector.report()
    first = watcher.detector.first_alarm
    return {
        "penalty": penalty, "seconds": round(seconds, 1),
        "step": [e["step"] for e in logs],
        "length": [e["completions/mean_length"] for e in logs],
        "correct": [e["rewards/correctness/mean"] for e in logs],
        "rm": [e["rewards/reward_model/mean"] for e in logs],
        "rm_mean": [e["ensemble/mean"] for e in logs],
        "std": [e["ensemble/std"] for e in logs],
        "kl": [e.get("kl", 0.0) for e in logs],
        "first_alarm": None if first is None else {"step": first.step, "signals": first.signals,
                                                   "status": first.status.value},
        "report": report.model_dump(mode="json"),
        "watcher": watcher,
    }


def quarter(values: list[float], last: bool) -> float:
    n = max(1, len(values) // 4)
    return statistics.fmean(values[-n:] if last else values[:n])


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(10, 6.4), sharex=True)
    panels = [("length", "mean completion length (tokens)"), ("correct", "correctness reward"),
              ("kl", "KL to the starting policy"), ("std", "ensemble std (members' disagreement)")]
    for ax, (key, label) in zip(axes.flat, panels):
        for run in runs:
            line, = ax.plot(run["step"], run[key], label=f"λ = {run['penalty']}")
            if run["first_alarm"] and key == "length":
                step = run["first_alarm"]["step"]
                ax.plot([step], [run["length"][run["step"].index(step)]], marker="v", color=line.get_color(),
                        markersize=9)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("GRPO step")
    axes[0][0].legend(title="mean − λ·std (▼ first detector alarm)", fontsize=8)
    fig.suptitle("Tiny model, GRPO on a verbose-biased reward-model ensemble + a correctness term")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="GRPO steps per λ")
    parser.add_argument("--cap", type=int, default=32, help="max completion length in GRPO")
    parser.add_argument("--rm-cap", type=int, default=12, help="max tokens of the reward model's training samples")
    parser.add_argument("--pairs-samples", type=int, default=16, help="samples per prompt for the reward pairs")
    parser.add_argument("--rm-steps", type=int, default=10, help="optimizer steps per reward-model member")
    parser.add_argument("--lr", type=float, default=1e-4, help="GRPO learning rate")
    parser.add_argument("--beta", type=float, default=0.04, help="GRPO's KL coefficient (KL is logged)")
    parser.add_argument("--warmup", type=int, default=5, help="detector warm-up steps (and the LR warm-up)")
    parser.add_argument("--window", type=int, default=2, help="detector window")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lambdas", type=float, nargs="+", default=list(LAMBDAS))
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: a temporary one)")
    parser.add_argument("--docs", action="store_true", help="copy the curves and the λ=0 detector plot to docs/")
    args = parser.parse_args()

    import datasets
    import torch

    from factory.trainers import RewardConfig, RewardEnsemble, build_tiny_model, plot_detector, train_reward
    from tests.trainers.test_hacking_trl import PROMPTS, eos_prone

    torch.set_num_threads(1)  # 2 shared cores: one thread is the steadiest (see bench_train.py)
    work = args.out or Path(tempfile.mkdtemp(prefix="bench-hacking-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"work folder {work}; load {loadavg()}")
    tiny = str(build_tiny_model(work / "tiny"))
    policy = eos_prone(tiny, work)
    samples = sample_completions(policy, PROMPTS, args.pairs_samples, args.rm_cap, args.seed)
    lengths = [n for group in samples for _, n in group]
    print(f"policy samples: mean length {statistics.fmean(lengths):.1f} tokens (cap {args.rm_cap})")
    pairs = verbose_pairs(PROMPTS, samples, work / "pairs.jsonl")
    print(f"reward model: {pairs} verbose-biased pairs")
    started = time.perf_counter()
    config = RewardConfig(output_dir=str(work / "rm"), data_file=str(work / "pairs.jsonl"), model_name_or_path=tiny,
                          ensemble=3, max_steps=args.rm_steps, per_device_train_batch_size=8, learning_rate=1e-3,
                          seed=args.seed, disable_tqdm=True, max_length=256)
    train_reward(config)
    ensemble = RewardEnsemble.load(work / "rm")
    print(f"reward ensemble trained and reloaded in {time.perf_counter() - started:.0f} s")
    held = sample_completions(policy, PROMPTS, 16, args.cap, args.seed + 100)
    flat = [(p, [{"role": "assistant", "content": t}], n) for p, group in zip(PROMPTS, held) for t, n in group]
    scores = ensemble.member_scores([f[0] for f in flat], [f[1] for f in flat])
    spread = [statistics.pstdev(column) for column in zip(*scores)]
    std_corr = statistics.correlation(spread, [float(f[2]) for f in flat])
    print(f"  ensemble: corr(std across members, length) = {std_corr:.2f} (mean std {statistics.fmean(spread):.3f})")
    record("hacking", "RM corr(members' std, length)", f"{std_corr:.2f}")
    # Per token of length, how much the members' mean and their std rise: the penalty cancels the pull to length
    # only where λ·(std slope) reaches the mean's slope.
    lengths_held = [float(f[2]) for f in flat]
    mean_slope = statistics.linear_regression(lengths_held, [statistics.fmean(c) for c in zip(*scores)]).slope
    std_slope = statistics.linear_regression(lengths_held, spread).slope
    even = mean_slope / std_slope if std_slope > 0 else math.inf
    print(f"  per token: mean score {mean_slope:+.4f}, std {std_slope:+.4f}; λ that cancels the pull to length "
          f"{even:.1f}")
    record("hacking", "RM slope per token: mean / std", f"{mean_slope:+.4f} / {std_slope:+.4f}")
    record("hacking", "λ at which mean − λ·std stops rising with length", f"{even:.1f}")
    for name, member in zip(ensemble.names, scores):
        corr = statistics.correlation(member, [float(f[2]) for f in flat])
        print(f"  {name}: corr(score, length) on {len(flat)} held-out samples up to {args.cap} tokens = {corr:.2f}")
        record("hacking", f"RM {name} corr(score, length)", f"{corr:.2f}")
    targets_ids = first_token_targets(policy, PROMPTS)
    targets = {p[-1]["content"]: t for p, t in zip(PROMPTS, targets_ids)}
    rows = [{"prompt": p} for p in PROMPTS]
    (work / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    dataset = datasets.load_dataset("json", data_files=str(work / "prompts.jsonl"), split="train",
                                    cache_dir=str(work / "hf"))
    runs = []
    for penalty in args.lambdas:
        run = run_grpo(policy, dataset, ensemble, penalty, targets, args, work / f"grpo-{penalty}")
        runs.append(run)
        creep = quarter(run["length"], True) - quarter(run["length"], False)
        sat = saturation_step(run["step"], run["rm_mean"])
        print(f"λ={penalty}: {run['seconds']} s; length {quarter(run['length'], False):.1f} -> "
              f"{quarter(run['length'], True):.1f} (creep {creep:+.1f}); correctness "
              f"{quarter(run['correct'], True):.3f}; KL {quarter(run['kl'], True):.4f}; std "
              f"{statistics.fmean(run['std']):.3f}; first alarm {run['first_alarm']}; RM reward saturates at {sat}")
        reach = next((st for st, n in zip(run["step"], run["length"]) if n >= 0.9 * args.cap), None)
        print(f"   mean length first >= 90 % of the cap at step {reach}")
        run.update(creep=creep, saturation=sat, reach=reach)
    base = runs[0]
    for run in runs:
        lam = f"λ={run['penalty']}"
        ratio = (f"{run['creep'] / base['creep']:.2f}" if base["creep"] and run is not base else "")
        record("hacking", f"{lam} length creep (tokens)", f"{run['creep']:+.2f}", f"{base['creep']:+.2f}", ratio)
        record("hacking", f"{lam} step length >= 90 % of cap", str(run["reach"]), str(base["reach"]))
        record("hacking", f"{lam} correctness (last 1/4)", f"{quarter(run['correct'], True):.3f}",
               f"{quarter(base['correct'], True):.3f}")
        record("hacking", f"{lam} KL (last 1/4)", f"{quarter(run['kl'], True):.4f}", f"{quarter(base['kl'], True):.4f}")
        record("hacking", f"{lam} ensemble std (mean)", f"{statistics.fmean(run['std']):.3f}")
        alarm = run["first_alarm"]["step"] if run["first_alarm"] else None
        sat = run["saturation"]
        before = None if sat is None else alarm is not None and alarm < sat  # no alarm at all: missed
        record("hacking", f"{lam} first alarm / RM saturation step", f"{alarm} / {sat}",
               goal="alarm before saturation", ok=before)
    plot(runs, work / "lambda_sweep.png")
    plot_detector(base["watcher"].detector.report(), work / "hacking_real.png",
                  f"reward-hacking detector, tiny GRPO, λ = {base['penalty']}", {})
    saved = [{k: v for k, v in run.items() if k != "watcher"} for run in runs]
    (work / "sweep.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                 "targets": targets, "runs": saved}, indent=1, default=str))
    print(f"curves: {work / 'lambda_sweep.png'}; detector: {work / 'hacking_real.png'}; series: "
          f"{work / 'sweep.json'}")
    if args.docs:
        shutil.copy(work / "lambda_sweep.png", ROOT / "docs" / "hacking-lambda-sweep.png")
        shutil.copy(work / "hacking_real.png", ROOT / "docs" / "hacking-detector-real.png")
        print("copied to docs/hacking-lambda-sweep.png and docs/hacking-detector-real.png")
    print(f"load at the end {loadavg()}")
    print_table()
    if any(math.isnan(v) for run in runs for v in run["length"]):
        sys.exit("NaN lengths")


if __name__ == "__main__":
    main()
