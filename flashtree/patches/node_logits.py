"""Per-node sampling adjustments of the tree's verify logits: at every node, what sglang's no-speculation sampler
applies at that position of that node's own path.

sglang's order (model_runner.sample, then the sampler): additive penalties (frequency, presence), the scaling one
(repetition), logit_bias, then custom logit processors; min_p is a sampling filter (the walk's draws, not the logits
that logprobs read). DSPARK's chain applies the root's penalty state to every row of its block; here a node's penalty
counts the request's committed output tokens plus the tokens of the node's own root-to-node path.

sglang's penalizer state does not follow speculative commits, so the committed counts are the tree step's own:
`CommittedCounts`, one row per req_to_token row, updated on the device from each step's committed tokens.

Under sglang's overlap scheduler the no-speculation decode counts one token late: before each decode step it adds
`Req.output_ids[-1]`, which the scheduler has not yet extended by the step in flight, and on the first decode (no
output yet) the prompt's last token (`ScheduleBatch.cumulate_penalty_output_tokens`, 0.5.17-0.5.23). So the token
generated after position k is penalised by the prompt's last token and the outputs before k, not by the token at k
(live run 28: the chat template's final newline kept a float32 repetition-penalty answer off "\n"). On such servers
(`TreePlan.penalty_lag`) each node counts that way: `lagged_counts`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flashtree.tree import ancestor_mask


@dataclass
class Penalties:
    """Per-request penalty settings of a batch, (bs,) float32 on the device."""

    frequency: torch.Tensor
    presence: torch.Tensor
    repetition: torch.Tensor

    @classmethod
    def of(cls, reqs, device) -> "Penalties | None":
        """The batch's penalty settings; None when no request sets one."""
        if not any_penalty(reqs):
            return None
        params = [r.sampling_params for r in reqs]
        freq = [float(p.frequency_penalty or 0.0) for p in params]
        pres = [float(p.presence_penalty or 0.0) for p in params]
        rep = [float(p.repetition_penalty or 1.0) for p in params]
        as_tensor = lambda x: torch.tensor(x, dtype=torch.float32).to(device, non_blocking=True)  # noqa: E731
        return cls(as_tensor(freq), as_tensor(pres), as_tensor(rep))


def any_penalty(reqs) -> bool:
    return any((p.frequency_penalty or 0.0) != 0.0 or (p.presence_penalty or 0.0) != 0.0
               or (p.repetition_penalty or 1.0) != 1.0 for p in (r.sampling_params for r in reqs))


def path_counts(committed: torch.Tensor, ids: torch.Tensor, ancestors: torch.Tensor) -> torch.Tensor:
    """(bs, W, V) token counts at every node: the request's committed output tokens (bs, V), which include the
    anchor (the root), plus the tokens of the node's own path below the root (its ancestors and itself)."""
    bs, w = ids.shape
    counts = committed.unsqueeze(1).repeat(1, w, 1)
    on_path = ancestors[:, :, 1:].to(counts.dtype)
    counts.scatter_add_(2, ids[:, None, 1:].clamp(min=0).expand(bs, w, w - 1), on_path)
    return counts


def lagged_counts(counts: torch.Tensor, ids: torch.Tensor, prompt_last: torch.Tensor) -> torch.Tensor:
    """(bs, W, V) per-node counts, changed in place, as sglang's overlap-scheduled decode keeps them: each node's own
    token (the root's: the anchor) not yet counted, the prompt's last token (bs,) counted once."""
    bs, w = ids.shape
    own = (ids >= 0).to(counts.dtype).unsqueeze(-1)
    counts.scatter_add_(2, ids.clamp(min=0).unsqueeze(-1), -own)  # in place: path_counts' own tensor
    return counts.scatter_add_(2, prompt_last.view(bs, 1, 1).expand(bs, w, 1).long(), torch.ones_like(own))


def apply_penalties(logits: torch.Tensor, counts: torch.Tensor, pen: Penalties, scaling=None) -> torch.Tensor:
    """sglang's penalizers on (bs, W, V) logits with per-node counts: subtract frequency x count and presence x
    (count > 0), then scale seen tokens by the repetition penalty (divide positive logits, multiply negative ones);
    `scaling(rows, factors)`: sglang's own in-place scaling (the adapter's), else the same in torch here."""
    seen = counts > 0
    out = logits - (pen.frequency.view(-1, 1, 1) * counts + pen.presence.view(-1, 1, 1) * seen).to(logits.dtype)
    scale = torch.where(seen, pen.repetition.view(-1, 1, 1), 1.0).to(logits.dtype)
    if scaling is None:
        return torch.where(out < 0, out * scale, out / scale)
    v = out.shape[-1]
    scaling(out.view(-1, v), scale.reshape(-1, v))
    return out


def min_p_filtered(logits: torch.Tensor, temperature: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """(bs, W, V) logits with every token whose probability at the row's temperature is below min_p x the row's top
    probability set to -inf (sglang's min_p filter); min_p 0 and temperature-0 rows unchanged."""
    t = torch.where(temperature > 0, temperature, 1.0).float().view(-1, 1, 1)
    scaled = logits.float() / t
    floor = scaled.amax(dim=-1, keepdim=True) + torch.log(min_p.float()).view(-1, 1, 1)
    drop = (scaled < floor) & (temperature > 0).view(-1, 1, 1)
    return logits.masked_fill(drop, float("-inf"))


class CommittedCounts:
    """Each live request's committed output tokens as a (rows, V) count table on the device, one row per req_to_token
    row. A request first seen by the tree step starts from its host output_ids (all but the newest, which under
    overlap scheduling may still be in flight) plus the step's anchor; each step then adds what it committed."""

    def __init__(self):
        self.table: torch.Tensor | None = None
        self.owner: dict[int, str] = {}  # req_to_token row -> the rid its counts belong to

    def rows(self, reqs, pool_rows: torch.Tensor, anchor: torch.Tensor, table_rows: int, vocab: int) -> torch.Tensor:
        if self.table is None or self.table.shape[1] != vocab or self.table.shape[0] < table_rows:
            self.table = torch.zeros((table_rows, vocab), dtype=torch.float32, device=anchor.device)
            self.owner.clear()
        fresh = [b for b, r in enumerate(reqs) if self.owner.get(int(r.req_pool_idx)) != r.rid]
        if fresh:
            start = torch.zeros((len(fresh), vocab), dtype=torch.float32)
            for i, b in enumerate(fresh):
                prior = list(reqs[b].output_ids)[:-1]
                if prior:
                    start[i].index_add_(0, torch.tensor(prior, dtype=torch.long), torch.ones(len(prior)))
                self.owner[int(reqs[b].req_pool_idx)] = reqs[b].rid
            at = torch.tensor(fresh, dtype=torch.long, device=anchor.device)
            start = start.to(anchor.device)
            start.scatter_add_(1, anchor[at].view(-1, 1).long(), torch.ones((len(fresh), 1), device=anchor.device))
            self.table.index_copy_(0, pool_rows[at].long(), start)
        return self.table[pool_rows.long()]

    def commit(self, pool_rows: torch.Tensor, tokens: torch.Tensor, commit_lens: torch.Tensor) -> None:
        """Add each request's committed tokens (the first commit_lens[b] of tokens[b]; the last is the next anchor)."""
        keep = torch.arange(tokens.shape[1], device=tokens.device).view(1, -1) < commit_lens.view(-1, 1)
        rows = self.table[pool_rows.long()]
        rows.scatter_add_(1, tokens.clamp(min=0).long(), keep.to(rows.dtype))
        self.table.index_copy_(0, pool_rows.long(), rows)


def batch_needs_tree(batch) -> bool:
    """Whether a batch must keep the tree step rather than fall back to DSPARK's chain: penalties (the chain applies
    no per-position counts and its steps would not advance `CommittedCounts`) or min_p (the chain's draws ignore it)."""
    info = batch.sampling_info
    if info is not None and getattr(info, "need_min_p_sampling", False):
        return True
    return any_penalty(getattr(batch, "reqs", None) or [])


def needs_adjustment(sampling_info) -> bool:
    """Whether a batch's verify logits need any per-node adjustment (logit_bias, custom processors, penalties)."""
    if sampling_info is None:
        return False
    return (getattr(sampling_info, "logit_bias", None) is not None
            or bool(getattr(sampling_info, "has_custom_logit_processor", False)))


def adjust(run, worker, batch, tree, ids: torch.Tensor, logits: torch.Tensor) -> tuple[torch.Tensor, Penalties | None]:
    """The batch's (bs*W, V) verify logits with every node's adjustments applied (a new tensor when any applies),
    and the penalties whose committed counts the step must advance after its walk (None: no request has one)."""
    info = batch.sampling_info
    reqs = getattr(batch, "reqs", None)
    pen = None if info is None or not reqs else Penalties.of(reqs, logits.device)
    if pen is None and not needs_adjustment(info):
        return logits, None
    bs, w = ids.shape
    out = logits.view(bs, w, -1)
    if pen is not None:
        table_rows = run.plan.adapter.req_to_token(worker).shape[0]
        committed = run.counts.rows(reqs, batch.req_pool_indices, ids[:, 0], table_rows, out.shape[-1])
        counts = path_counts(committed, ids, ancestor_mask(tree))
        if run.plan.penalty_lag:
            last = torch.tensor([r.origin_input_ids[-1] for r in reqs], dtype=torch.long)
            counts = lagged_counts(counts, ids, last.to(ids.device, non_blocking=True))
        out = apply_penalties(out, counts, pen, run.plan.adapter.scaling_penalties)
    bias = getattr(info, "logit_bias", None)
    if bias is not None:
        out = out + bias.to(out.dtype).view(bs, 1, -1)
    out = out.reshape(bs * w, -1)
    if getattr(info, "has_custom_logit_processor", False):
        # The processor sees each request's state at the step's root (sglang passes it the request), as DSPARK's does.
        out = out.clone() if out is logits else out
        run.plan.adapter.apply_custom_logit_processor(out, info, w)
    return out, pen
