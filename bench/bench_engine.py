"""The embedded engine's speed: the portable llama-cpp-python build against a native (-march=native) one.

The Makefile builds llama-cpp-python without ``-march=native`` (AVX2, FMA,
F16C; AVX-512 and AMX off) so that it runs on every x86-64-v3 machine,
AMX-advertising VMs included. This measures what that costs where both run:
each build is installed into its own folder (``pip install --target``) from
the wheels ``make llama-wheel`` and ``make llama-wheel LLAMA_BUILD=native``
leave under ``.cache/wheels/``, and a child process per build and round loads
the embedded GGUF and generates ``--tokens`` tokens from a fixed prompt with
a fixed seed (greedy). Figures: decode tokens/s (generated tokens over the
generation's wall time) and prompt tokens/s, median of ``--repeats`` rounds
after one warm-up; builds alternate within each round so machine load hits
both alike. The goal: portable >= 90 % of native decode tokens/s.

Run: ``python bench/bench_engine.py [--tokens 128] [--repeats 3] [--threads 2]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import loadavg, print_table, record, verdict  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
VERSION = "0.3.36"
PROMPT = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWrite a Python function "
          "that returns the n-th Fibonacci number, with a docstring and two doctests.<|im_end|>\n"
          "<|im_start|>assistant\n")

_CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import llama_cpp
from llama_cpp import Llama
llm = Llama(model_path=sys.argv[2], n_ctx=1024, n_threads=int(sys.argv[3]), n_threads_batch=int(sys.argv[3]),
            verbose=False)
prompt = sys.argv[4]
tokens = llm.tokenize(prompt.encode(), special=True)
start = time.perf_counter()
llm.eval(tokens)
prompt_s = time.perf_counter() - start
llm.reset()
start = time.perf_counter()
out = llm.create_completion(prompt, max_tokens=int(sys.argv[5]), temperature=0.0, seed=1)
total_s = time.perf_counter() - start
generated = out["usage"]["completion_tokens"]
print(json.dumps({"file": llama_cpp.__file__, "prompt_tokens": len(tokens), "prompt_s": prompt_s,
                  "generated": generated, "total_s": total_s}))
"""


def _install(build: str, folder: Path) -> Path:
    wheels = sorted((ROOT / ".cache" / "wheels" / f"llama-cpp-python-{VERSION}-{build}").glob("*.whl"))
    if not wheels:
        raise SystemExit(f"no {build} wheel: run `make llama-wheel LLAMA_BUILD={build}` first")
    target = folder / build
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
                    str(wheels[-1])], check=True)
    return target


def _round(target: Path, gguf: str, threads: int, tokens: int) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", _CHILD, str(target), gguf, str(threads), PROMPT, str(tokens)],
                         capture_output=True, text=True, check=True)
    data = json.loads(out.stdout.strip().splitlines()[-1])
    assert str(target) in data["file"], f"imported {data['file']}, not the build under test"
    prompt_time = data["prompt_s"]
    decode_s = max(1e-9, data["total_s"] - prompt_time)
    return {"decode": data["generated"] / decode_s, "prompt": data["prompt_tokens"] / prompt_time,
            "generated": data["generated"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    from factory.models import ensure_weights

    gguf = str(ensure_weights())
    flags = sorted({flag for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")
                    for flag in line.split(":", 1)[1].split()
                    if flag.startswith(("avx512", "amx")) or flag in ("avx2", "fma", "f16c")})
    print(f"cpu flags of interest: {' '.join(flags)}; load {loadavg()}; {args.threads} threads")
    with tempfile.TemporaryDirectory() as scratch:
        targets = {build: _install(build, Path(scratch)) for build in ("portable", "native")}
        samples: dict[str, list[dict[str, float]]] = {build: [] for build in targets}
        for round_index in range(args.repeats + 1):
            order = list(targets) if round_index % 2 == 0 else list(reversed(targets))
            for build in order:
                result = _round(targets[build], gguf, args.threads, args.tokens)
                if round_index:  # the first round warms the page cache up
                    samples[build].append(result)
                    print(f"round {round_index} {build}: {result['decode']:.1f} tok/s decode, "
                          f"{result['prompt']:.1f} tok/s prompt ({int(result['generated'])} tokens)")
    medians = {build: {key: statistics.median(s[key] for s in runs) for key in ("decode", "prompt")}
               for build, runs in samples.items()}
    for key in ("decode", "prompt"):
        ratio = medians["portable"][key] / medians["native"][key]
        goal_ok = ratio >= 0.9
        record("engine", f"{key} tokens/s", f"{medians['portable'][key]:.1f} (portable)",
               f"{medians['native'][key]:.1f} (native)", f"{ratio:.2f}",
               ">= 0.90" if key == "decode" else "", goal_ok if key == "decode" else None)
        if key == "decode":
            print(f"portable / native decode: {ratio:.2f} -> {verdict(goal_ok)}")
    print_table()


if __name__ == "__main__":
    main()
