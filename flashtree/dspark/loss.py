"""The DSPARK training objective: from the target's hidden states (the context) and an anchor, predict the next
block_size tokens in one forward, with the Markov head teacher-forced on the true previous tokens.

For a sequence x_0 .. x_{T-1} and an anchor position a (the last committed token; positions < a have target KV), the
block [x_a, mask, ..., mask] at positions a .. a + K - 1 sees context positions 0 .. a - 1 and its own rows; row j is
trained on x_{a+1+j} with logits lm_head(h_j) + markov_bias(x_{a+j}). Many anchors of one sequence share one forward:
each block only sees its own rows (a block-diagonal mask) and the context before its anchor.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .model import DSparkDraftModel, block_ids


@torch.no_grad()
def target_features(target, tokens: torch.Tensor, lengths: torch.Tensor, layer_ids) -> torch.Tensor:
    """(B, T, len(layer_ids) * H): the target's hidden states (HF hidden_states[i + 1]) at every position of the
    right-padded `tokens`, concatenated in `layer_ids` order."""
    mask = (torch.arange(tokens.shape[1], device=tokens.device)[None] < lengths[:, None]).long()
    out = target.model(input_ids=tokens, attention_mask=mask, output_hidden_states=True, use_cache=False)
    return torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1)


def sample_anchors(lengths: torch.Tensor, prompt_lens: torch.Tensor, count: int, generator=None):
    """(B, count) anchor positions drawn without replacement from each row's response region
    [prompt_len - 1, length - 2], and a validity mask (rows with fewer positions repeat the last, marked invalid)."""
    rows, valid = [], []
    for length, p0 in zip(lengths.tolist(), prompt_lens.tolist()):
        lo, hi = max(p0 - 1, 0), length - 2
        span = hi - lo + 1
        if span <= 0:
            rows.append(torch.zeros(count, dtype=torch.long))
            valid.append(torch.zeros(count, dtype=torch.bool))
            continue
        take = min(count, span)
        pick = torch.randperm(span, generator=generator)[:take] + lo
        pad = count - take
        rows.append(torch.cat([pick.sort().values, pick[:1].expand(pad)]))
        valid.append(torch.cat([torch.ones(take, dtype=torch.bool), torch.zeros(pad, dtype=torch.bool)]))
    return torch.stack(rows), torch.stack(valid)


def position_weights(block_size: int, decay: float | None, device=None) -> torch.Tensor:
    """Loss weight of block row j: exp(-j / decay) (earlier rows matter more: acceptance is a prefix); 1 if None."""
    j = torch.arange(block_size, dtype=torch.float32, device=device)
    return torch.ones_like(j) if not decay else torch.exp(-j / decay)


def block_loss(model: DSparkDraftModel, embed_tokens, lm_head_weight: torch.Tensor, features: torch.Tensor,
               tokens: torch.Tensor, lengths: torch.Tensor, anchors: torch.Tensor, valid: torch.Tensor,
               decay: float | None = 4.0, dflash: bool = False):
    """Weighted cross-entropy over every block row of every anchor, and per-row teacher-forced accuracy.

    dflash: sglang DFLASH's convention instead (dflash_format.py): the block is [x_a, mask x K] (K + 1 rows), row j >= 1
    (the mask at position a + j) is trained on x_{a+j}, the anchor's row on nothing, and no Markov bias (a DFLASH draft
    has no head; its positions are independent given the context).
    features (B, T, n*H) target hidden states; tokens (B, T) right-padded; anchors/valid (B, A).
    Returns (loss, stats) with stats: rows (valid targets per block row), correct (per row), accept (sum over blocks
    of the teacher-forced accepted prefix length, for blocks whose K targets all exist), blocks (their count).
    """
    cfg = model.config
    k = cfg.block_size
    b, t = tokens.shape
    a = anchors.shape[1]
    device = tokens.device
    ctx = model.project_context(features)
    ctx_kv = model.context_kv(ctx, torch.arange(t, device=device).expand(b, t))

    rows = k + int(dflash)  # block rows per anchor
    q_pos = (anchors[..., None] + torch.arange(rows, device=device)).view(b, a * rows)  # (B, A*rows)
    ids = block_ids(tokens.gather(1, anchors), rows, cfg.mask_token_id).view(b, a * rows)
    embeds = embed_tokens(ids).to(ctx.dtype)
    anchor_of_row = anchors.repeat_interleave(rows, dim=1)  # (B, A*rows)
    see_ctx = torch.arange(t, device=device)[None, None, :] < anchor_of_row[..., None]  # (B, A*rows, T)
    blk = torch.arange(a, device=device).repeat_interleave(rows)
    see_blk = (blk[:, None] == blk[None, :]).expand(b, a * rows, a * rows)
    mask = torch.cat([see_ctx, see_blk], dim=-1)

    hidden = model.block_hidden(embeds, q_pos, ctx_kv, mask)
    if dflash:  # rows 1..K propose x_{a+1} .. x_{a+K}
        hidden = hidden.view(b, a, rows, -1)[:, :, 1:].reshape(b, a * k, -1)
    logits = hidden @ lm_head_weight.to(hidden.dtype).T
    tgt_pos = (anchors[..., None] + 1 + torch.arange(k, device=device)).view(b, a * k)
    if dflash:
        logits = logits.float()
    else:
        prev = tokens.gather(1, (tgt_pos - 1).clamp_max(t - 1))  # x_{a+j}: the anchor for j = 0
        logits = logits.float() + model.markov_bias(prev).float()

    target = tokens.gather(1, tgt_pos.clamp_max(t - 1))
    ok = (tgt_pos < lengths[:, None]) & valid.repeat_interleave(k, dim=1)
    w = position_weights(k, decay, device).repeat(a)[None].expand(b, -1) * ok
    ce = F.cross_entropy(logits.view(-1, logits.shape[-1]), target.view(-1), reduction="none").view(b, a * k)
    loss = (ce * w).sum() / w.sum().clamp_min(1e-6)

    with torch.no_grad():
        hit = (logits.argmax(-1) == target) & ok
        rows = ok.view(b, a, k).sum(dim=(0, 1))
        correct = hit.view(b, a, k).sum(dim=(0, 1))
        full = ok.view(b, a, k).all(-1)
        prefix = hit.view(b, a, k).long().cumprod(-1).sum(-1)
        stats = {"rows": rows, "correct": correct, "accept": (prefix * full).sum(), "blocks": full.sum()}
    return loss, stats


def lr_at(step: int, *, lr: float, warmup: int, total: int, final_frac: float = 0.1,
          time_frac: float | None = None) -> float:
    """Linear warm-up, then cosine decay to final_frac * lr at `total` steps, or earlier when `time_frac` (the share
    of a training time limit already used) is further along, so a time-limited run still ends with a decayed rate."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if time_frac is not None:
        progress = min(1.0, max(progress, time_frac))
    return lr * (final_frac + (1 - final_frac) * 0.5 * (1 + math.cos(math.pi * progress)))
