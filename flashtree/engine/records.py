"""Per-step records and the result of one `tree_generate` call: the plain data the results layer consumes.

`step_record` is the one place a StepRecord is built from a step's tree, candidates and walk: the engine and replay
both call it, so a replayed step and a direct one are the same record by construction.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..planner import Shape
from ..tree import VerifyResult, VoteTree


@dataclass
class StepRecord:
    """One verify step of one request."""

    request: int  # row in the batch
    step: int  # verify step index within the generation (0-based)
    position: int  # committed tokens before the step (the anchor's index + 1)
    policy: str  # the tree policy that built the step's tree
    candidates: int  # candidate blocks drawn (N)
    distinct_candidates: int  # distinct blocks among them
    tree_size: int  # valid non-root nodes in the verify tree (<= W - 1)
    accept_len: int  # accepted draft tokens (committed = accept_len + 1, bonus included)
    accepted_path: tuple[int, ...]  # accepted node indices, root excluded
    accepted_depth_votes: tuple[int, ...]  # votes of each accepted node
    oracle_len: int  # longest prefix of the target's choice matched by any of the N candidates (W unbounded)
    time_s: dict[str, float] = field(default_factory=dict)  # per-stage wall time, stages of flashtree.metrics.STAGES
    plan_n: int | None = None  # tree.n=auto: the shape the planner chose for the step (None: a fixed shape)
    plan_width: int | None = None


@dataclass
class GenerateResult:
    sequences: torch.Tensor  # (bs, prompt + new) as `generate` returns it, right-padded with pad id past each row
    acceptance_length: float  # tau: mean tokens committed per verify step, bonus included, over all requests
    steps: list[StepRecord]
    new_tokens: list[int]  # generated tokens per request
    prompt_lengths: list[int]
    wall_time_s: float


def step_record(tree: VoteTree, candidates: torch.Tensor, result: VerifyResult, continuation: torch.Tensor, *,
                request: int, step: int, position: int, policy: str, time_s: dict | None = None,
                plan: Shape | None = None, row: int = 0) -> StepRecord:
    """The record of one request's step: `tree` and `result` hold that request at batch row `row`, `candidates`
    (N, K) the blocks its tree was built from, `continuation` the tokens the request committed from `position` on
    (for the oracle), `plan` the planner's shape when it chose this step's."""
    a = int(result.accept_len[row])
    path = result.path[row, 1 : a + 1]  # accepted node indices, root excluded
    return StepRecord(
        request=request,
        step=step,
        position=position,
        policy=policy,
        candidates=candidates.shape[0],
        distinct_candidates=int(torch.unique(candidates, dim=0).shape[0]),
        tree_size=int(tree.valid[row].sum()),
        accept_len=a,
        accepted_path=tuple(path.tolist()),
        accepted_depth_votes=tuple(tree.votes[row, path - 1].tolist()),
        oracle_len=oracle_len(candidates, continuation, a),
        time_s=dict(time_s or {}),
        plan_n=None if plan is None else plan.n,
        plan_width=None if plan is None else plan.width,
    )


def oracle_len(cands: torch.Tensor, continuation: torch.Tensor, accept_len: int) -> int:
    """Longest prefix of the committed continuation that any of the (N, K) candidates matches: the accept length of
    the union of all N (W unbounded). That union contains the tree, so it is at least `accept_len`; near the end of a
    request the continuation is cut at max_new_tokens and would otherwise undercount it."""
    k = min(cands.shape[1], continuation.numel())
    if k == 0:
        return accept_len
    match = torch.cumprod((cands[:, :k] == continuation[:k]).to(torch.int32), dim=1)
    return max(accept_len, int(match.sum(dim=1).max()))
