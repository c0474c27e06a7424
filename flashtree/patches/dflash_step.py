"""The tree path on sglang's DFLASH worker (`DFlashWorkerV2`, `--speculative-algorithm DFLASH`).

The step is DSPARK's (decode.py: window, draws, policy tree, verify under the tree mask, greedy / sampled walk,
req_to_token or copy commit, draft context for the committed path) over the DFLASH family's primitives
(adapters/dflash.py): the draft forward over [anchor, mask x K] through the target's LM head, N draws per position
(candidate 0 the argmax block, DFLASH's chain; with FLASHTREE_GRAPH_DRAWS in DFLASH's draft graph tail, graph_draws.py),
DFLASH's own verify input and draft-KV writer. DFLASH's worker runs prefill and decode in one
`forward_batch_generation`; prefill, idle batches and the tree step's fallbacks (decode.py) run DFLASH's own. Unset
toggles leave DFLASH untouched; a DFLASH worker lacking what the family's probes require gets its worker start refused
with the gaps.
"""

from __future__ import annotations

import torch

from . import decode, graph_draws, simulate, startup, verify_widths
from .adapters import SUPPORTED, dflash_adapter
from .adapters.dflash import DFLASH_MODULE, DFLASH_WORKER
from .adapters.probe import resolve
from .installer import Patch
from .toggles import ToggleError, TreeToggles


def patches(adapter, toggles: TreeToggles) -> list[Patch]:
    """The DFLASH worker's patches for the tree toggles (none where the release has no DFLASH worker)."""
    try:
        worker_cls = resolve(DFLASH_WORKER)
    except LookupError:
        return []
    family = dflash_adapter(adapter)
    gaps = family.mismatches()
    if gaps:
        return [Patch(worker_cls, "__init__", lambda orig: make_refusal(orig, family.release, gaps),
                      "DFlashWorkerV2.__init__")]
    verify_widths.require(adapter, toggles)
    return [
        Patch(worker_cls, "__init__", lambda orig: make_worker_init(orig, family, toggles), "DFlashWorkerV2.__init__"),
        Patch(worker_cls, "init_cuda_graphs", lambda orig: startup.make_init_cuda_graphs(orig, toggles.narrows),
              "DFlashWorkerV2.init_cuda_graphs"),
        Patch(worker_cls, "forward_batch_generation",
              lambda orig: make_forward_batch_generation(orig, family, toggles),
              "DFlashWorkerV2.forward_batch_generation"),
    ]


def simulated_chain_patches(table, toggles: TreeToggles) -> list[Patch]:
    """FLASHTREE_SIMULATE_ACC on DFLASH's own chain steps (a chain server's or a tree server's fallback): each step's
    length drawn from the table's chain shape; none where the release has no DFLASH worker."""
    try:
        module = resolve(DFLASH_MODULE)
    except LookupError:
        return []
    return [Patch(module, "apply_dflash_simulated_acceptance",
                  lambda orig: simulate.make_dflash_chain_acceptance(table, toggles.simulate_acc, toggles.seed),
                  "dflash_worker_v2.apply_dflash_simulated_acceptance")]


def make_refusal(original, release: str, gaps: list[str]):
    def __init__(self, *args, **kwargs):
        raise ToggleError(
            f"flashtree: FLASHTREE_TREE_N is set on a DFLASH server, but sglang {release}'s DFlashWorkerV2 is not one "
            f"flashtree's DFLASH tree step adapts ({'; '.join(gaps[:3])}); unset FLASHTREE_TREE_N for this server "
            f"(or serve DFLASH on a stock sglang {' / '.join(SUPPORTED)})"
        )

    return __init__


def make_worker_init(original, adapter, toggles: TreeToggles):
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self._flashtree = decode.create_state(adapter, toggles, self)
        if toggles.graph_draws:  # before the scheduler's init_cuda_graphs builds DFLASH's draft-graph tail sampler
            graph_draws.install(self._flashtree, self)

    return __init__


def make_forward_batch_generation(original, adapter, toggles: TreeToggles):
    decode_step = decode.make_forward_decode(original, adapter, toggles)

    def forward_batch_generation(self, batch, on_publish=None, *args, **kwargs):
        if batch.forward_mode.is_extend() or batch.is_extend_in_batch or batch.spec_info is None:
            return original(self, batch, on_publish, *args, **kwargs)  # prefill (and its draft KV): DFLASH's own
        if batch.seq_lens.is_cuda:  # carried over from the previous overlap iteration, maybe from another stream
            batch.seq_lens.record_stream(torch.cuda.current_stream())
        return decode_step(self, batch, on_publish, *args, **kwargs)

    return forward_batch_generation
