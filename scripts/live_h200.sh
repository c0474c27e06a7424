#!/usr/bin/env bash
# Issue 8: flashtree's tree toggles live on the lent H200 (sglang 0.5.17), tiny example target + DSPARK draft.
#
# One device call, from the repo root, carrying .h200 (built by `bash ../shared/tools/sglang-h200/build.sh .h200`, with
# ../shared/tools/sglang-h200/example copied to .h200/example):
#     run(command="bash scripts/live_h200.sh", carry=[".h200"], kind="nvidia-h200", timeout_s=600)
# It installs flashtree into the bundle's environment, builds the models on the device, starts four float32 servers in
# parallel (CUDA graphs on, Triton attention, sglang's --enable-deterministic-inference: its batch-invariant RMSNorm
# takes float32, sgl_kernel's does not):
#     plain    no speculation, toggles off, --grammar-backend xgrammar     port 30000
#     chain    DSPARK chain, toggles off                                   port 30001
#     tree     DSPARK + FLASHTREE_TREE_N=8, split-KV off, xgrammar          port 30002
#     splitkv  DSPARK + FLASHTREE_TREE_N=8 + FLASHTREE_SPLITKV_VERIFY=1     port 30003
# runs benchmarks/live/client.py against them, and leaves everything under $OUT: live_results.json, greedy outputs,
# server_logs.tgz, stage_times.txt (the tree server's FLASHTREE_STAGE_TIMES lines), the draft config. SERVERS="plain tree" (any subset) runs fewer; TOTAL_S bounds the call;
# DTYPE=bfloat16 serves in bf16; SERVER_EXTRA replaces the extra server flags (default --enable-deterministic-inference).
# If a server of the first attempt dies while starting, every server is restarted once with FALLBACK_EXTRA (default:
# none) and the harness plugin benchmarks/live/fp32_native.py on (FT_FP32_NATIVE=1: sglang's native RMSNorm), the same
# for all servers; ATTEMPTS=1 turns that off. The attempt that served is in $OUT/attempt.txt. TREE_ENV adds toggles to
# the tree and splitkv servers (e.g. TREE_ENV=FLASHTREE_GRAPH_DRAWS=1).
set -u
T0=$(date +%s)
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
TOTAL_S=${TOTAL_S:-570}
SERVERS=${SERVERS:-"plain chain tree splitkv"}
. scripts/live_lib.sh
[ -d .h200/example/tok ] || { el "carry .h200 with example/ (the tiny models' tokenizer)"; exit 2; }
live_setup || exit 2

# --- models (cached in /tmp across calls on a warm machine)
if [ ! -f $WORK/models/prompts.json ]; then
  python3 benchmarks/live/make_models.py $WORK/models .h200/example/tok 2>&1 | grep -vE "it/s\]|Writing" | tail -5
fi
[ -f $WORK/models/prompts.json ] || { el "model build failed"; exit 2; }
cp $WORK/models/draft/config.json "$OUT/draft_config.json"; cp $WORK/models/prompts.json "$OUT/prompts.json"
el "models ready"

COMMON="--model-path $WORK/models/target --dtype ${DTYPE:-float32} --attention-backend triton --sampling-backend pytorch
  --page-size 1 --mem-fraction-static 0.08 --max-total-tokens 65536 --context-length 2048 --max-running-requests 8
  --cuda-graph-max-bs-decode 8 --cuda-graph-backend-prefill disabled --log-level info"
EXTRA=${SERVER_EXTRA---enable-deterministic-inference}
FALLBACK_EXTRA=${FALLBACK_EXTRA:-}
ATTEMPTS=${ATTEMPTS:-2}
HARNESS_ENV=FT_FP32_NATIVE=0
SPEC="--speculative-algorithm DSPARK --speculative-draft-model-path $WORK/models/draft --speculative-num-draft-tokens 8
  --speculative-draft-attention-backend triton"
declare -A PORTS=([plain]=30000 [chain]=30001 [tree]=30002 [splitkv]=30003)
start_all() {
  for tag in $SERVERS; do
    case $tag in
      plain) start_server plain ${PORTS[plain]} FLASHTREE_TREE_N= -- $COMMON $EXTRA --grammar-backend xgrammar ;;
      chain) start_server chain ${PORTS[chain]} FLASHTREE_TREE_N= -- $COMMON $EXTRA $SPEC --grammar-backend none ;;
      tree) start_server tree ${PORTS[tree]} FLASHTREE_TREE_N=8 FLASHTREE_STAGE_TIMES=200 ${TREE_ENV:-} -- $COMMON $EXTRA $SPEC \
        --grammar-backend xgrammar ;;
      splitkv) start_server splitkv ${PORTS[splitkv]} FLASHTREE_TREE_N=8 FLASHTREE_SPLITKV_VERIFY=1 ${TREE_ENV:-} -- $COMMON $EXTRA \
        $SPEC --grammar-backend none ;;
    esac
  done
}
trap stop_all EXIT
start_all
echo "1: $EXTRA" >"$OUT/attempt.txt"
wait_up $(( TOTAL_S / 2 ))
if [ $? -eq 1 ] && [ "$ATTEMPTS" -ge 2 ]; then
  el "attempt 1 failed ($EXTRA); restarting every server with FALLBACK_EXTRA='$FALLBACK_EXTRA' and FT_FP32_NATIVE=1"
  for tag in "${!PID[@]}"; do grep -nE "Error|error" "$LOGS/server_$tag.log" | tail -3 | cut -c1-300; done
  stop_all
  sleep 5
  EXTRA=$FALLBACK_EXTRA HARNESS_ENV=FT_FP32_NATIVE=1
  start_all
  echo "2: FT_FP32_NATIVE=1 $EXTRA" >"$OUT/attempt.txt"
fi

ARGS=()
for tag in "${!PID[@]}"; do ARGS+=("$tag=${PORT[$tag]}:${PID[$tag]}"); done
WAIT=$(( TOTAL_S - ($(date +%s) - T0) - 120 ))
el "client (health wait up to ${WAIT}s): ${ARGS[*]}"
python3 benchmarks/live/client.py --prompts $WORK/models/prompts.json --out "$OUT" --wait $WAIT "${ARGS[@]}"
RC=$?
el "client rc=$RC"
key_log_lines
stop_all
pack_logs
tail -4 "$OUT/stage_times.txt"
trap - EXIT
cp -r /tmp/tvmffi_plain/. /tmp/tvmffi/ 2>/dev/null
el "done rc=$RC"
exit $RC
