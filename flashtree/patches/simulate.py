"""Simulated acceptance on a tree server, for profiling with random weights (`--load-format dummy`).

Two sources, the first as DSPARK's chain has it:
  - sglang's `SGLANG_SIMULATE_ACC_LEN` (and `SGLANG_SIMULATE_ACC_METHOD`): every tree step accepts the draft tokens
    DSPARK's verify would accept on this release (the adapter draws them as DSPARK does: 0.5.17 a constant
    round(min(max(L - 1, 0), gamma)), 0.5.20 / 0.5.23 one draw per step and batch); DSPARK's own steps on the server
    (fallbacks, the planner's chain choice) keep sglang's override;
  - `FLASHTREE_SIMULATE_ACC=<accept table>` (`flashtree.planner.accept_table`): each request's length is drawn from
    what steps of the tree's shape accepted on a real model, so trees accept their own τ while DSPARK's steps on
    the same server take sglang's length, if set.
With the table, DSPARK's own chain steps draw from it too (its chain shape: N = 1, W = its window), by replacing the
per-request length of DSPARK's simulate path (`TargetVerifyExecutor._simulated_correct_len`, sglang 0.5.17 / 0.5.20),
which runs when `SGLANG_SIMULATE_ACC_LEN` > 0: so a chain server and a tree server compare at the τ each reaches.
Random weights' candidates disagree from their first token (a tree of them is all depth-1 nodes), so a simulated
tree step builds its tree from N copies of candidate 0 (same shapes, same kernels) and its path reaches the full
depth. Either way a tree step commits along one root-to-leaf path of the built tree, capped by its depth
(`flashtree.tree.simulate`), through the same walk kernel as a verified step; no host reads. The server warns once
at start and every statistics row says the step was simulated.
"""

from __future__ import annotations

import logging

import torch

from flashtree.planner import accept_table
from flashtree.planner.shapes import Shape

from .toggles import ToggleError

logger = logging.getLogger("flashtree.patches")


class SglangLength:
    """SGLANG_SIMULATE_ACC_LEN's accepted draft tokens, drawn per step as the release's DSPARK verify draws them."""

    def __init__(self, adapter, simulate_acc_len: float, gamma: int, device):
        self.adapter, self.length, self.gamma = adapter, simulate_acc_len, gamma
        self.buf = torch.zeros(1, dtype=torch.long, device=device)

    def draw(self, bs: int, n: int, width: int, generator, grown: bool = False) -> torch.Tensor:
        self.buf.fill_(self.adapter.simulated_correct_len(self.length, self.gamma))  # host int: no device read
        return self.buf.expand(bs)

    def commits(self, shape: Shape, bs: int, generator, depth: int) -> torch.Tensor:
        """What a step of `shape` would commit per request (the planner's credits of the shapes a step did not run):
        DSPARK's length over the chain's window, a tree's capped by its depth, plus the bonus."""
        cap = shape.width - 1 if shape.is_chain else depth
        return self.draw(bs, shape.n, shape.width, generator).clamp(max=cap) + 1

    def describe(self) -> str:
        return f"SGLANG_SIMULATE_ACC_LEN={self.length:g} (as DSPARK's verify draws it on sglang {self.adapter.release})"


class RecordedLength:
    """Per request, a length drawn from the accept table's distribution for the step's shape (grown: a best-first
    tree's, whatever its N: AcceptTable.nearest)."""

    def __init__(self, table: accept_table.AcceptTable, path: str, device):
        self.table, self.path, self.device = table, path, device
        self.probs: dict[tuple[int, int, bool], torch.Tensor] = {}

    def draw(self, bs: int, n: int, width: int, generator, grown: bool = False) -> torch.Tensor:
        probs = self.probs.get((n, width, grown))
        if probs is None:
            probs = torch.tensor(self.table.probs(n, width, grown), dtype=torch.float32, device=self.device)
            self.probs[(n, width, grown)] = probs
            shape = self.table.nearest(n, width, grown)
            logger.info("flashtree: simulated tree steps of %s, W=%d draw from the table's N=%d, W=%d (tau %.3f)",
                        "best-first" if grown else f"N={n}", width, *shape, self.table.tau(n, width, grown))
        return torch.multinomial(probs, bs, replacement=True, generator=generator)

    def commits(self, shape: Shape, bs: int, generator, depth: int) -> torch.Tensor:
        """What a step of `shape` would commit per request (the planner's credits of the shapes a step did not run):
        a draw from the shape's own row (the chain's: the recorded chain nearest its window, as DSPARK's simulated
        steps draw), capped by the tree's depth, plus the bonus."""
        if shape.is_chain:
            return self.draw(bs, 1, self.table.chain_width(shape.width), generator).clamp(max=shape.width - 1) + 1
        return self.draw(bs, shape.n, shape.width, generator, shape.grown).clamp(max=depth) + 1

    def describe(self) -> str:
        return f"FLASHTREE_SIMULATE_ACC={self.path} ({self.table.source}; shapes {sorted(self.table.counts)})"


def load_table(path: str) -> accept_table.AcceptTable:
    try:
        return accept_table.load(path)
    except accept_table.BadAcceptTable as err:
        raise ToggleError(f"flashtree: FLASHTREE_SIMULATE_ACC: {err}; allowed: a table written by python -m "
                          "flashtree.engine.accept_table, or unset FLASHTREE_SIMULATE_ACC") from None


def check_chain_simulation(sglang_length: float) -> None:
    """DSPARK takes a simulated length only on its simulate path, which SGLANG_SIMULATE_ACC_LEN > 0 turns on."""
    if not sglang_length > 0:
        raise ToggleError(
            "flashtree: FLASHTREE_SIMULATE_ACC draws DSPARK's chain lengths through sglang's simulate path, which is "
            f"off (SGLANG_SIMULATE_ACC_LEN={sglang_length:g}); allowed: set SGLANG_SIMULATE_ACC_LEN=1 as well (any "
            "value > 0; flashtree's table replaces the length), or unset FLASHTREE_SIMULATE_ACC")


def make_chain_correct_len(table: accept_table.AcceptTable, path: str, seed: int):
    """TargetVerifyExecutor._simulated_correct_len drawing each request's accepted length from the table's chain
    shape (N = 1 over DSPARK's window, or the recorded chain nearest to it: AcceptTable.chain_width)."""

    def _simulated_correct_len(self, *, bs, dtype, device):
        source = getattr(self, "_flashtree_simulated", None)
        if source is None:
            generator = torch.Generator(device=device)
            generator.manual_seed(seed)
            source = self._flashtree_simulated = (RecordedLength(table, path, device), generator)
        lengths, generator = source
        width = table.chain_width(int(self.gamma) + 1)
        return lengths.draw(bs, 1, width, generator).clamp(max=int(self.gamma)).to(dtype)

    return _simulated_correct_len


def from_server(adapter, toggles, worker, gamma: int, device):
    """The step's simulated lengths (None: a verified server). Raises ToggleError for a table it cannot use."""
    if toggles.simulate_acc:
        source = RecordedLength(load_table(toggles.simulate_acc), toggles.simulate_acc, device)
    else:
        length = adapter.simulate_acc_len(worker)
        if length <= 0:
            return None
        source = SglangLength(adapter, length, gamma, device)
        source.draw(1, 1, 2, None)  # the release's draw function resolves now, not at the first step
    logger.warning("flashtree: SIMULATED ACCEPTANCE: tree steps commit a drawn number of draft tokens, not the "
                   "verified ones (%s); outputs are not the model's, only the timing is meaningful", source.describe())
    return source


def make_dflash_chain_acceptance(table: accept_table.AcceptTable, path: str, seed: int):
    """dflash_worker_v2.apply_dflash_simulated_acceptance drawing each request's accepted length from the table's
    chain shape (N = 1 over DFLASH's block), filled as DFLASH fills its forced lengths (sglang 0.5.17 - 0.5.23)."""
    state: dict = {}

    def apply_dflash_simulated_acceptance(*, candidates, target_predict, accept_len, commit_lens, bonus, out_tokens,
                                          simulate_acc_token_mode, next_token_logits=None, fixed_token_id=100,
                                          **_sglang_length):
        bs, w = candidates.shape
        if "source" not in state:
            generator = torch.Generator(device=candidates.device)
            generator.manual_seed(seed)
            state["source"] = (RecordedLength(table, path, candidates.device), generator)
        lengths, generator = state["source"]
        accepted = lengths.draw(bs, 1, w, generator).clamp(max=w - 1)
        accept_len.copy_(accepted.to(accept_len.dtype))
        commit_lens.copy_((accepted + 1).to(commit_lens.dtype))
        if simulate_acc_token_mode != "real-draft-token":
            bonus.fill_(fixed_token_id)
            out_tokens.fill_(fixed_token_id)
            return
        if target_predict is None:  # 0.5.23's sampled verify hands the logits, not their argmax
            target_predict = next_token_logits.argmax(dim=-1).view(bs, w)
        drafts = torch.cat([candidates[:, 1:], candidates.new_zeros(bs, 1)], dim=1)
        keep = torch.arange(w, device=candidates.device)[None] < accepted[:, None]
        out_tokens.copy_(torch.where(keep, drafts, 0).to(out_tokens.dtype))
        bonus.copy_(target_predict.gather(1, accepted[:, None]).squeeze(1).to(bonus.dtype))
        out_tokens.scatter_(1, accepted[:, None], bonus[:, None].to(out_tokens.dtype))

    return apply_dflash_simulated_acceptance
