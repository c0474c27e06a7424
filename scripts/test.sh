#!/usr/bin/env bash
# The whole test suite: the core, engine, kernels (Triton interpreter) and experiments in .venv, then the sglang
# patch tests in one virtualenv per supported sglang release.
set -euo pipefail
cd "$(dirname "$0")/.."
export TRITON_INTERPRET=1 WANDB_MODE=offline HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
.venv/bin/python -m pytest -q -p no:cacheprovider --ignore=tests/patches tests
if [ -f scripts/test_patches.sh ]; then bash scripts/test_patches.sh; fi
