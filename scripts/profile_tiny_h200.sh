#!/usr/bin/env bash
# Where a decode step's host time goes, on the lent H200 with the tiny example (bf16, CUDA graphs, sglang 0.5.17):
# DSPARK's own chain against flashtree's tree step with N = 1 (the chain's own tree: same tokens, same tau) and N = 8.
# Each server runs alone at concurrency 1 (benchmarks/live/bench_client.py speed) while decode steps STEPS (100:400)
# run under cProfile (benchmarks/live/profile_steps.py); tree servers also log FLASHTREE_STAGE_TIMES.
#     run(command="bash scripts/profile_tiny_h200.sh", carry=[".h200"], kind="nvidia-h200", timeout_s=420)
# $OUT gets speed_results.json, stage_times.txt and server_logs.tgz (with profile_<pid>.txt per server).
set -u
T0=$(date +%s)
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
STAGGER_S=${STAGGER_S:-4}
. scripts/live_lib.sh
live_setup || exit 2
[ -f $WORK/models/prompts.json ] ||
  python3 benchmarks/live/make_models.py $WORK/models .h200/example/tok 2>&1 | grep -vE "it/s\]|Writing" | tail -2
COMMON="--model-path $WORK/models/target --dtype bfloat16 --attention-backend triton --sampling-backend pytorch
  --page-size 1 --mem-fraction-static 0.08 --max-total-tokens 65536 --context-length 2048 --max-running-requests 8
  --cuda-graph-max-bs-decode 8 --cuda-graph-backend-prefill disabled --log-level info"
SPEC="--speculative-algorithm DSPARK --speculative-draft-model-path $WORK/models/draft --speculative-num-draft-tokens 8
  --speculative-draft-attention-backend triton"
prof() { mkdir -p "$LOGS/profile_$1"; echo "FT_PROFILE_STEPS=${STEPS:-100:400} FT_PROFILE_OUT=$LOGS/profile_$1"; }
trap stop_all EXIT
start_server chain 30001 FLASHTREE_TREE_N= $(prof chain) -- $COMMON $SPEC
start_server tree1 30002 FLASHTREE_TREE_N=1 FLASHTREE_STAGE_TIMES=100 $(prof tree1) -- $COMMON $SPEC
start_server tree8 30003 FLASHTREE_TREE_N=8 FLASHTREE_STAGE_TIMES=100 $(prof tree8) -- $COMMON $SPEC
wait_up 240 keep || el "not every server came up (continuing with those that did)"
python3 benchmarks/live/bench_client.py speed --prompts $WORK/models/prompts.json --out "$OUT" --conc 1 --wait 5 \
  $(for t in chain tree1 tree8; do [ -n "${PID[$t]:-}" ] && echo "$t=${PORT[$t]}:${PID[$t]}"; done) | grep -v "^\[bench\]"
sleep 2
stop_all
trap - EXIT
for f in "$LOGS"/profile_*/profile_*.txt; do
  [ -f "$f" ] || continue
  echo "== $f"
  head -1 "$f"
  sed -n '/=== by tottime/,/=== by cumulative/p' "$f" | sed -n '1,30p' | cut -c1-160
done
pack_logs
el "done"
