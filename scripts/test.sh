#!/usr/bin/env bash
# The whole test suite: the core, engine, kernels (Triton interpreter) and experiments in .venv, and beside them the
# sglang patch tests in one virtualenv per supported sglang release. The two run side by side: each is mostly one
# core's Python (the Triton interpreter), so on two cores the suite takes about as long as its longer half.
set -uo pipefail
cd "$(dirname "$0")/.."
export TRITON_INTERPRET=1 WANDB_MODE=offline HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
patch_log=$(mktemp "${TMPDIR:-/tmp}/flashtree-patch-tests.XXXXXX")
bash scripts/test_patches.sh >"$patch_log" 2>&1 &
patches=$!
echo "sglang patch tests running beside the core suite (their log follows it): $patch_log"
.venv/bin/python -m pytest -q -p no:cacheprovider --ignore=tests/patches tests
core=$?
wait "$patches"
patched=$?
cat "$patch_log" && rm -f "$patch_log"
echo "core suite exit $core, patch tests exit $patched"
[ "$core" -eq 0 ] && [ "$patched" -eq 0 ]
