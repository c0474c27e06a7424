"""FlashMap drafts on the tree path: the N candidates are N noise draws of flashmap's own sglang draft model.

flashmap 0.1.0 ships an sglang draft model for DSPARK (`flashmap.sglang.model.FlashMapDraftModel`, sglang 0.5.20
only) that jumps from Gaussian noise to a whole block of K tokens in one pass. Its multi-candidate mode (`tree_mode`,
meant for flashmap's own tree worker) draws `tree_n_for(bs)` noise samples per request in that one forward,
candidate-major, hands their final hidden states `(bs * N * K, dim)` to `_draft_tree(hidden, bsz, n_cand)`, and
returns the first candidate's block to DSPARK. flashtree switches that mode on at worker start, before sglang
captures the draft's CUDA graphs, with N fixed to FLASHTREE_TREE_N, and puts a `NoiseDraws` in place of
`_draft_tree` on the instance: each candidate is the argmax block given its noise (flashmap's own rule), written into
a persistent `(rows, N, K)` buffer that captured graphs rewrite on every replay. The tree step's eager draws
(`block_draws.draw_candidates`) then return those rows instead of drawing N blocks through the Markov head. Whether the
release can serve it (`adapter.flashmap_noise_draws`), the draft model and the graph sizes are the adapter's answers.

The draft is recognised by probing it (flashmap's `flashmap = True` marker plus every method and field used here),
never by importing flashmap. Its noise comes from torch's default generator on the draft's device (flashmap draws it
with `torch.randn`), not from FLASHTREE_SEED; FLASHTREE_DRAFT_TEMPERATURE and FLASHTREE_FUSED_SAMPLER do not apply.
"""

from __future__ import annotations

import inspect
import logging

import torch

from . import checks

logger = logging.getLogger("flashtree.patches")

# What flashtree reads or sets on flashmap's model (flashmap 0.1.0).
METHODS = {"_draft_tree": ["hidden", "bsz", "n_cand"], "head_logits": ["hidden"], "tree_n_for": ["bsz"]}
FIELDS = ("tree_mode", "tree_max_n", "tree_budget", "num_steps", "block_size", "hot_ids")
# Rows of head logits held at once for the candidates' argmax (bs * N * K rows of a 150k vocabulary would not fit).
HEAD_CHUNK = 1024
# flashmap cuts its candidates to tree_budget // bs per request; this budget keeps N for any batch size.
BATCH_BOUND = 1 << 20


def is_flashmap_draft(model) -> bool:
    return getattr(model, "flashmap", False) is True


def _protocol_gaps(model) -> list[str]:
    gaps = [f"field {name}" for name in FIELDS if not hasattr(model, name)]
    for name, params in METHODS.items():
        fn = getattr(model, name, None)
        if not callable(fn):
            gaps.append(f"method {name}")
        elif list(inspect.signature(fn).parameters) != params:
            gaps.append(f"{name}({', '.join(params)})")
    return gaps


class NoiseDraws:
    """Stands in for the model's `_draft_tree`: the argmax block of each noise draw -> a (rows, N, K) int64 buffer."""

    def __init__(self, model, n: int, graph_rows: int, device):
        self.model, self.n, self.k = model, n, int(model.block_size)
        # Captured draft graphs write here on replay; batches above the captured sizes run eagerly into `scratch`.
        self.graph_out = torch.zeros((graph_rows, n, self.k), dtype=torch.int64, device=device)
        self.scratch: torch.Tensor | None = None

    def out(self, bs: int) -> torch.Tensor:
        if bs <= self.graph_out.shape[0]:
            return self.graph_out[:bs]
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"flashtree: capturing a FlashMap draft graph for {bs} requests, above its buffer")
        if self.scratch is None or self.scratch.shape[0] < bs:
            self.scratch = self.graph_out.new_zeros((bs, self.n, self.k))
        return self.scratch[:bs]

    def __call__(self, hidden: torch.Tensor, bsz: int, n_cand: int) -> None:
        if n_cand != self.n:
            raise RuntimeError(f"flashtree: the FlashMap draft drew {n_cand} candidates per request, expected {self.n}")
        flat = self.out(bsz).view(-1)
        for start in range(0, hidden.shape[0], HEAD_CHUNK):
            end = min(hidden.shape[0], start + HEAD_CHUNK)
            flat[start:end] = self.model.head_logits(hidden[start:end]).argmax(dim=-1)
        if self.model.hot_ids is not None:  # a restricted draft vocabulary: indices -> token ids
            flat.copy_(self.model.hot_ids[flat])


def prepare(adapter, worker, n: int) -> None:
    """At worker start: switch a FlashMap draft to N noise draws per forward, or refuse it (checks.flashmap_draft:
    ToggleError, a SystemExit). Any other draft is left as it is."""
    model = adapter.draft_model(worker)
    if not is_flashmap_draft(model):
        return
    checks.flashmap_draft(adapter, worker, model, _protocol_gaps(model))
    model.tree_max_n, model.tree_budget = n, n * BATCH_BOUND
    checks.flashmap_keeps_n(model, n, BATCH_BOUND)
    graph_rows = max(adapter.decode_graph_sizes() or [0])  # 0 outside a server: every batch runs eagerly
    model._draft_tree = NoiseDraws(model, n, graph_rows, torch.device(getattr(worker, "device", "cpu")))
    model.tree_mode = True
    logger.info("flashtree: FlashMap draft, %d noise draws per request in each draft forward", n)


def noise_draws(adapter, worker, bs: int) -> torch.Tensor | None:
    """The candidates (bs, N, K) the last draft forward drew; None when the draft is not a prepared FlashMap draft."""
    draws = getattr(adapter.draft_model(worker), "_draft_tree", None)
    if not isinstance(draws, NoiseDraws):
        return None
    return draws.out(bs).clone()  # the next draft forward rewrites the buffer


def make_worker_init(init, adapter, toggles):
    """flashtree's DSparkWorkerV2.__init__ (`init`), then the FlashMap draft's switch (before graph capture)."""

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        prepare(adapter, self, self._flashtree.plan.toggles.tree_n)  # FLASHTREE_TREE_N=auto: the menu's largest N

    return __init__
