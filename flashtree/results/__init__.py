"""The results pipeline: what sweeps, replay and live runs write and what the notebook reads.

    store       a run directory: steps.parquet, prompts.parquet, summary.json (atomic; resume checks)
    collect     every finished run under a directory -> summary.parquet (one row per configuration); load_results
    live        a live sglang run's per-request statistics -> the same steps table and summary
    wandb_log   one finished run as a W&B run (offline by default), and reading an offline run back
    plots       figures of a collected table

The metrics themselves (τ, reach and acceptance per depth, stage times, CIs) are defined once in `flashtree.metrics`.
"""
