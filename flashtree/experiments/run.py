"""One run = one configuration over its prompts: open its W&B run (flashtree.results.wandb_log), load, generate with
progress, store (flashtree.results.store), close the W&B run."""

from __future__ import annotations

import dataclasses
import logging
import sys
import time
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

from flashtree import metrics
from flashtree.engine.stopping import stop_ids
from flashtree.engine.target import greedy_reference
from flashtree.experiments import progress
from flashtree.experiments.config import NOT_MEASURED, RunConfig
from flashtree.results import provenance, store


log = logging.getLogger(__name__)  # Hydra's job logging: the console and <output dir>/<job>.log

def measured_config(cfg: RunConfig) -> dict:
    """The part of the config that changes what is measured (hashed for resume)."""
    d = dataclasses.asdict(cfg)
    if not d["tree"]["costs"]:
        del d["tree"]["costs"]  # the default: hashes as before the key existed, so earlier runs still resume
    return {k: v for k, v in d.items() if k not in NOT_MEASURED}


def prompt_seed(seed: int, prompt: int) -> int:
    """Generator seed of prompt `prompt`: fixed by (seed, prompt), whatever else the sweep varies."""
    return (seed * 1_000_003 + prompt) % (2**63)


@lru_cache(maxsize=2)
def _load_target(name: str, dtype: str, device: str, cache_dir: str | None, seed: int):
    # Cached per process: a basic-launcher sweep runs every configuration in one process and reuses the weights.
    import torch

    from flashtree.models import load_target

    model, tokenizer = load_target(name, dtype=getattr(torch, dtype), cache_dir=cache_dir, seed=seed)
    return model.to(device).eval(), tokenizer


def load(cfg: RunConfig):
    t = cfg.target
    return _load_target(t.name, t.dtype, t.device, t.cache_dir, t.seed)


def make_drafter(cfg: RunConfig, model, reference=None):
    """The configured drafter; the oracle drafter is built per prompt from `reference`, the target's greedy decoding."""
    from flashtree.drafters import load_drafter

    options = dict(cfg.drafter.options)
    if reference is not None:
        options["sequences"] = [reference]
    return load_drafter(cfg.drafter.name, model, **options)


def make_planner(cfg: RunConfig, model, k: int, prompt):
    """tree.n=auto: the planner over trees of up to tree.width tokens (N up to 64 and W; best-first: its widths),
    priced by tree.costs or, without it, by timing the verify forward of each width on `prompt` now."""
    import torch

    from flashtree.engine import planning

    shapes = planning.menu(cfg.tree.width, k, policy=cfg.tree.policy)
    if cfg.tree.costs:
        costs = planning.modelled_costs(shapes, cfg.tree.costs)
    else:
        costs = planning.measure_costs(model, shapes, torch.tensor(prompt, device=cfg.target.device))
    log.info("[flashtree] tree.n=auto cost table (ms per step): "
             + ", ".join(f"{r['shape']} {r['ms']}" for r in costs.rows()))
    return planning.make_planner(shapes, costs)


def generate_prompts(cfg: RunConfig, label: str, on_prompt=None):
    """Run the engine over the configured prompts; returns (steps DataFrame, prompts DataFrame, K, warm-up record, plan
    report: {} unless tree.n=auto). `on_prompt(rows)` receives each prompt's steps-table rows as soon as the prompt is
    done."""
    import pandas as pd
    import torch
    from tqdm.auto import tqdm

    from flashtree.datasets import encode_prompts, load_prompts
    from flashtree.engine import planning, tree_generate
    from flashtree.engine.generate import check_context

    model, tokenizer = load(cfg)
    prompts = load_prompts(cfg.dataset.name, limit=cfg.dataset.limit, split=cfg.dataset.split)
    encoded = encode_prompts(tokenizer, prompts, chat=cfg.dataset.chat)
    # Before the warm-up, whose shorter generation would otherwise be the one quoted.
    check_context(model, max(map(len, encoded)), cfg.engine.max_new_tokens, cfg.tree.width)
    stop = stop_ids(model, tokenizer) if cfg.engine.stop_at_eos else []
    device = cfg.target.device
    e = cfg.engine
    # The oracle drafter knows each prompt's greedy continuation (past max_new_tokens by a block or two).
    per_prompt_drafter = cfg.drafter.name == "oracle" and "sequences" not in cfg.drafter.options
    drafter = None if per_prompt_drafter else make_drafter(cfg, model)
    planner = None  # tree.n=auto: made at the first prompt (its menu needs the drafter's K), kept for the run

    def generate(ids, drafter, max_new, seed):
        generator = torch.Generator(device=device).manual_seed(seed)
        n = cfg.tree.n if planner is None else planning.draws(planner)
        with torch.no_grad():
            return tree_generate(
                model, drafter, ids, n=n, width=cfg.tree.width, max_new_tokens=max_new,
                temperature=e.temperature, top_k=e.top_k, top_p=e.top_p, generator=generator,
                stop_token_ids=stop or None, policy=cfg.tree.policy, planner=planner,
            )

    step_rows, prompt_rows, k = [], [], None
    warmup = {"generations": 0}
    bar = tqdm(encoded, desc=progress.short_label(label), unit="prompt", disable=not cfg.logger.progress,
               dynamic_ncols=True)
    committed = n_steps = 0
    for i, ids in enumerate(bar):
        input_ids = torch.tensor([ids], dtype=torch.long, device=device)
        reference = None
        if per_prompt_drafter:
            reference = greedy_reference(model, input_ids, e.max_new_tokens + 16, stop)[0].tolist()
        d = make_drafter(cfg, model, reference) if per_prompt_drafter else drafter
        k = d.k
        if cfg.tree.auto and planner is None:
            planner = make_planner(cfg, model, k, ids)
        if e.warmup and i == 0:
            start = time.perf_counter()
            generate(input_ids, d, min(4, e.max_new_tokens), 0)  # untimed: first-call allocations and lazy init
            warmup = {"generations": 1, "prompt": 0, "max_new_tokens": min(4, e.max_new_tokens),
                      "time_s": time.perf_counter() - start}
            if per_prompt_drafter:
                d = make_drafter(cfg, model, reference)  # a fresh oracle: its step counter restarts
        result = generate(input_ids, d, e.max_new_tokens, prompt_seed(cfg.seed, i))
        rows = metrics.step_rows(result.steps, prompt=i)
        step_rows += rows
        if on_prompt is not None:
            on_prompt(rows)
        prompt_rows.append({
            "prompt": i,
            "prompt_tokens": len(ids),
            "new_tokens": int(result.new_tokens[0]),
            "steps": len(rows),
            "wall_time_s": float(result.wall_time_s),
        })
        committed += sum(r["committed"] for r in rows)
        n_steps += len(rows)
        eta = progress.sweep_eta((i + 1) / len(encoded))
        bar.set_postfix(tau=f"{committed / max(n_steps, 1):.3f}", **({"sweep_eta": eta} if eta else {}))
    bar.close()
    steps = metrics.steps_frame(step_rows)
    prompts_df = pd.DataFrame(prompt_rows, columns=list(metrics.PROMPT_COLUMNS))
    plan = {} if planner is None else planning.report(planner, steps)
    return steps, prompts_df, k if k is not None else 0, warmup, plan


@contextmanager
def fixed_threads(threads: int | None):
    """torch's CPU thread count held at `threads` for the run (None: the process's count), restored after: a sweep's
    configurations are timed with the same threads whatever ran before them."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_configuration(cfg: RunConfig, run_dir: Path, *, label: str, params: dict) -> dict:
    """Run one configuration into `run_dir` (or reuse its finished results there) and return its summary. Its W&B
    run is opened first, takes each prompt's steps as they finish and is closed with the stored summary."""
    from flashtree.results.wandb_log import WandbRun, log_run

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    digest = store.config_hash(measured_config(cfg))
    if cfg.resume:
        done = store.finished(run_dir, digest)
        if done is not None:
            log.info(f"[flashtree] {label}: finished earlier, skipped (tau={done['tau']:.3f}; {run_dir})")
            if not done.get("wandb"):
                done = _with_wandb(run_dir, done, _wandb(cfg, lambda: log_run(
                    cfg.logger.wandb, run_dir, done, label=label, group=_group(cfg))))
            return done

    wb = _wandb(cfg, lambda: WandbRun(cfg.logger.wandb, run_dir, label=label, group=_group(cfg), config=params))
    on_prompt = (lambda rows: _wandb(cfg, lambda: wb.log_steps(rows))) if wb else None
    with fixed_threads(cfg.engine.threads):
        machine = provenance.machine()  # before the run: its load average is what the run started under
        started_at = time.time()
        start = time.perf_counter()
        steps, prompts_df, k, warmup, plan = generate_prompts(cfg, label, on_prompt)
        run_time = time.perf_counter() - start
    head = {"label": label, "mode": "direct", "config_hash": digest, **metrics.summarize(steps, prompts_df, k), **plan,
            "started_at": started_at, "run_time_s": run_time, "warmup": warmup,
            "machine": {**machine, "load_average_after": provenance.machine()["load_average"]}}
    summary = store.write_run(run_dir, steps, prompts_df, head, params=params, config=dataclasses.asdict(cfg))
    if wb:
        summary = _with_wandb(run_dir, summary, _wandb(cfg, lambda: wb.finish(summary, run_dir)))
    log.info(f"[flashtree] {label}: tau={summary['tau']:.3f} tokens/s={summary['tokens_per_s']:.1f} -> {run_dir}")
    return summary


def write_run(cfg: RunConfig, run_dir: Path, steps, prompts_df, head: dict, params: dict) -> dict:
    """Store a finished run of `cfg` in `run_dir` (a replayed configuration) and log it to W&B (unless disabled)."""
    from flashtree.results.wandb_log import log_run

    summary = store.write_run(run_dir, steps, prompts_df, head, params=params, config=dataclasses.asdict(cfg))
    return _with_wandb(run_dir, summary, _wandb(cfg, lambda: log_run(
        cfg.logger.wandb, run_dir, summary, label=head["label"], group=_group(cfg), steps=steps)))


def _group(cfg: RunConfig) -> str:
    return cfg.logger.wandb.group or cfg.name


_wandb_failed: list[str] = []  # the W&B failure of this process, reported once; later runs skip W&B


def _wandb(cfg: RunConfig, action):
    """`action()` (a call into flashtree.results.wandb_log), or None when W&B is disabled, failed earlier in this
    process or fails now. W&B trouble never costs the local results: the run stays finished without its W&B view (a
    rerun with W&B working logs it), and the first failure of the process is one warning."""
    if cfg.logger.wandb.mode == "disabled" or _wandb_failed:
        return None
    try:
        return action()
    except Exception as err:  # noqa: BLE001 - import errors, missing API key, network: all leave the local run intact
        _wandb_failed.append(f"{type(err).__name__}: {err}")
        print(f"flashtree: warning: W&B logging failed (logger.wandb.mode={cfg.logger.wandb.mode!r}; "
              f"{_wandb_failed[0]}); the local results are kept and W&B is skipped for the rest of this process; "
              "fix W&B (wandb installed, `wandb login` or WANDB_API_KEY for online) and rerun to log them, or set "
              "logger=disabled", file=sys.stderr)
        return None


def _with_wandb(run_dir: Path, summary: dict, info: dict | None) -> dict:
    """The summary with where its W&B run went, stored; unchanged when nothing was logged."""
    if info is None:
        return summary
    summary = {**summary, "wandb": info}
    store.write_json_atomic(run_dir / store.SUMMARY, summary)
    return summary


def objective(summary: dict, cfg: RunConfig) -> float:
    """What an optimising sweeper maximises: the chosen metric, 0 when a constraint is violated."""
    o = cfg.objective
    if o.min_tau is not None and not summary["tau"] >= o.min_tau:
        return 0.0
    if o.max_budget is not None and cfg.tree.width > o.max_budget:
        return 0.0
    value = summary.get(o.metric)
    return float(value) if value is not None else 0.0
