#!/usr/bin/env bash
# The live benchmark on the lent H200: SmolLM2-135M-Instruct served by sglang 0.5.17 with flashtree's trained DSPARK
# drafter; the app experiments/live.py does the rest (servers from flashtree/configs/live/ presets, identity, speed, sampled).
#
# Dev machine, once: `bash scripts/live_smollm2_h200.sh pack-site` (hydra for the app -> .cache/live-site).
# Device, right after `scripts/train_drafter_h200.sh train` (or its `stage-a`, `stage-c`, `convert`, `stage-draft`
# modes) on the same warm machine, which leave the converted target in $FLASHTREE_CACHE/models/smollm2-135m and the
# draft in /tmp/ft-draft:
#     run(command="bash scripts/live_smollm2_h200.sh +preset=best", carry=[".h200", ".cache/live-site"])
# Arguments are the app's Hydra overrides (e.g. `run=[speed] phases.speed.servers=[chain,tree8-w16]`;
# `live.dry_run=true` prints the servers' commands). CHECK=1 first runs benchmarks/decode_order_check.py.
# $OUT gets <phase>_results.json, summary.json and live_run.tgz (tables, server logs, stage_times.txt).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
. scripts/live_lib.sh
if [ "${1:-}" = pack-site ]; then live_pack_site; exit; fi
live_setup || exit 2
export FLASHTREE_CACHE=${FLASHTREE_CACHE:-/tmp/flashtree-cache}
if [ "${CHECK:-0}" = 1 ]; then
  timeout 240 python3 benchmarks/decode_order_check.py --out "$OUT/decode_order_check.jsonl"
  el "check rc=$?"
fi
live_run "$@"
