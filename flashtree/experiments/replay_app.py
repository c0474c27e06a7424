"""The job function of `experiments/replay.py`: record a prompt set once, replay the whole (N, W) grid over it.

    <out>/recording.pt                   the recordings (reused while the measured config and N_max match)
    <out>/tree.n=N,tree.width=W/         steps.parquet, prompts.parquet, summary.json per configuration (as sweeps)
    <out>/summary.parquet                the collected table; <out>/replay_timing.json: record vs replay time
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sys
import time
from pathlib import Path

import torch
from omegaconf import DictConfig

from flashtree import metrics
from flashtree.experiments.app import params_of
from flashtree.experiments.config import ConfigError, to_run_config
from flashtree.files import DamagedFile, load_torch, set_aside
from flashtree.results import store

log = logging.getLogger(__name__)  # Hydra's job logging: the console and <output dir>/<job>.log

RECORDING = "recording.pt"


def load_or_record(rc, out: Path):
    """Recordings of every prompt, from <out>/recording.pt when it matches this config, else recorded now."""
    from tqdm.auto import tqdm

    from flashtree.datasets import encode_prompts, load_prompts
    from flashtree.engine.replay import RECORDING_VERSION, Recording, grown_policies, record
    from flashtree.engine.stopping import stop_ids
    from flashtree.experiments.run import load, make_drafter, measured_config

    if rc.replay.recording:
        saved = load_torch(rc.replay.recording, "the replay recording (replay.recording)")
        log.info(f"[flashtree] replaying {rc.replay.recording} ({len(saved['recordings'])} prompts)")
        return [Recording(**r) for r in saved["recordings"]], saved["record_time_s"]
    # a planned best-first run grows tree.width's tree every step
    planned = rc.tree.auto and rc.tree.policy in grown_policies()
    grown_width = max(*rc.replay.widths, rc.tree.width if planned else 0)
    key = {**measured_config(rc), "tree": None, "replay": None, "n_max": rc.replay.n_max, "v": RECORDING_VERSION}
    digest = store.config_hash(key)
    path = out / RECORDING
    saved = {}
    if path.is_file():
        try:
            saved = load_torch(path, "the replay recording")
        except DamagedFile as err:
            set_aside(err, "recording again")
    if saved.get("hash") == digest:
        recs = [Recording(**r) for r in saved["recordings"]]
        # grown policies' trees are recorded up to the widest W asked for then: a wider grid records again
        if all(t.shape[1] + 1 >= grown_width for r in recs for t, _ in (r.grown or {}).values()):
            log.info(f"[flashtree] reusing {path} ({len(recs)} prompts)")
            return recs, saved["record_time_s"]
    model, tokenizer = load(rc)
    drafter = make_drafter(rc, model)
    prompts = encode_prompts(tokenizer, load_prompts(rc.dataset.name, rc.dataset.limit, rc.dataset.split), rc.dataset.chat)
    stop = stop_ids(model, tokenizer) if rc.engine.stop_at_eos else []
    start = time.perf_counter()
    recs = []
    for ids in tqdm(prompts, desc="record", unit="prompt", disable=not rc.logger.progress, dynamic_ncols=True):
        recs.append(record(model, drafter, ids, n_max=rc.replay.n_max, max_new_tokens=rc.engine.max_new_tokens,
                           seed=rc.seed, stop_ids=stop, grown_width=grown_width))
    elapsed = time.perf_counter() - start
    torch.save({"hash": digest, "record_time_s": elapsed, "recordings": [dataclasses.asdict(r) for r in recs]}, path)
    return recs, elapsed


def write_config(rc, out: Path, n, w: int, steps_per_prompt, recs, planner=None) -> dict:
    """One (N, W) of the grid (N "auto": the run of `planner`), written as a sweep run is."""
    from flashtree.engine.planning import report
    from flashtree.experiments.run import measured_config, write_run

    costs = rc.tree.costs if planner is not None else {}  # the grid's fixed shapes are not priced
    cfg = dataclasses.replace(rc, tree=dataclasses.replace(rc.tree, n=n, width=w, costs=costs))
    run_dir = out / f"tree.n={n},tree.width={w}"
    run_dir.mkdir(parents=True, exist_ok=True)
    rows = [row for i, steps in enumerate(steps_per_prompt) for row in metrics.step_rows(steps, prompt=i)]
    steps = metrics.steps_frame(rows)
    import pandas as pd

    prompts = pd.DataFrame([
        {"prompt": i, "prompt_tokens": r.prompt_len, "new_tokens": r.end - r.prompt_len, "steps": len(s),
         "wall_time_s": math.nan}  # replay measures acceptance, not speed
        for i, (r, s) in enumerate(zip(recs, steps_per_prompt))
    ], columns=list(metrics.PROMPT_COLUMNS))
    params = {k: v for k, v in params_of(cfg).items() if not k.startswith("replay.")}
    head = {"label": run_dir.name, "mode": "replay",
            "config_hash": store.config_hash({**measured_config(cfg), "mode": "replay"}),
            **metrics.summarize(steps, prompts, recs[0].k if recs else 0),
            **({} if planner is None else report(planner, steps))}
    return write_run(cfg, run_dir, steps, prompts, head, params)


def replay_auto(rc, out: Path, recs) -> dict:
    """tree.n=auto beside the grid: the planner over trees of up to tree.width tokens from up to the recording's
    N_max candidates (best-first: its widths up to tree.width), priced by tree.costs or the documented model (replay
    has no timing), learning prompt by prompt."""
    from flashtree.engine import planning
    from flashtree.engine.replay import replay_planned
    from flashtree.planner import AUTO

    shapes = planning.menu(rc.tree.width, recs[0].k, recs[0].n_max, rc.tree.policy)
    planner = planning.make_planner(shapes, planning.modelled_costs(shapes, rc.tree.costs))
    steps = [replay_planned(r, planner, rc.tree.policy) for r in recs]
    return write_config(rc, out, AUTO, rc.tree.width, steps, recs, planner)


def run_replay(cfg: DictConfig) -> float:
    from hydra.core.hydra_config import HydraConfig

    from flashtree.results.lock import holding

    try:
        rc = to_run_config(cfg, HydraConfig.get().overrides.task)
    except ConfigError as exc:
        print(f"flashtree: bad config: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    out = Path(HydraConfig.get().runtime.output_dir)
    with holding(out):
        return replay_grid(rc, out)


def replay_grid(rc, out: Path) -> float:
    """Record (or reuse the recording) and replay the whole grid into `out`; returns the best τ."""
    from tqdm.auto import tqdm

    from flashtree.engine.replay import replay_all
    from flashtree.results.collect import COLLECTED, collect, format_table

    recs, record_time = load_or_record(rc, out)
    grid = [(n, w) for n in rc.replay.ns for w in rc.replay.widths]
    replay_time = 0.0
    for n, w in tqdm(grid, desc="replay", unit="config", disable=not rc.logger.progress, dynamic_ncols=True):
        start = time.perf_counter()
        steps = replay_all(recs, n, w, rc.tree.policy)
        replay_time += time.perf_counter() - start
        write_config(rc, out, n, w, steps, recs)
    if rc.tree.auto and recs:
        start = time.perf_counter()
        replay_auto(rc, out, recs)
        replay_time += time.perf_counter() - start
    timing = {"prompts": len(recs), "configs": len(grid) + rc.tree.auto, "record_time_s": record_time,
              "replay_time_s": replay_time}
    store.write_json_atomic(out / "replay_timing.json", timing)
    df = collect(out)
    log.info(f"\n{format_table(df)}\n\n[flashtree] record {record_time:.1f}s, replay of {len(grid)} configs "
          f"{replay_time:.1f}s; {len(df)} rows -> {out / COLLECTED}")
    return float(df["tau"].max()) if len(df) else 0.0
