"""DSPARK drafter: a flashtree-trained (or any sglang-format) DSPARK draft checkpoint in the reference engine.

One draft forward per request gives the block's base logits (the block depends only on the context and the anchor);
the N candidates are N walks of the Markov head over them:
  temperature 0      every candidate is the greedy block (argmax at each step, the previous choice feeding the
                     Markov bias): N > 1 adds no node, the tree is the chain;
  temperature T > 0  candidate 0 is the greedy block when `greedy_first` (default), the others sample each step from
                     softmax((base_j + bias(prev)) / T) by inverse CDF, with block_size uniforms per candidate drawn
                     from the generator candidate after candidate, so the first n candidates of a draw of N are the
                     draw of n (what replay needs).
With `return_probs` (needs temperature > 0 and greedy_first=False, so that every candidate is a draw) each proposal
carries `probs` (bs, N, K, V): the distribution softmax((base_j + bias(prev)) / T) each token was drawn from, what
the engine's rejection walk (walk="rejection") needs.
The draft keeps per-request context K/V for every position with target KV (the context grows with `advance`).
"""

from __future__ import annotations

import os

import torch

from ..dspark.checkpoint import load_checkpoint
from ..dspark.model import DSparkDraftModel, block_ids
from ..tree import DraftScores
from .base import DraftState, Proposal


def check_dspark_target(config, target) -> None:
    """A clear error if a DSPARK draft with `config` cannot draft for `target` (before any work)."""
    text = target.config.get_text_config()
    vocab = int(target.get_output_embeddings().weight.shape[0])
    problems = []
    if config.vocab_size != vocab:
        problems.append(f"vocabulary {config.vocab_size} != the target's {vocab}")
    if config.hidden_size != text.hidden_size:
        problems.append(f"hidden size {config.hidden_size} != the target's {text.hidden_size}")
    if config.num_target_layers != text.num_hidden_layers:
        problems.append(f"it was built for a {config.num_target_layers}-layer target, this one has {text.num_hidden_layers}")
    bad = [i for i in config.target_layer_ids if not 0 <= i < text.num_hidden_layers - 1]
    if bad:
        problems.append(f"target_layer_ids {bad} are not layers 0..{text.num_hidden_layers - 2}")
    if problems:
        raise ValueError("DSPARK drafter does not fit this target: " + "; ".join(problems))


class DSparkDrafter:
    """Drafts with a DSparkDraftModel, reading the target's hidden states through DraftState.hidden.

    k: draft tokens per candidate, at most the checkpoint's block_size (default: block_size); a shorter block runs
        the first k block rows, as sglang does with a smaller --speculative-num-draft-tokens.
    window: block rows the draft forward runs (default k; >= k). The block attends within itself both ways, so rows
        past k change the first k rows' logits: window = W - 1 replays an sglang server started with
        --speculative-num-draft-tokens W whose trees keep k positions (FLASHTREE_TREE_DEPTH = k).
    return_probs: proposals carry the draft distribution of every candidate token (see the module docstring).
    """

    first_row = 0  # the block row that proposes the anchor's successor (DFLASH drafts: 1, dflash_drafter.py)

    def __init__(self, model: DSparkDraftModel, target, *, temperature: float = 0.0, greedy_first: bool = True,
                 k: int | None = None, window: int | None = None, return_probs: bool = False):
        cfg = model.config
        check_dspark_target(cfg, target)
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        if return_probs and (temperature == 0 or greedy_first):
            raise ValueError(
                "return_probs needs every candidate drawn at the draft temperature: temperature > 0 and "
                f"greedy_first=False (got temperature={temperature}, greedy_first={greedy_first})"
            )
        k = cfg.block_size if k is None else int(k)
        if not 1 <= k <= cfg.block_size:
            raise ValueError(f"k={k}: the draft proposes 1..{cfg.block_size} tokens per block (its block_size)")
        window = k if window is None else int(window)
        if window < k:
            raise ValueError(f"window={window}: the draft forward runs at least the k={k} rows it keeps")
        self.model = model.eval()
        self.config = cfg
        self.k, self.window = k, window
        self.vocab_size = cfg.vocab_size
        self.target_hidden_size = cfg.hidden_size
        self.hidden_layers = tuple(cfg.target_layer_ids)
        self.temperature = float(temperature)
        self.greedy_first = bool(greedy_first)
        self.return_probs = bool(return_probs)
        self.embed_tokens = target.get_input_embeddings()
        self.lm_head = target.get_output_embeddings()
        self._kv: list[list[tuple[torch.Tensor, torch.Tensor]]] = []  # per request, per layer (K, V) (1, kvh, C, d)
        self._lengths: list[int] = []  # context positions held per request
        self._anchors: list[int] = []
        self._device = next(model.parameters()).device

    # ---- context ----------------------------------------------------------------------------------------------------

    def start(self, state: DraftState) -> None:
        bs = state.tokens.shape[0]
        cfg = self.config
        shape = (1, cfg.num_key_value_heads, 0, cfg.head_dim)
        dtype = next(self.model.parameters()).dtype
        self._kv = [[(torch.zeros(shape, dtype=dtype, device=self._device),) * 2 for _ in self.model.layers]
                    for _ in range(bs)]
        self._lengths = [0] * bs
        self._extend(state)

    def advance(self, state: DraftState) -> None:
        if len(self._kv) != state.tokens.shape[0]:
            raise RuntimeError("advance() with a different batch than start(): call start() for a new generation")
        self._extend(state)

    @torch.no_grad()
    def _extend(self, state: DraftState) -> None:
        missing = [i for i in self.hidden_layers if i not in state.hidden]
        if missing:
            raise ValueError(f"DraftState.hidden lacks the target layers {missing} that the DSPARK drafter reads")
        features = torch.cat([state.hidden[i] for i in self.hidden_layers], dim=-1).to(self._device)
        lengths = state.lengths.tolist()
        for b in range(len(self._kv)):
            end = lengths[b] - 1  # positions with target KV: 0 .. end - 1; the anchor sits at `end`
            have = self._lengths[b]
            if end < have:
                raise ValueError(f"request {b}: the context shrank from {have} to {end} positions")
            if end > have:
                ctx = self.model.project_context(features[b : b + 1, have:end])
                pos = torch.arange(have, end, device=self._device).view(1, -1)
                new = self.model.context_kv(ctx, pos)
                self._kv[b] = [(torch.cat([k0, k1], dim=2), torch.cat([v0, v1], dim=2))
                               for (k0, v0), (k1, v1) in zip(self._kv[b], new)]
                self._lengths[b] = end
        self._anchors = state.tokens.gather(1, (state.lengths - 1)[:, None])[:, 0].tolist()

    # ---- drafting ---------------------------------------------------------------------------------------------------

    @torch.no_grad()
    def base_logits(self) -> torch.Tensor:
        """(bs, k, V) float32 base logits of every request's block (before the Markov bias)."""
        if not self._kv:
            raise RuntimeError("propose() before start(): the drafter has no context")
        cfg, k, first = self.config, self.k, self.first_row
        rows_run = self.window + first
        rows = []
        for b, kv in enumerate(self._kv):
            c = self._lengths[b]
            anchor = torch.tensor([self._anchors[b]], device=self._device)
            ids = block_ids(anchor, rows_run, cfg.mask_token_id)  # (1, window)
            embeds = self.embed_tokens(ids.to(self.embed_tokens.weight.device)).to(self._device)
            embeds = embeds.to(next(self.model.parameters()).dtype)
            pos = torch.arange(c, c + rows_run, device=self._device).view(1, -1)
            mask = torch.ones(1, rows_run, c + rows_run, dtype=torch.bool, device=self._device)
            hidden = self.model.block_hidden(embeds, pos, kv, mask)[:, first: first + k]
            logits = self.lm_head(hidden.to(self.lm_head.weight.dtype).to(self.lm_head.weight.device))
            rows.append(logits[0].float().to(self._device))
        return torch.stack(rows)

    @torch.no_grad()
    def propose(self, n: int, generator: torch.Generator | None = None) -> Proposal:
        if n < 1:
            raise ValueError(f"n (candidates) must be >= 1, got {n}")
        base = self.base_logits()
        bs, k, _ = base.shape
        anchors = torch.tensor(self._anchors, device=self._device)
        sampled = self.temperature > 0 and not (self.greedy_first and n == 1)
        if sampled:
            # block_size uniforms per candidate, drawn candidate after candidate (prefix-stable in n)
            device = generator.device if generator is not None else torch.device("cpu")
            u = torch.stack([
                torch.stack([torch.rand(k, generator=generator, device=device) for _ in range(n)])
                for _ in range(bs)
            ]).to(self._device)
        rows = n if sampled else 1
        prev = anchors[:, None].expand(bs, rows).reshape(-1)
        out, dists, logp = [], [], []
        for j in range(k):
            step = base[:, j, None, :] + self.model.markov_bias(prev).float().view(bs, rows, -1)
            choice = step.argmax(dim=-1)  # (bs, rows)
            if sampled:
                probs = torch.softmax(step / self.temperature, dim=-1)
                if self.return_probs:
                    dists.append(probs)
                cdf = probs.cumsum(dim=-1)
                target = (u[:, :, j] * cdf[..., -1]).unsqueeze(-1).contiguous()
                draw = torch.searchsorted(cdf, target, right=True).squeeze(-1)
                draw = draw.clamp_max(step.shape[-1] - 1)
                if self.greedy_first:
                    draw[:, 0] = choice[:, 0]
                choice = draw
            out.append(choice)
            logp.append(step.log_softmax(dim=-1).gather(-1, choice.unsqueeze(-1)).squeeze(-1))  # T = 1: the draft's q
            prev = choice.reshape(-1)
        blocks = torch.stack(out, dim=-1)  # (bs, rows, k)
        logp = torch.stack(logp, dim=-1)
        if not sampled:
            blocks, logp = blocks.expand(bs, n, k), logp.expand(bs, n, k)
        probs = torch.stack(dists, dim=2) if self.return_probs else None  # (bs, n, k, V)

        def step_logprobs(rows, pos, prev):  # the probability policies: the draft's q after any node
            return (base[rows, pos.clamp(max=k - 1)] + self.model.markov_bias(prev).float()).log_softmax(dim=-1)

        scores = DraftScores(logp=logp.contiguous(), anchor=anchors, step_logprobs=step_logprobs)
        return Proposal(candidates=blocks.contiguous(), probs=probs, scores=scores)


def draft_network(target, *, path, model, dtype, name: str, hint: str, load_config, load_weights) -> DSparkDraftModel:
    """The draft network of a `name` drafter on the target's device and in its dtype (unless `dtype`): loaded from the
    checkpoint folder `path` (`load_config(folder)` checked against the target before any weight is read, then
    `load_weights(folder, dtype=, device=)`), or the DSparkDraftModel `model`; `hint` says how to make a checkpoint."""
    if (path is None) == (model is None):
        raise ValueError(f"the {name} drafter needs exactly one of path= (a checkpoint folder) or model=")
    weight = target.get_output_embeddings().weight
    dtype = dtype or weight.dtype
    if path is not None:
        folder = os.path.expanduser(str(path))
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"{name.upper()} draft checkpoint {folder!r} does not exist; {hint}")
        check_dspark_target(load_config(folder), target)  # the config first: no weights read for a misfit
        model = load_weights(folder, dtype=dtype, device=weight.device)
    elif not isinstance(model, DSparkDraftModel):
        raise TypeError(f"model must be a flashtree DSparkDraftModel, got {type(model).__name__}")
    return model.to(device=weight.device, dtype=dtype)


def build_dspark_drafter(target, *, path=None, model=None, temperature: float = 0.0, greedy_first: bool = True,
                         k: int | None = None, window: int | None = None, dtype: torch.dtype | None = None,
                         return_probs: bool = False) -> DSparkDrafter:
    """A DSparkDrafter from a checkpoint folder `path` (sglang layout) or a DSparkDraftModel `model`, on the target's
    device and in its dtype (unless `dtype`)."""
    from ..dspark.config import DSparkConfig

    model = draft_network(target, path=path, model=model, dtype=dtype, name="dspark",
                          hint="train one with `python experiments/train_drafter.py` or "
                               "`bash scripts/train_drafter_h200.sh`",
                          load_config=DSparkConfig.load, load_weights=load_checkpoint)
    return DSparkDrafter(model, target, temperature=temperature, greedy_first=greedy_first, k=k, window=window,
                         return_probs=return_probs)
