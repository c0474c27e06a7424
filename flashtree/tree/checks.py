"""Argument checks of the public tree API: one clear ValueError naming the argument and what it accepts.

Shapes, dtypes and host scalars are checked everywhere (no device read). Tensor contents (negative or too-large token
ids, NaN or all -inf logits) are checked only on CPU tensors, the torch references' inputs: on CUDA the same checks
would be a host sync per step, which the server's captured graphs cannot take.
"""

from __future__ import annotations

import math

import torch

_INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8)


def check_tokens(name: str, tokens: torch.Tensor, *, dims: int, vocab: int | None = None) -> None:
    if not isinstance(tokens, torch.Tensor):
        raise ValueError(f"{name} must be a torch tensor of token ids, got {type(tokens).__name__}")
    if tokens.dtype not in _INT_DTYPES:
        raise ValueError(f"{name} must hold integer token ids, got dtype {tokens.dtype}")
    if tokens.dim() != dims:
        raise ValueError(f"{name} must have {dims} dimensions, got shape {tuple(tokens.shape)}")
    if any(s == 0 for s in tokens.shape[1:]):
        raise ValueError(f"{name} must have at least one entry along every dimension but the batch, got shape "
                         f"{tuple(tokens.shape)}")
    if tokens.device.type == "cpu" and tokens.numel():
        low, high = int(tokens.min()), int(tokens.max())
        if low < 0:
            raise ValueError(f"{name} holds a negative token id ({low})")
        if vocab is not None and high >= vocab:
            raise ValueError(f"{name} holds token id {high}, outside the vocabulary of {vocab}")


def check_tree_vocab(tree, vocab: int) -> None:
    """The tree's nodes hold token ids the target's logits cover (CPU trees: a content check)."""
    if tree.tokens.device.type == "cpu" and bool(tree.valid.any()):
        high = int(tree.tokens[tree.valid].max())
        if high >= vocab:
            raise ValueError(f"tree holds token id {high}, outside target_logits' vocabulary of {vocab}")


def check_width(width) -> None:
    if isinstance(width, bool) or not isinstance(width, int) or width < 2:
        raise ValueError(f"width must be an int >= 2 (the root plus at least one node), got {width!r}")


def check_logits(name: str, logits: torch.Tensor) -> None:
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got "
                         f"{logits.dtype if isinstance(logits, torch.Tensor) else type(logits).__name__}")
    if logits.device.type == "cpu" and logits.numel():
        if torch.isnan(logits).any():
            raise ValueError(f"{name} holds NaN")
        if (logits == float("-inf")).all(dim=-1).any():
            raise ValueError(f"{name} has a row that is -inf everywhere (no token can be drawn)")


def _values(x) -> list[float]:
    if isinstance(x, torch.Tensor):
        if x.is_floating_point() or x.dtype in _INT_DTYPES:
            return x.detach().reshape(-1).tolist() if x.device.type == "cpu" else []
        raise ValueError(f"expected numbers, got dtype {x.dtype}")
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise ValueError(f"expected a number, got {x!r}")
    return [x]


def check_sampling(temperature, top_k=None, top_p=None) -> None:
    """Temperature >= 0 and finite (0 = greedy), top_k >= 0 (0 or None = off), 0 < top_p <= 1 (None = off)."""
    for t in _values(temperature):
        if not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {t}")
    if top_k is not None:
        for k in _values(top_k):
            if k != int(k) or k < 0:
                raise ValueError(f"top_k must be an int >= 0 (0 or None = no top-k filter), got {k}")
    if top_p is not None:
        for p in _values(top_p):
            if not (0 < p <= 1):
                raise ValueError(f"top_p must be in (0, 1] (1 or None = no top-p filter), got {p}")
