#!/usr/bin/env bash
# Placeholder until the sweep app lands: a small honest demo of the tree core on random candidates.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m flashtree.tree.demo
