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
# server logs, the draft config, timings. SERVERS="plain tree" (any subset) runs fewer; TOTAL_S bounds the call;
# DTYPE=bfloat16 serves in bf16; SERVER_EXTRA replaces the extra server flags (default --enable-deterministic-inference).
# If a server of the first attempt dies while starting, every server is restarted once with FALLBACK_EXTRA (default:
# none) and the harness plugin benchmarks/live/fp32_native.py on (FT_FP32_NATIVE=1: sglang's native RMSNorm), the same
# for all servers; ATTEMPTS=1 turns that off. The attempt that served is in $OUT/attempt.txt.
set -u
T0=$(date +%s)
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
TOTAL_S=${TOTAL_S:-570}
SERVERS=${SERVERS:-"plain chain tree splitkv"}
ROOT=$(pwd)
WORK=/tmp/flashtree_live

[ -f .h200/site312.tar.xz ] && [ -d .h200/example/tok ] || { el "carry .h200 (site312.tar.xz and example/)"; exit 2; }
cd .h200 && . ./device-env.sh && cd "$ROOT" || { el "device-env failed"; exit 2; }
el "env: $(nvidia-smi -L 2>/dev/null | head -1); python $(python3 -V 2>&1); CUDA_HOME=${CUDA_HOME:-unset}"

# --- flashtree into the bundle's environment: the checkout on PYTHONPATH plus its dist-info (the sglang.srt.plugins
# entry point), so sglang's load_plugins() finds it in every server process.
FT_SITE=$WORK/ftsite
rm -rf "$FT_SITE" && mkdir -p "$FT_SITE"
if python3 -m pip install -q --no-deps --no-build-isolation --no-index --no-compile --target "$FT_SITE" . >"$OUT/pip_install.log" 2>&1; then
  el "flashtree installed with pip into $FT_SITE"
else
  el "pip install failed (see pip_install.log); writing flashtree's dist-info by hand"
  rm -rf "$FT_SITE" && mkdir -p "$FT_SITE/flashtree-0.1.0.dist-info"
  printf 'Metadata-Version: 2.1\nName: flashtree\nVersion: 0.1.0\n' >"$FT_SITE/flashtree-0.1.0.dist-info/METADATA"
  printf '[sglang.srt.plugins]\nflashtree = flashtree.patches:register\n' >"$FT_SITE/flashtree-0.1.0.dist-info/entry_points.txt"
  : >"$FT_SITE/flashtree-0.1.0.dist-info/RECORD"
  ln -s "$ROOT/flashtree" "$FT_SITE/flashtree"
fi
# the float32 harness plugin (does nothing unless FT_FP32_NATIVE=1)
cp benchmarks/live/fp32_native.py "$FT_SITE/"
mkdir -p "$FT_SITE/ft_live_harness-0.dist-info"
printf 'Metadata-Version: 2.1\nName: ft-live-harness\nVersion: 0\n' >"$FT_SITE/ft_live_harness-0.dist-info/METADATA"
printf '[sglang.srt.plugins]\nfp32native = fp32_native:register\n' >"$FT_SITE/ft_live_harness-0.dist-info/entry_points.txt"
: >"$FT_SITE/ft_live_harness-0.dist-info/RECORD"
export PYTHONPATH=$FT_SITE:$PYTHONPATH
python3 - <<'EOF' || { el "flashtree not importable / plugin not registered"; exit 2; }
from importlib.metadata import entry_points
import flashtree.patches, sglang
eps = [e.value for e in entry_points(group="sglang.srt.plugins")]
print("sglang", sglang.__version__, "plugins:", eps, "flashtree from", flashtree.patches.__file__)
assert "flashtree.patches:register" in eps
EOF

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
declare -A PORT=([plain]=30000 [chain]=30001 [tree]=30002 [splitkv]=30003)
declare -A PID
start() {  # tag env... -- args...
  local tag=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  mkdir -p /tmp/tvmffi_$tag; [ -d /tmp/tvmffi ] && cp -rn /tmp/tvmffi/. /tmp/tvmffi_$tag/ 2>/dev/null
  el "start [$tag] ${envs[*]} $HARNESS_ENV python3 -m sglang.launch_server ... --port ${PORT[$tag]} $EXTRA $*"
  env "${envs[@]}" $HARNESS_ENV TVM_FFI_CACHE_DIR=/tmp/tvmffi_$tag python3 -m sglang.launch_server $COMMON $EXTRA \
    --port ${PORT[$tag]} "$@" >>"$OUT/server_$tag.log" 2>&1 &
  PID[$tag]=$!
}
start_all() {
  for tag in $SERVERS; do
    case $tag in
      plain) start plain FLASHTREE_TREE_N= -- --grammar-backend xgrammar ;;
      chain) start chain FLASHTREE_TREE_N= -- $SPEC --grammar-backend none ;;
      tree) start tree FLASHTREE_TREE_N=8 FLASHTREE_STAGE_TIMES=200 -- $SPEC --grammar-backend xgrammar ;;
      splitkv) start splitkv FLASHTREE_TREE_N=8 FLASHTREE_SPLITKV_VERIFY=1 -- $SPEC --grammar-backend none ;;
    esac
  done
}
# 0 when every server answers /health, 1 as soon as one has died, 2 after $1 seconds
wait_up() {
  local t0=$(date +%s) tag up
  while [ $(( $(date +%s) - t0 )) -lt "$1" ]; do
    up=0
    for tag in "${!PID[@]}"; do
      kill -0 "${PID[$tag]}" 2>/dev/null || { el "[$tag] died while starting"; return 1; }
      python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:${PORT[$tag]}/health', timeout=3)" \
        2>/dev/null && up=$((up + 1))
    done
    [ "$up" -eq "${#PID[@]}" ] && return 0
    sleep 3
  done
  return 2
}
stop_all() {
  for tag in "${!PID[@]}"; do
    local p=${PID[$tag]} kids
    kids=$(ps -o pid= --ppid "$p" 2>/dev/null | tr '\n' ' ')
    kill "$p" 2>/dev/null
    for _ in $(seq 1 10); do kill -0 "$p" 2>/dev/null || break; sleep 1; done
    kill -9 "$p" $kids 2>/dev/null
  done
}
trap stop_all EXIT
start_all
echo "1: $EXTRA" >"$OUT/attempt.txt"
wait_up $(( TOTAL_S / 2 ))
if [ $? -eq 1 ] && [ "$ATTEMPTS" -ge 2 ]; then
  el "attempt 1 failed ($EXTRA); restarting every server with FALLBACK_EXTRA='$FALLBACK_EXTRA' and FT_FP32_NATIVE=1"
  for tag in "${!PID[@]}"; do grep -nE "Error|error" "$OUT/server_$tag.log" | tail -3 | cut -c1-300; done
  stop_all
  EXTRA=$FALLBACK_EXTRA HARNESS_ENV=FT_FP32_NATIVE=1
  PID=()
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
for tag in "${!PID[@]}"; do
  echo "--- [$tag] key log lines"
  grep -nE "Traceback|Error|error|flashtree|SystemExit|Capture|fired up|max_total_num_tokens" "$OUT/server_$tag.log" \
    | grep -vE "GET /health" | tail -25 | cut -c1-400
done
stop_all
trap - EXIT
cp -r /tmp/tvmffi_plain/. /tmp/tvmffi/ 2>/dev/null
el "done rc=$RC"
exit $RC
