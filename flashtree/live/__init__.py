"""The live benchmark: sglang servers started from named presets (subprocesses, loopback only), float32 greedy
identity against no speculation, tokens/s (sglang's bench_serving, or flashtree's input-id client), chi-square of
sampled tokens, and the per-step tree statistics in the sweeps' tables. The app is `experiments/live.py`.

Nothing here imports sglang: the servers and bench_serving run as `python -m` subprocesses.
"""
