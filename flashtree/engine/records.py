"""Per-step records and the result of one `tree_generate` call: the plain data the experiment layer consumes."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class StepRecord:
    """One verify step of one request."""

    request: int  # row in the batch
    step: int  # verify step index within the generation (0-based)
    position: int  # committed tokens before the step (the anchor's index + 1)
    candidates: int  # candidate blocks drawn (N)
    distinct_candidates: int  # distinct blocks among them
    tree_size: int  # valid non-root nodes in the verify tree (<= W - 1)
    accept_len: int  # accepted draft tokens (committed = accept_len + 1, bonus included)
    accepted_path: tuple[int, ...]  # accepted node indices, root excluded
    accepted_depth_votes: tuple[int, ...]  # votes of each accepted node
    oracle_len: int  # longest prefix of the target's choice matched by any of the N candidates (W unbounded)
    time_s: dict[str, float] = field(default_factory=dict)  # per-stage wall time: draft, build, verify, walk, commit


@dataclass
class GenerateResult:
    sequences: torch.Tensor  # (bs, prompt + new) as `generate` returns it, right-padded with pad id past each row
    acceptance_length: float  # tau: mean tokens committed per verify step, bonus included, over all requests
    steps: list[StepRecord]
    new_tokens: list[int]  # generated tokens per request
    prompt_lengths: list[int]
    wall_time_s: float
