#!/usr/bin/env bash
# Creates .venv-sglang-VERSION (repo root): one sglang release installed the CPU way, with flashtree editable in it.
#   bash scripts/setup_sglang.sh VERSION       a release listed in flashtree/patches/adapters/RELEASES
#   bash scripts/setup_sglang.sh --list        prints those releases, one per line
# Idempotent: an existing, complete venv (marker file) is left as is; FLASHTREE_SGLANG_REBUILD=1 rebuilds it.
#
# How (see README / flashtree/patches/README.md): torch 2.13.0 CPU pinned for every release (whatever sglang's own torch
# pin says; a CUDA torch would pull GBs of nvidia libraries); sglang, xgrammar, torchvision and triton with --no-deps
# (their declared deps are CUDA-heavy); then the small runtime deps sglang's server modules import, every version pinned
# by requirements/sglang-VERSION.txt (a pip constraints file) so the install is reproducible from PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
RELEASES=$(sed -e 's/#.*//' -e 's/[[:space:]]//g' -e '/^$/d' flashtree/patches/adapters/RELEASES)
if [ "${1:-}" = --list ]; then echo "$RELEASES"; exit 0; fi
VERSION=${1:?usage: scripts/setup_sglang.sh VERSION (one of: $(echo $RELEASES)) or --list}
if ! grep -qxF -- "$VERSION" <<<"$RELEASES"; then
  echo "setup_sglang.sh: unsupported sglang release '$VERSION'; supported: $(echo $RELEASES)" >&2; exit 2
fi
CONSTRAINTS=requirements/sglang-$VERSION.txt
VENV=.venv-sglang-$VERSION
MARK=$VENV/.flashtree-ready
[ -f "$CONSTRAINTS" ] || { echo "missing $CONSTRAINTS" >&2; exit 2; }
if [ -f "$MARK" ] && [ "${FLASHTREE_SGLANG_REBUILD:-0}" != 1 ] && cmp -s "$CONSTRAINTS" "$MARK"; then
  echo "$VENV ready"
  exit 0
fi
rm -rf "$VENV"
PY=${PYTHON:-python3}
"$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
C=(-c "$CONSTRAINTS")
# 1. torch: the CPU build (2.13.0) the constraints pin.
"${PIP[@]}" install "${C[@]}" torch
# 2. packages whose declared deps must not come in (CUDA builds, triton pulled twice, ...). flashmap where the
#    constraints pin it (the release its sglang draft model targets; tests/patches/test_flashmap_draft.py).
FLASHMAP=(); grep -q '^flashmap==' "$CONSTRAINTS" && FLASHMAP=(flashmap)
"${PIP[@]}" install "${C[@]}" --no-deps "sglang==$VERSION" xgrammar torchvision triton "${FLASHMAP[@]}"
# 3. what sglang's server, scheduler and speculative modules import, plus the test runner. Versions: the constraints.
"${PIP[@]}" install "${C[@]}" \
  apache-tvm-ffi numpy orjson psutil pybase64 requests packaging pillow msgspec pyzmq tqdm ipython pydantic aiohttp \
  dill einops compressed-tensors gguf openai partial-json-parser sentencepiece setproctitle uvicorn fastapi \
  distro transformers tokenizers pytest pytest-timeout
# 4. flashtree itself, editable, without its own deps (torch is already there).
"${PIP[@]}" install --no-deps -e .
"$VENV/bin/python" - "$VERSION" <<'EOF'
import importlib.metadata as md, sys
want = sys.argv[1]
got = md.version("sglang")
assert got == want, f"sglang {got} installed, expected {want}"
print(f"sglang {got}, torch {md.version('torch')}, transformers {md.version('transformers')}")
EOF
cp "$CONSTRAINTS" "$MARK"
echo "$VENV ready"
