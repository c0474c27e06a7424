"""Hydra glue of the experiment apps: structured configs, the sweep and replay job functions, the sweep callback."""
