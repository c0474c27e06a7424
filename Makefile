# The two entry points the README opens with. Both set up .venv first (idempotent; CPU torch on CPU-only machines).
.PHONY: setup sweep test

setup:
	bash scripts/setup.sh

sweep: setup
	bash scripts/main_sweep.sh

test: setup
	bash scripts/test.sh
