#!/usr/bin/env bash
# Where a decode step's host time goes, on the lent H200 with the tiny example (bf16, CUDA graphs, sglang 0.5.17):
# the app's `tiny-profile` preset (DSPARK's chain against flashtree's tree step with N = 1 and N = 8, each alone at
# concurrency 1, decode steps 100-399 under cProfile by benchmarks/live/profile_steps.py).
#     run(command="bash scripts/profile_tiny_h200.sh", carry=[".h200", ".cache/live-site"], kind="nvidia-h200")
# $OUT gets speed_results.json and live_run.tgz (the logs hold profile_<tag>_<pid>.txt per server).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
. scripts/live_lib.sh
live_setup || exit 2
live_tiny_models || exit 2
live_run +preset=tiny-profile "$@"
rc=$?
for f in "$RUN_DIR"/logs/profile_*.txt; do
  [ -f "$f" ] || continue
  echo "== $f"
  head -1 "$f"
  sed -n '/=== by tottime/,/=== by cumulative/p' "$f" | sed -n '1,30p' | cut -c1-160
done
exit $rc
