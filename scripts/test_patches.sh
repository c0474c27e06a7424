#!/usr/bin/env bash
# Runs tests/patches under each supported sglang release's own venv (.venv-sglang-VERSION, created by
# scripts/setup_sglang.sh when missing). Usage: bash scripts/test_patches.sh [VERSION ...] [-- pytest args]
# Default: every release of flashtree/patches/adapters/RELEASES. Exit status: non-zero if any release's tests fail (all releases still run).
set -uo pipefail
cd "$(dirname "$0")/.."
versions=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do versions+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
[ ${#versions[@]} -eq 0 ] && mapfile -t versions < <(bash scripts/setup_sglang.sh --list)
export TRITON_INTERPRET=1 PYTHONDONTWRITEBYTECODE=1
status=0
for v in "${versions[@]}"; do
  echo "=== sglang $v"
  if ! bash scripts/setup_sglang.sh "$v"; then
    echo "sglang $v: environment setup failed" >&2; status=1; continue
  fi
  start=$SECONDS
  if ! ".venv-sglang-$v/bin/python" -m pytest -q -p no:cacheprovider --timeout=600 tests/patches "$@"; then
    status=1
  fi
  echo "=== sglang $v: $((SECONDS - start)) s"
done
exit $status
