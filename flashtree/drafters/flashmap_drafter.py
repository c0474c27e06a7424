"""FlashMap drafter (the `flashmap` package's FlashMapDraftModel): N candidates are N noise draws of one block.

One batched `draft` call per request maps N noise draws to N blocks of per-slot logits. At temperature 0 each
candidate is the argmax of its logits (a deterministic function of its noise); above 0 each slot is sampled from
softmax(logits / T), and that distribution is returned as the candidate's exact proposal distribution.

The drafter reads the target's hidden states at `target_layer_ids` (DraftState.hidden) into one FlashMapCache per
request, so requests of different lengths never share a cache position.
"""

from __future__ import annotations

import os

import torch

from .base import DraftState, Proposal

INSTALL = "pip install flashmap==0.1.0"


def _flashmap():
    try:
        import flashmap
    except ImportError as error:
        raise ModuleNotFoundError(f"the FlashMap drafter needs the flashmap package: `{INSTALL}`") from error
    return flashmap


def target_dims(target) -> tuple[int, int, int]:
    """(vocabulary, hidden size, decoder layers) of a transformers causal LM, read from its weights where possible."""
    config = target.config.get_text_config()
    vocab = target.get_output_embeddings().weight.shape[0]
    return vocab, config.hidden_size, config.num_hidden_layers


def check_flashmap_target(config, target) -> None:
    """A clear error if a FlashMap drafter with `config` cannot read `target` (before any work)."""
    vocab, hidden, layers = target_dims(target)
    problems = []
    if config.vocab_size != vocab:
        problems.append(f"vocabulary {config.vocab_size} != the target's {vocab}")
    if config.target_hidden_size != hidden:
        problems.append(f"hidden size {config.target_hidden_size} != the target's {hidden}")
    bad = [i for i in config.target_layer_ids if not 0 <= i < layers - 1]
    if bad:
        problems.append(f"target_layer_ids {bad} are not layers 0..{layers - 2} of the target's {layers}")
    if problems:
        raise ValueError(
            f"FlashMap drafter (trained for {config.target_model}) does not fit this target: " + "; ".join(problems)
        )


def tiny_flashmap_config(target, *, block_size: int = 4, layer_ids: tuple[int, ...] | None = None):
    """A tiny FlashMapConfig that fits `target` (for tests: runs on CPU in milliseconds)."""
    vocab, hidden, layers = target_dims(target)
    layer_ids = tuple(layer_ids) if layer_ids is not None else tuple(range(min(2, layers - 1)))
    return _flashmap().FlashMapConfig(
        target_model=getattr(target.config, "_name_or_path", "") or "tiny-random",
        target_hidden_size=hidden,
        vocab_size=vocab,
        target_layer_ids=layer_ids,
        block_size=block_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        cond_dim=32,
        time_embed_dim=32,
    )


def build_flashmap_model(target, *, model=None, config=None, seed: int = 0, dtype: torch.dtype | None = None):
    """A FlashMapDraftModel on the target's device: `model` (an instance, a local folder or a hub id), or a random
    initialisation of `config` (a FlashMapConfig or a dict of its fields; default: a tiny config fitting the target)."""
    flashmap = _flashmap()
    device = target.get_output_embeddings().weight.device
    dtype = dtype or target.get_output_embeddings().weight.dtype
    if model is not None and config is not None:
        raise ValueError("give the FlashMap drafter either `model` (pretrained) or `config` (random init), not both")
    if isinstance(model, (str, os.PathLike)):
        source = str(model)
        try:
            # the config first: a drafter for another target fails here, before its weights are read
            check_flashmap_target(flashmap.FlashMapConfig.from_pretrained(source), target)
            model = flashmap.FlashMapDraftModel.from_pretrained(source, dtype=dtype)
        except OSError as error:
            raise OSError(
                f"could not load the FlashMap drafter {source!r} ({error}); without the Hugging Face hub, give a local "
                "folder (FlashMapDraftModel.save_pretrained) or config= for a random initialisation"
            ) from error
    elif model is None:
        if config is None:
            config = tiny_flashmap_config(target)
        elif isinstance(config, dict):
            config = flashmap.FlashMapConfig(**config)
        check_flashmap_target(config, target)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = flashmap.FlashMapDraftModel(config)
    elif not isinstance(model, flashmap.FlashMapDraftModel):
        raise TypeError(f"model must be a FlashMapDraftModel, a folder or a hub id, got {type(model).__name__}")
    check_flashmap_target(model.config, target)
    return model.to(device=device, dtype=dtype).eval()


class FlashMapDrafter:
    """Drafts with a FlashMapDraftModel, reading the target's hidden states through DraftState.hidden.

    temperature: 0 gives argmax blocks (probs None); > 0 gives sampled blocks and their per-slot distributions.
    num_steps: flow-map jumps per draft (default: the drafter config's).
    """

    def __init__(self, model, target, *, temperature: float = 0.0, num_steps: int | None = None):
        check_flashmap_target(model.config, target)
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        self.model = model
        self.config = model.config
        self.k = self.config.block_size
        self.vocab_size = self.config.vocab_size
        self.target_hidden_size = self.config.target_hidden_size
        self.hidden_layers = tuple(self.config.target_layer_ids)
        self.temperature = temperature
        self.num_steps = num_steps
        # Borrowed from the target: the drafter has no embedding or lm_head of its own.
        self.embed_tokens = target.get_input_embeddings()
        self.lm_head = target.get_output_embeddings()
        self._caches: list = []
        self._anchors: torch.Tensor | None = None

    # ---- context ----------------------------------------------------------------------------------------------------

    def start(self, state: DraftState) -> None:
        flashmap = _flashmap()
        bs = state.tokens.shape[0]
        self._caches = []
        for _ in range(bs):
            capacity = max(64, 2 * int(state.lengths.max()))
            cache = flashmap.FlashMapCache(self.config, 1, capacity, device=self.model.device, dtype=self.model.dtype)
            self._caches.append(cache)
        self._extend(state)

    def advance(self, state: DraftState) -> None:
        if len(self._caches) != state.tokens.shape[0]:
            raise RuntimeError("advance() with a different batch than start(): call start() for a new generation")
        self._extend(state)

    def _extend(self, state: DraftState) -> None:
        missing = [i for i in self.hidden_layers if i not in state.hidden]
        if missing:
            raise ValueError(f"DraftState.hidden lacks the target layers {missing} that the FlashMap drafter reads")
        features = torch.cat([state.hidden[i] for i in self.hidden_layers], dim=-1)
        lengths = state.lengths.tolist()
        for b, cache in enumerate(self._caches):
            end = lengths[b] - 1  # positions with target KV: 0 .. end-1; the anchor sits at `end`
            if end < cache.length:
                raise ValueError(f"request {b}: the context shrank from {cache.length} to {end} positions")
            if end > cache.length:
                self._reserve(cache, end + 1)
                self.model.extend_context(cache, features[b : b + 1, cache.length : end])
        self._anchors = state.tokens.gather(1, (state.lengths - 1)[:, None])[:, 0].to(self.model.device)

    @staticmethod
    def _reserve(cache, positions: int) -> None:
        """Grow the cache (doubling) so that it holds `positions` positions: the final length is not known upfront."""
        capacity = cache.kv.shape[4]
        if positions <= capacity:
            return
        while capacity < positions:
            capacity *= 2
        grown = cache.kv.new_zeros(*cache.kv.shape[:4], capacity, cache.kv.shape[5])
        grown[..., : cache.kv.shape[4], :] = cache.kv
        cache.kv = grown

    # ---- drafting ---------------------------------------------------------------------------------------------------

    def draft_logits(self, n: int, generator=None, noise: torch.Tensor | None = None) -> torch.Tensor:
        """(bs, n, K, V) logits of n noise draws per request; `noise` (bs, n, K, V) fixes the draws."""
        if self._anchors is None:
            raise RuntimeError("propose() before start(): the drafter has no context")
        if n < 1:
            raise ValueError(f"n (candidates) must be >= 1, got {n}")
        flashmap = _flashmap()
        rows = []
        for b, cache in enumerate(self._caches):
            # The N draws share the request's context: copy it into an N-row cache (draft writes the anchor there).
            kv = cache.kv
            batch = flashmap.FlashMapCache(self.config, n, cache.length + 1, device=kv.device, dtype=kv.dtype)
            batch.kv[..., : cache.length, :] = cache.kv[..., : cache.length, :]
            batch.length = cache.length
            anchors = self._anchors[b].expand(n)
            rows.append(
                self.model.draft(
                    anchors,
                    batch,
                    self.embed_tokens,
                    self.lm_head,
                    num_steps=self.num_steps,
                    noise=None if noise is None else noise[b],
                    generator=generator,
                )
            )
        return torch.stack(rows)

    def propose(self, n: int, generator: torch.Generator | None = None) -> Proposal:
        logits = self.draft_logits(n, generator)
        if self.temperature == 0:
            return Proposal(candidates=logits.argmax(dim=-1))
        probs = (logits.float() / self.temperature).softmax(dim=-1)
        flat = probs.flatten(0, -2)
        tokens = torch.multinomial(flat, 1, generator=generator).view(probs.shape[:-1])
        return Proposal(candidates=tokens, probs=probs)
