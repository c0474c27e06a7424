#!/usr/bin/env bash
# flashtree's tree toggles live on the lent H200 (sglang 0.5.17), tiny example target + DSPARK draft: the app's
# `tiny-check` preset (float32 greedy identity of chain, tree and tree + split-KV against no speculation, sampled
# chi-square, grammar requests refused by the tree path). One device call, from the repo root:
#     run(command="bash scripts/live_h200.sh", carry=[".h200", ".cache/live-site"], kind="nvidia-h200")
# (.h200: `bash ../shared/tools/sglang-h200/build.sh .h200` with ../shared/tools/sglang-h200/example copied to
# .h200/example; .cache/live-site: `bash scripts/live_smollm2_h200.sh pack-site`). Arguments: more Hydra overrides.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
. scripts/live_lib.sh
live_setup || exit 2
live_tiny_models || exit 2
live_run +preset=tiny-check "$@"
