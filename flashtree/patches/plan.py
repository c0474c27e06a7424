"""The patch plan: which of sglang's attributes flashtree replaces, with what, for which toggles.

The release adapter answers what differs between releases (its probes, the attribute paths, its flags); this module
decides what to install from the toggles. Nothing is touched here: `flashtree.patches.install` installs the list.
"""

from __future__ import annotations

import importlib
import multiprocessing
import sys

from . import admission, decode, dflash_step, flashmap_draft, logprobs, startup, verify_widths
from .adapters import base
from .adapters.base import DFLASH_UTILS, ENGINE, FLASHINFER, REQ, RESULTS, SCHEDULER, TRITON, WORKER, SglangAdapter
from .adapters.probe import resolve
from .installer import Patch
from .toggles import TreeToggles


class _TaggableFrozenSet(frozenset):
    """frozenset subclass: accepts the installer's tag attribute."""


def patches(adapter: SglangAdapter, toggles: TreeToggles) -> list[Patch]:
    """The patches `toggles` ask for on `adapter`'s release. Raises ToggleError (a SystemExit) for a toggle this
    release cannot serve, before anything is patched."""
    out: list[Patch] = []
    if toggles.tree_enabled:
        out += _tree_patches(adapter, toggles)
    if toggles.splitkv_verify:
        out += _splitkv_patch(adapter, required="FLASHTREE_SPLITKV_VERIFY" not in toggles.defaulted)
    if toggles.exact_verify:
        out += _exact_verify_patches(adapter)
    if toggles.simulate_acc:
        out += _simulated_chain_patches(adapter, toggles)
    if adapter.stops_after_length and (toggles.tree_enabled or toggles.exact_verify or toggles.splitkv_verify):
        from . import finish

        # A speculative step (tree or chain) that reaches max_new_tokens stops at an accepted stop token, as plain
        # decoding does: every flashtree server's greedy output is plain decoding's.
        out.append(Patch(resolve(REQ), "update_finish_state", finish.make_update_finish_state, "Req.update_finish_state"))
    return out


def _tree_patches(adapter: SglangAdapter, toggles: TreeToggles) -> list[Patch]:
    worker_cls = resolve(WORKER)
    if toggles.draft_rows:
        adapter.check_draft_rows(toggles.draft_rows)
    verify_widths.require(adapter, toggles)

    def worker_init(orig):
        # flashtree's tree state, then a FlashMap draft's switch to N noise draws (or its refusal).
        return flashmap_draft.make_worker_init(decode.make_worker_init(orig, adapter, toggles), adapter, toggles)

    return [
        Patch(worker_cls, "__init__", worker_init, "DSparkWorkerV2.__init__"),
        Patch(worker_cls, "init_cuda_graphs", lambda orig: startup.make_init_cuda_graphs(orig, toggles.narrows),
              "DSparkWorkerV2.init_cuda_graphs"),
        Patch(worker_cls, "_forward_decode", lambda orig: decode.make_forward_decode(orig, adapter, toggles),
              "DSparkWorkerV2._forward_decode"),
        Patch(resolve(SCHEDULER), "_add_request_to_queue",
              lambda orig: admission.make_add_request_to_queue(orig, toggles, adapter.dspark_refuses_logprobs),
              "Scheduler._add_request_to_queue"),
        Patch(resolve(RESULTS), "_maybe_collect_customized_info", decode.make_collect_stats,
              "SchedulerBatchResultProcessor._maybe_collect_customized_info"),
        # Verify graphs on these backends are captured without a mask buffer; a tree needs one (checks.VERIFY_BACKENDS).
        Patch(importlib.import_module(DFLASH_UTILS), "_DFLASH_VERIFY_SKIP_CUSTOM_MASK_BACKENDS",
              lambda orig: _TaggableFrozenSet(orig - {"TritonAttnBackend", "FlashInferAttnBackend"}),
              "dflash_utils._DFLASH_VERIFY_SKIP_CUSTOM_MASK_BACKENDS"),
    ] + _flashinfer_chain_mask(adapter) + _eager_loading(toggles) + logprobs.patches(adapter, worker_cls) + \
        dflash_step.patches(adapter, toggles)


def _eager_loading(toggles: TreeToggles) -> list[Patch]:
    """The grammar overlap's host flag needs eager CUDA module loading, which sglang's setup turns off (host_flag.py).
    The launching process runs that setup and spawns the others, which inherit the variable: there the engine is
    imported now (the plugin loads before the launcher imports it, as sglang's own hooks do) and its setup wrapped."""
    if not toggles.grammar_overlap:
        return []
    engine = sys.modules.get(ENGINE)
    if engine is None and multiprocessing.parent_process() is None:
        engine = import_engine()
    if not hasattr(engine, "_set_envs_and_config"):
        return []
    from . import host_flag

    return [Patch(engine, "_set_envs_and_config", host_flag.eager_after_setup, "engine._set_envs_and_config")]


def import_engine():
    """sglang's engine module, or None where it does not import (a CPU box: the scheduler's LAZY_WARNING says so on a
    GPU)."""
    try:
        return importlib.import_module(ENGINE)
    except Exception:  # noqa: BLE001
        return None


def _flashinfer_hooks(adapter: SglangAdapter) -> bool:
    """Whether this release's FlashInfer verify takes the tree's mask and has the planning hooks flashtree wraps."""
    return adapter.flashinfer_verify and adapter.meets(base.FLASHINFER_VERIFY_PROBES)


def _flashinfer_chain_mask(adapter: SglangAdapter) -> list[Patch]:
    """Chain verifies replayed on FlashInfer graphs captured with the tree's mask (flashinfer_graphs.py)."""
    if not _flashinfer_hooks(adapter):
        return []  # FlashInfer targets are refused at worker start there (checks.verify_backend)
    from . import flashinfer_graphs

    return [Patch(resolve(f"{FLASHINFER}:FlashInferAttnBackend"), "init_forward_metadata_out_graph",
                  flashinfer_graphs.make_init_forward_metadata_out_graph,
                  "FlashInferAttnBackend.init_forward_metadata_out_graph")]


def _exact_verify_patches(adapter: SglangAdapter) -> list[Patch]:
    """Decode-row verify on Triton targets and, where this release hands FlashInfer the tree's mask, on FlashInfer
    targets (elsewhere a FlashInfer target with the toggle stops at start with one message)."""
    from . import exact_verify, exact_verify_flashinfer

    adapter.require(base.EXACT_VERIFY_PROBES, "FLASHTREE_EXACT_VERIFY=1", "0 (sglang's own verify attention)")
    flashinfer_ok = _flashinfer_hooks(adapter)
    return [
        Patch(resolve(f"{TRITON}:TritonAttnBackend"), "__init__",
              lambda orig: exact_verify.make_triton_init(orig, adapter.exact_declined), "TritonAttnBackend.__init__"),
        Patch(resolve(f"{FLASHINFER}:FlashInferAttnBackend"), "__init__",
              lambda orig: exact_verify_flashinfer.make_flashinfer_init(orig, flashinfer_ok, adapter.release,
                                                                       adapter.exact_declined),
              "FlashInferAttnBackend.__init__"),
    ]


def _simulated_chain_patches(adapter: SglangAdapter, toggles: TreeToggles) -> list[Patch]:
    """The chain steps of DSPARK and DFLASH at the table's chain lengths, on chain and tree servers alike."""
    from . import simulate

    adapter.require(base.SIMULATED_CHAIN_PROBES, "FLASHTREE_SIMULATE_ACC", "none (sglang's SGLANG_SIMULATE_ACC_LEN)")
    simulate.check_chain_simulation(adapter.env_simulate_acc_len())
    table = simulate.load_table(toggles.simulate_acc)  # a bad table stops the server here, before any patch
    return [Patch(resolve(f"{base.VERIFY}:TargetVerifyExecutor"), "_simulated_correct_len",
                  lambda orig: simulate.make_chain_correct_len(table, toggles.simulate_acc, toggles.seed),
                  "TargetVerifyExecutor._simulated_correct_len")] + dflash_step.simulated_chain_patches(table, toggles)


def _splitkv_patch(adapter: SglangAdapter, required: bool) -> list[Patch]:
    """Split-KV verify's patch; `required` False (the tree's default, not set): none, rather than a refusal, on a
    release without its hooks."""
    from . import splitkv

    # on --enable-deterministic-inference servers split-KV verify takes exact verify's hook (splitkv.py)
    if not required and not adapter.meets(base.EXACT_VERIFY_PROBES):
        return []
    adapter.require(base.EXACT_VERIFY_PROBES, "FLASHTREE_SPLITKV_VERIFY=1", "0 (sglang's own verify attention)")
    kernel = splitkv.load_kernel()
    decode_order = splitkv.load_kernel(splitkv.DECODE_ORDER_KERNEL)
    return [Patch(resolve(f"{TRITON}:TritonAttnBackend"), "__init__",
                  lambda orig: splitkv.make_triton_init(orig, kernel, adapter.has_shared_kv, adapter.splitkv_declined,
                                                        decode_order, required),
                  "TritonAttnBackend.__init__")]
