#!/usr/bin/env bash
# flashtree's tree step on sglang's DFLASH worker, live on the lent H200 (sglang 0.5.17), tiny example target: the
# tiny example's draft converted to DFLASH's layout (flashtree.dspark.dflash_format; its rows are DSPARK's, so it
# accepts little: this run proves the DFLASH tree step's outputs, not its speed), then the app's `tiny-check` preset
# with model.algorithm=DFLASH: float32 greedy identity of DFLASH's chain, the tree and the tree + split-KV against no
# speculation, the sampled chi-square and grammar refusals. One device call, from the repo root:
#     run(command="bash scripts/live_dflash_h200.sh", carry=[".h200", ".cache/live-site"], kind="nvidia-h200")
# SmolLM2 with a trained DFLASH drafter: FORMAT=dflash bash scripts/train_drafter_h200.sh train, then
# bash scripts/live_smollm2_h200.sh +preset=dflash-smollm2 (same warm machine).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
. scripts/live_lib.sh
live_setup || exit 2
live_tiny_models || exit 2
python3 -m flashtree.dspark.dflash_format $WORK/models/draft $WORK/models/dflash-draft --dtype float32 || exit 2
live_run +preset=tiny-check model.algorithm=DFLASH model.draft=$WORK/models/dflash-draft "$@"
