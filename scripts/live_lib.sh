# Shared by the live H200 scripts (scripts/live_h200.sh, scripts/live_smollm2_h200.sh); source it from the repo root
# after setting OUT. Provides: el, live_setup, start_server, wait_up, stop_all, key_log_lines, pack_logs.
# Server logs go to $LOGS (the device returns at most 8 files from $OUT: pack_logs puts them there as one archive).
T0=${T0:-$(date +%s)}
ROOT=$(pwd)
WORK=/tmp/flashtree_live
LOGS=${LOGS:-$WORK/logs}
STAGGER_S=${STAGGER_S:-0}  # seconds between server starts: concurrent starts race sglang's memory check
mkdir -p "$LOGS"
# a warm machine keeps /tmp: one run's archive holds that run's logs and profile_steps.py files only
rm -rf "$LOGS"/server_*.log "$LOGS"/{profile,loop,trace,syncs,steps}_*
HARNESS_ENV=${HARNESS_ENV:-FT_FP32_NATIVE=0}
declare -A PORT PID
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }

# The bundle's Python (sglang 0.5.17) with flashtree installed next to it: the checkout plus its dist-info (the
# sglang.srt.plugins entry point), so sglang's load_plugins() finds it in every server process; and the float32
# harness plugins benchmarks/live/fp32_native.py (does nothing unless FT_FP32_NATIVE=1) and
# benchmarks/live/profile_steps.py (does nothing unless one of its FT_* modes is set).
live_setup() {
  [ -f .h200/site312.tar.xz ] || { el "carry .h200 (site312.tar.xz, device-env.sh)"; return 2; }
  cd .h200 && . ./device-env.sh && cd "$ROOT" || { el "device-env failed"; return 2; }
  el "env: $(nvidia-smi -L 2>/dev/null | head -1); python $(python3 -V 2>&1); CUDA_HOME=${CUDA_HOME:-unset}"
  el "cpu: $(nproc) cores; $(lscpu 2>/dev/null | grep -E '^(Model name|Thread|Socket|NUMA node)' | tr -s ' ' | paste -sd';')"
  FT_SITE=$WORK/ftsite
  rm -rf "$FT_SITE" && mkdir -p "$FT_SITE"
  if python3 -m pip install -q --no-deps --no-build-isolation --no-index --no-compile --target "$FT_SITE" . \
    >"$LOGS/pip_install.log" 2>&1; then
    el "flashtree installed with pip into $FT_SITE"
  else
    el "pip install failed (see $LOGS/pip_install.log); writing flashtree's dist-info by hand"
    rm -rf "$FT_SITE" && mkdir -p "$FT_SITE/flashtree-0.1.0.dist-info"
    printf 'Metadata-Version: 2.1\nName: flashtree\nVersion: 0.1.0\n' >"$FT_SITE/flashtree-0.1.0.dist-info/METADATA"
    printf '[sglang.srt.plugins]\nflashtree = flashtree.patches:register\n' \
      >"$FT_SITE/flashtree-0.1.0.dist-info/entry_points.txt"
    : >"$FT_SITE/flashtree-0.1.0.dist-info/RECORD"
    ln -s "$ROOT/flashtree" "$FT_SITE/flashtree"
  fi
  cp benchmarks/live/fp32_native.py benchmarks/live/profile_steps.py "$FT_SITE/"
  mkdir -p "$FT_SITE/ft_live_harness-0.dist-info"
  printf 'Metadata-Version: 2.1\nName: ft-live-harness\nVersion: 0\n' >"$FT_SITE/ft_live_harness-0.dist-info/METADATA"
  printf '[sglang.srt.plugins]\nfp32native = fp32_native:register\nprofilesteps = profile_steps:register\n' \
    >"$FT_SITE/ft_live_harness-0.dist-info/entry_points.txt"
  : >"$FT_SITE/ft_live_harness-0.dist-info/RECORD"
  export PYTHONPATH=$FT_SITE:$PYTHONPATH
  python3 - <<'PY' || { el "flashtree not importable / plugin not registered"; return 2; }
from importlib.metadata import entry_points
import flashtree.patches, sglang
eps = [e.value for e in entry_points(group="sglang.srt.plugins")]
print("sglang", sglang.__version__, "plugins:", eps, "flashtree from", flashtree.patches.__file__)
assert "flashtree.patches:register" in eps
PY
}

# start_server TAG PORT [ENV=VALUE ...] -- [server args ...]   (log: $LOGS/server_TAG.log)
start_server() {
  local tag=$1 port=$2; shift 2
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  mkdir -p /tmp/tvmffi_$tag; [ -d /tmp/tvmffi ] && cp -rn /tmp/tvmffi/. /tmp/tvmffi_$tag/ 2>/dev/null
  el "start [$tag] ${envs[*]} $HARNESS_ENV python3 -m sglang.launch_server --port $port $*"
  env "${envs[@]}" $HARNESS_ENV FT_PROFILE_TAG=$tag TVM_FFI_CACHE_DIR=/tmp/tvmffi_$tag python3 -m sglang.launch_server --port "$port" "$@" \
    >>"$LOGS/server_$tag.log" 2>&1 &
  PID[$tag]=$!
  PORT[$tag]=$port
  sleep "$STAGGER_S"
}

# wait_up SECONDS [keep]: 0 when every started server answers /health, 1 as soon as one has died, 2 on timeout.
# With "keep", a server that dies is dropped (its log stays) and the others are still waited for; 1 at the end then.
wait_up() {
  local t0=$(date +%s) tag up died=0
  while [ $(( $(date +%s) - t0 )) -lt "$1" ]; do
    up=0
    for tag in "${!PID[@]}"; do
      if ! kill -0 "${PID[$tag]}" 2>/dev/null; then
        el "[$tag] died while starting"
        [ "${2:-}" = keep ] || return 1
        unset "PID[$tag]"; died=1; continue
      fi
      python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:${PORT[$tag]}/health', timeout=3)" \
        2>/dev/null && up=$((up + 1))
    done
    [ "$up" -eq "${#PID[@]}" ] && { el "all ${#PID[@]} servers up"; return $died; }
    sleep 3
  done
  return 2
}

# stop_all [TAG ...]: stop the named servers (default: all) and their children
stop_all() {
  local tags=("$@") tag p kids
  [ ${#tags[@]} -eq 0 ] && tags=("${!PID[@]}")
  for tag in "${tags[@]}"; do
    p=${PID[$tag]:-}
    [ -n "$p" ] || continue
    kids=$(ps -o pid= --ppid "$p" 2>/dev/null | tr '\n' ' ')
    kill "$p" 2>/dev/null
    for _ in $(seq 1 10); do kill -0 "$p" 2>/dev/null || break; sleep 1; done
    kill -9 "$p" $kids 2>/dev/null
    unset "PID[$tag]"
  done
}

key_log_lines() {
  local f
  for f in "$LOGS"/server_*.log; do
    echo "--- [$(basename "$f" .log)] key log lines"
    grep -nE "Traceback|Error|error|flashtree|SystemExit|Capture.*end|fired up|max_total_num_tokens" "$f" \
      | grep -vE "GET /health|server_args=" | tail -12 | cut -c1-300
  done
}

pack_logs() {
  local f
  for f in "$LOGS"/server_*.log; do  # each line tagged with its server: several servers may time their stages
    grep -h "stage times" "$f" | sed "s/^/[$(basename "$f" .log)] /" | cut -c1-420
  done >"$OUT/stage_times.txt" 2>/dev/null
  tar czf "$OUT/server_logs.tgz" -C "$LOGS" . && el "server logs: $OUT/server_logs.tgz"
}
