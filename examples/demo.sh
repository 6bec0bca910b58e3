#!/usr/bin/env bash
# The main job, as a user walks it: fork the examples on the embedded model, rank the run, check whether
# the two temperatures differ with power, export DPO pairs, train a few DPO steps on the tiny model, and
# write a static view of the run to open in a browser. `make demo` runs it after set-up.
#
# Usage: examples/demo.sh [FACTORY]   (FACTORY: the factory executable; default: .venv/bin/factory)
# Outputs: the run in ./factory.duckdb (or $FACTORY_DB), everything else under demo/<run id>/.
set -euo pipefail

factory="${1:-.venv/bin/factory}"
run="demo-$(date -u +%Y%m%d-%H%M%S)"
out="demo/$run"
mkdir -p "$out"
start=$(date +%s)
step() { printf '\n== %s (%ss)\n' "$1" "$(( $(date +%s) - start ))"; }

step "validate the example tasks"
"$factory" tasks validate examples/tasks.jsonl

step "fork: 2 branches per task, temperatures 0.2 and 1.0, each branch in its own sandbox"
"$factory" fork examples/tasks.jsonl --run-id "$run" --branches 2 --temperatures 0.2,1.0 --max-turns 4 \
    --max-tokens 256 --seed 1
"$factory" runs

step "rank each task's branches (Bradley-Terry on the rewards, with its evidence check)"
"$factory" rank "$run" --plot "$out/rank.png"

step "power: does temperature 0.2 pass more often than 1.0? (Wilson intervals, McNemar)"
"$factory" power --run "$run" --by temperature --a 0.2 --b 1.0 --plot "$out/power.png"

step "export DPO pairs (chosen: a clean pass; rejected: a failure) with manifest and dataset card"
if "$factory" export dpo --run "$run" --out "$out/dpo.jsonl"; then
    step "train: a few DPO steps on the tiny offline model (loss only on the policy's own tokens)"
    "$factory" train dpo --data "$out/dpo.jsonl" --model tiny --max-steps 2 --batch-size 2 -o "$out/train"
else
    echo "no DPO pair in this run (every task's branches passed, or every one failed): nothing to train on"
fi

step "view: a static site of the run"
"$factory" view --bundle "$out/view"
printf '\nDone in %ss. Open the run in a browser:\n  file://%s/index.html\n' \
    "$(( $(date +%s) - start ))" "$(cd "$out/view" && pwd)"
printf 'or serve the whole store: %s view   (then http://127.0.0.1:8765)\n' "$factory"
