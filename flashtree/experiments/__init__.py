"""Experiment layer: Hydra configs, one-run logic, collected tables, W&B logging, trace replay."""
