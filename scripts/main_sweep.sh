#!/usr/bin/env bash
# The README's main job, on CPU in about 1.5 minutes (2 cores): τ of every tree policy over N x W from the shipped
# recording of flashtree's trained SmolLM2-135M DSPARK drafter on 20 held-out GSM8K prompts (benchmarks/recordings/;
# replay is exact: every greedy run commits the recorded sequence), then a live check that trees are lossless (the
# engine's trees against SmolLM2's own greedy generate on 2 held-out prompts, ~15 s). Prints the table, writes
# figures to multirun/replay-<name>/figures/. ENGINE=1 runs the engine sweep instead (SmolLM2-135M, prompt lookup,
# 4 GSM8K prompts, N in {1, 4}, W in {4, 8}: real model forwards, tokens/s and one W&B offline run per
# configuration). Extra arguments go to the sweep. The recording is made again on a GPU with
#   python experiments/replay.py target.device=cuda drafter=dspark +drafter.options.path=DRAFT \
#     +drafter.options.temperature=1.0 dataset=gsm8k dataset.split=second_half dataset.limit=20 \
#     engine.max_new_tokens=128 replay.n_max=32 'replay.widths=[64]'     (then copy its recording.pt here)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
NAME=${NAME:-main}
export WANDB_MODE=${WANDB_MODE:-offline}
export WANDB_SILENT=${WANDB_SILENT:-true}

if [ "${ENGINE:-0}" = 1 ]; then
  "$PY" experiments/sweep.py --multirun name="$NAME" \
    target=smollm2-135m drafter=default dataset=gsm8k dataset.limit=4 engine.max_new_tokens=48 \
    tree.n=1,4 tree.width=4,8 "$@"
  SWEEP=multirun/$NAME
else
  "$PY" experiments/replay.py --multirun name="$NAME" tree.policy=vote,prob,best-first \
    replay.recording=benchmarks/recordings/smollm2-dspark-gsm8k.pt replay.n_max=32 \
    'replay.ns=[1,4,8,16,32]' 'replay.widths=[4,8,16,32,64]' \
    dataset=gsm8k dataset.split=second_half dataset.limit=20 engine.max_new_tokens=128 logger.wandb.mode=disabled "$@"
  SWEEP=multirun/replay-$NAME
  "$PY" -m flashtree.results.collect "$SWEEP"
  echo
  "$PY" -m flashtree.engine.identity_check
fi
echo
echo "figures:"
MPLBACKEND=Agg "$PY" -m flashtree.results.plots "$SWEEP"
