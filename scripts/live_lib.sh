# Device staging shared by the live H200 scripts (scripts/live_smollm2_h200.sh, live_h200.sh, profile_tiny_h200.sh);
# source it from the repo root after setting OUT. The servers themselves are started, checked and stopped by the app
# (experiments/live.py, flashtree/live/). Provides: el, live_setup, live_tiny_models, live_run, live_pack_site.
T0=${T0:-$(date +%s)}
ROOT=$(pwd)
WORK=/tmp/flashtree_live
RUN_DIR=$WORK/out  # the app's live.out_dir; $OUT gets an archive of it (the device returns at most 8 files)
SITE=.cache/live-site  # hydra, omegaconf, antlr4: pure-Python packages the H200 image lacks (live_pack_site)
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }

# Dev machine: copy the app's pure-Python dependencies the image lacks into $SITE (carry it with .h200).
live_pack_site() {
  local py=${PY:-.venv/bin/python} site p
  site=$($py -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  rm -rf "$SITE" && mkdir -p "$SITE"
  for p in hydra hydra_core-*.dist-info omegaconf omegaconf-*.dist-info antlr4 antlr4_python3_runtime-*.dist-info; do
    cp -r "$site"/$p "$SITE/"
  done
  find "$SITE" -name __pycache__ -prune -exec rm -rf {} +
  du -sh "$SITE"
}

# The bundle's Python (sglang 0.5.17) with flashtree installed next to it: the checkout plus its dist-info (the
# sglang.srt.plugins entry point), so sglang's load_plugins() finds it in every server process; and the harness
# plugins benchmarks/live/fp32_native.py (does nothing unless FT_FP32_NATIVE=1) and benchmarks/live/profile_steps.py
# (does nothing unless one of its FT_* modes is set); hydra from $SITE (or /tmp/site, left by
# scripts/train_drafter_h200.sh).
live_setup() {
  [ -f .h200/site312.tar.xz ] || { el "carry .h200 (site312.tar.xz, device-env.sh)"; return 2; }
  cd .h200 && . ./device-env.sh && cd "$ROOT" || { el "device-env failed"; return 2; }
  el "env: $(nvidia-smi -L 2>/dev/null | head -1); python $(python3 -V 2>&1); CUDA_HOME=${CUDA_HOME:-unset}"
  mkdir -p "$WORK"
  FT_SITE=$WORK/ftsite
  rm -rf "$FT_SITE" && mkdir -p "$FT_SITE"
  if python3 -m pip install -q --no-deps --no-build-isolation --no-index --no-compile --target "$FT_SITE" . \
    >"$WORK/pip_install.log" 2>&1; then
    el "flashtree installed with pip into $FT_SITE"
  else
    el "pip install failed (see $WORK/pip_install.log); writing flashtree's dist-info by hand"
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
  export PYTHONPATH=$FT_SITE:$ROOT/$SITE:/tmp/site:$PYTHONPATH
  python3 - <<'PY' || { el "flashtree not importable / plugin not registered / no hydra (carry $SITE: live_pack_site)"; return 2; }
from importlib.metadata import entry_points
import flashtree.patches, hydra, sglang
eps = [e.value for e in entry_points(group="sglang.srt.plugins")]
print("sglang", sglang.__version__, "hydra", hydra.__version__, "plugins:", eps, "flashtree from", flashtree.patches.__file__)
assert "flashtree.patches:register" in eps
PY
}

# The tiny example target and DSPARK draft in $WORK/models (built once per warm machine from .h200/example's tokenizer).
live_tiny_models() {
  [ -d .h200/example/tok ] || { el "carry .h200 with example/ (the tiny models' tokenizer)"; return 2; }
  if [ ! -f $WORK/models/prompts.json ]; then
    python3 benchmarks/live/make_models.py $WORK/models .h200/example/tok 2>&1 | grep -vE "it/s\]|Writing" | tail -5
  fi
  [ -f $WORK/models/prompts.json ] || { el "model build failed"; return 2; }
}

# the phase tables written so far into $OUT (the stage and mixed phases' under their phase's name)
live_copy_results() {
  cp "$RUN_DIR"/*_results.json "$OUT/" 2>/dev/null
  local p
  for p in stage mixed; do
    [ -f "$RUN_DIR/$p/speed_results.json" ] && cp "$RUN_DIR/$p/speed_results.json" "$OUT/${p}_speed_results.json"
  done
  return 0
}

# live_run ARGS...: the app into $RUN_DIR (LIVE_S: its time limit, 0 = none), then its results into $OUT (phase JSON,
# tables, one archive of the rest).
live_run() {
  rm -rf "$RUN_DIR"
  # LIVE_S: stop the app (SIGINT: it stops its servers, then writes the tables of what ran) after this many seconds,
  # so a device call's limit never takes the results with it
  # the phase tables reach $OUT as the app writes them (after each server), so a call killed at its own limit
  # (LIVE_S + the 30 s grace + the archive must stay under it) still returns what was measured
  (while sleep 5; do live_copy_results; done) &
  local watcher=$!
  timeout --signal=INT --kill-after=30 "${LIVE_S:-0}" python3 experiments/live.py "live.out_dir=$RUN_DIR" \
    "live.work_dir=$WORK" "$@"
  local rc=$?
  kill "$watcher" 2>/dev/null
  live_copy_results
  cp "$RUN_DIR"/summary.json "$OUT/" 2>/dev/null
  tar czf "$OUT/live_run.tgz" -C "$RUN_DIR" . && el "app rc=$rc; results and logs: $OUT/live_run.tgz"
  return $rc
}
