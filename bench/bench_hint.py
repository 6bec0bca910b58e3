"""Hint distillation's cost: a ``factory train hint`` step against a plain SFT step on the same turn tokens.

Goal (issue 31): tokens/s of ``train hint`` (the teacher's pass with the hint, no gradient, plus the student's
forward and backward) at least 1 / 2.2 of a plain SFT step's on the same turn tokens: a hint step costs at most
2.2x an SFT step.

1. ``setup`` (untimed): a random Llama of ``--hidden`` x ``--layers`` with the tiny model's tokenizer and chat
   template (``factory.trainers.build_tiny_model``), or ``--model DIR`` (any checkpoint folder); ``--rows`` hint
   rows in the export's shape (``prompt``: system, user and ``--turns`` earlier assistant/tool turns;
   ``teacher_prompt``: the same plus the ``Hint: ...`` message; ``completion``: one assistant turn), seeded,
   tokenized by the trainer's own code (``hint_examples``), batched by its collator (``--batch`` rows).
2. ``hint``: one optimizer step as the trainer takes it: ``HintTrainer.compute_loss`` (teacher pass with the
   adapter off where ``--lora``, student pass, KL on the turn's tokens), ``backward``, AdamW ``step``.
3. ``sft``: one optimizer step of plain SFT on the student's rows of the same batch: the model's own
   cross-entropy (``labels`` = the turn's tokens, -100 elsewhere, as TRL's SFTTrainer with an assistant-only
   mask gives it), ``backward``, AdamW ``step``.

Both sides run in this process on the same model and batches, alternating ABBA over ``--repeats`` blocks of
``--steps`` steps after a warm-up; the medians of seconds per step give tokens/s (the batch's turn tokens /
seconds) and the ratio hint / sft.

Run: ``.venv/bin/python bench/bench_hint.py`` (``--lora``, ``--device cuda``, ``--model DIR`` as needed).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._results import loadavg, print_table, record  # noqa: E402

GOAL = 2.2
WORDS = ("the", "function", "returns", "a", "value", "for", "each", "input", "and", "tests", "check", "it", "against",
         "what", "task", "asks", "fix", "read", "write", "run", "file", "line", "error", "assert", "expected", "got",
         "module", "import", "class", "method")


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def hint_rows(count: int, turns: int, seed: int) -> list[dict]:
    """Hint rows in the export's shape, each with ``turns`` earlier assistant/tool turns."""
    rng = random.Random(seed)
    rows = []
    for index in range(count):
        prompt = [{"role": "system", "content": _text(rng, 40)}, {"role": "user", "content": _text(rng, 60)}]
        for turn in range(turns):
            call = {"id": f"c{turn}", "type": "function",
                    "function": {"name": "run", "arguments": '{"command": "' + _text(rng, 6) + '"}'}}
            prompt += [{"role": "assistant", "content": _text(rng, 20), "tool_calls": [call]},
                       {"role": "tool", "content": _text(rng, 50), "tool_call_id": f"c{turn}"}]
        hint = {"role": "user", "content": "Hint: " + _text(rng, 25)}
        completion = [{"role": "assistant", "content": _text(rng, rng.randint(40, 80))}]
        rows.append({"prompt": prompt, "teacher_prompt": prompt + [hint], "completion": completion,
                     "turn": turns, "run_id": "bench", "task_id": f"t{index}", "branch_index": 0})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a checkpoint folder (default: a random Llama built here)")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--turns", type=int, default=3, help="earlier assistant/tool turns in each prompt")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=4, help="steps per timed block")
    parser.add_argument("--repeats", type=int, default=4, help="ABBA rounds")
    parser.add_argument("--lora", action="store_true", help="train a LoRA adapter (the teacher: adapter off)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import torch

    from factory.trainers import HintConfig, apply_lora, build_tiny_model, load_policy, resolve_policy
    from factory.trainers._feedback import hint_examples, template_for
    from factory.trainers._hint import HintCollator, HintTrainer

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    work = Path(tempfile.mkdtemp(prefix="bench-hint-"))
    folder = args.model or str(build_tiny_model(work / "model", hidden_size=args.hidden, layers=args.layers))
    model, tokenizer = load_policy(resolve_policy(folder), dtype="float32" if args.device == "cpu" else None)
    if args.lora:
        model = apply_lora(model, r=16, alpha=32, dropout=0.0)
    model.to(args.device).train()
    examples = hint_examples(list(enumerate(hint_rows(args.rows, args.turns, args.seed), start=1)), tokenizer,
                             template_for(tokenizer), work / "hints.jsonl")
    collate = HintCollator(tokenizer.pad_token_id)
    batches = [{k: v.to(args.device) for k, v in collate(examples[i:i + args.batch]).items()}
               for i in range(0, len(examples), args.batch)]
    config = HintConfig(output_dir=str(work / "out"), use_cpu=args.device == "cpu", report_to="none",
                        disable_tqdm=True, max_steps=1)
    trainer = HintTrainer(model=model, args=config, train_dataset=examples, data_collator=collate,
                          processing_class=tokenizer)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)

    def sft_labels(batch: dict) -> torch.Tensor:
        ids, target = batch["input_ids"], batch["target"]
        labels = torch.full_like(ids, -100)
        labels[:, -target.shape[1]:] = torch.where(target, ids[:, -target.shape[1]:], labels[:, -target.shape[1]:])
        return labels

    labels = [sft_labels(b) for b in batches]

    def hint_step(i: int) -> None:
        trainer.compute_loss(model, batches[i % len(batches)]).backward()

    def sft_step(i: int) -> None:
        b = batches[i % len(batches)]
        model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"],
              labels=labels[i % len(batches)], use_cache=False).loss.backward()

    def block(step) -> float:
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        started = time.perf_counter()
        for i in range(args.steps):
            step(i)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        return (time.perf_counter() - started) / args.steps

    block(hint_step)  # warm-up, untimed
    block(sft_step)
    times: dict[str, list[float]] = {"hint": [], "sft": []}
    for round_ in range(args.repeats):
        order = ("hint", "sft", "sft", "hint") if round_ % 2 == 0 else ("sft", "hint", "hint", "sft")
        for side in order:
            times[side].append(block(hint_step if side == "hint" else sft_step))
    tokens = statistics.mean(int(b["target"].sum()) for b in batches)
    student = statistics.mean(int(b["attention_mask"].sum()) for b in batches)
    teacher = statistics.mean(int(b["teacher_attention_mask"].sum()) for b in batches)
    hint_s, sft_s = statistics.median(times["hint"]), statistics.median(times["sft"])
    ratio = hint_s / sft_s
    size = folder if args.model else f"{args.hidden}x{args.layers}"
    where = f"{args.device}, {'LoRA' if args.lora else 'full'}, {size}"
    print(f"hint bench ({where}): batch {args.batch}, {tokens:.0f} turn tokens of {student:.0f} (student) / "
          f"{teacher:.0f} (teacher) tokens per batch; load {loadavg()}")
    print(f"per-step seconds: hint {[round(t, 4) for t in times['hint']]}, sft {[round(t, 4) for t in times['sft']]}")
    record("hint", f"turn tokens/s, hint ({where})", f"{tokens / hint_s:.0f}", f"{tokens / sft_s:.0f} (sft)",
           f"{ratio:.2f}x cost", f"<= {GOAL}x", ratio <= GOAL)
    print_table()


if __name__ == "__main__":
    main()
