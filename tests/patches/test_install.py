"""Installing on the real sglang classes: exactly the intended attributes, idempotent, reversible; clear refusals."""

from __future__ import annotations

import functools
import importlib
import types

import pytest

import flashtree.patches as patches
from flashtree.patches import adapters, installer
from flashtree.patches.toggles import TreeToggles

W = "sglang.srt.speculative.dspark_components.dspark_worker_v2:DSparkWorkerV2"
S = "sglang.srt.managers.scheduler:Scheduler"
T = "sglang.srt.layers.attention.triton_backend:TritonAttnBackend"
U = "sglang.srt.speculative.dflash_utils:"
P = "sglang.srt.speculative.dspark_components.dspark_planner:"
R = "sglang.srt.managers.scheduler_components.batch_result_processor:SchedulerBatchResultProcessor"
Q = "sglang.srt.managers.schedule_batch:Req"
M = "sglang.srt.managers.scheduler:"  # the scheduler module


def owner(path: str):
    module, _, attr = path.partition(":")
    obj = importlib.import_module(module)
    return getattr(obj, attr) if attr else obj


OWNERS = [W, S, T, U, P, R, Q, M]
TREE_KEYS = {
    (W, "__init__"),
    (W, "init_cuda_graphs"),
    (W, "_forward_decode"),
    (S, "_add_request_to_queue"),
    (R, "_maybe_collect_customized_info"),
    (U, "_DFLASH_VERIFY_SKIP_CUSTOM_MASK_BACKENDS"),
}
SPLITKV_DEFAULT = {(T, "__init__")}  # what read_toggles adds for a tree: split-KV verify, unless set


def tree_keys(release: str) -> set:
    """What FLASHTREE_TREE_N installs: on 0.5.17 also the stop-token fix (finish.py) and the way through its two
    return_logprob refusals (logprobs.py)."""
    extra = {(Q, "update_finish_state"), (M, "validate_dflash_request"), (W, "forward_batch_generation")}
    return TREE_KEYS | (extra if release == "0.5.17" else set())


def snapshot() -> dict:
    return {(p, k): v for p in OWNERS for k, v in dict(vars(owner(p))).items()}


def diff(before: dict, after: dict) -> set:
    return {key for key in before.keys() | after.keys() if before.get(key, "<absent>") is not after.get(key, "<absent>")}


def test_adapter_matches_installed_release(sglang_release):
    adapter = adapters.select_adapter()
    assert adapter.release == sglang_release
    others = [cls() for cls in adapters.ADAPTERS if cls.release != sglang_release]
    assert all(o.mismatches() for o in others), "another release's probes pass too: probes do not tell releases apart"


@pytest.mark.parametrize("budget", [0, 64], ids=["tree", "tree-with-budget"])
def test_install_replaces_exactly_the_tree_attributes_and_uninstall_restores(sglang_release, budget):
    expected = tree_keys(sglang_release)  # with or without a budget: init_cuda_graphs is wrapped (startup.py)
    before = snapshot()
    keys = patches.install(TreeToggles(tree_n=4, tree_budget=budget))
    after = snapshot()
    assert diff(before, after) == expected
    for path, name in expected:
        assert installer.is_flashtree(vars(owner(path))[name])
    assert "TritonAttnBackend" not in owner(U)._DFLASH_VERIFY_SKIP_CUSTOM_MASK_BACKENDS
    assert "FlashInferAttnBackend" not in owner(U)._DFLASH_VERIFY_SKIP_CUSTOM_MASK_BACKENDS
    assert "FlashAttentionBackend" in owner(U)._DFLASH_VERIFY_SKIP_CUSTOM_MASK_BACKENDS  # FA3: refused (checks)
    # The wrapper still knows the original.
    assert owner(W)._forward_decode.__wrapped__ is before[(W, "_forward_decode")]

    again = patches.install(TreeToggles(tree_n=4, tree_budget=budget))
    assert again == keys
    assert diff(after, snapshot()) == set(), "a second install changed something"
    assert installer.installed_keys() == keys

    restored = patches.uninstall()
    assert sorted(restored) == sorted(keys)
    assert diff(before, snapshot()) == set()


def test_install_with_other_toggles_reinstalls(monkeypatch, sglang_release, caplog):
    """A second install with other toggles replaces the first one's patches (their replacements close over the
    toggles they were made for) instead of keeping them silently; the same toggles again change nothing."""
    monkeypatch.setattr("flashtree.attention.triton_verify.tree_attention_triton", lambda *a, **k: None)
    before = snapshot()
    patches.install(TreeToggles(splitkv_verify=True))
    assert (T, "__init__") in diff(before, snapshot())
    with caplog.at_level("INFO", logger="flashtree.patches"):
        keys = patches.install(TreeToggles(tree_n=4))
        assert "flashtree: reinstalling for tree_n=4" in caplog.text
        assert diff(before, snapshot()) == tree_keys(sglang_release)  # split-KV's patch gone, the tree's in place
        assert sorted(installer.installed_keys()) == sorted(keys)
        first = snapshot()
        assert patches.install(TreeToggles(tree_n=4, tree_max_bs=2)) == keys
        assert diff(before, snapshot()) == tree_keys(sglang_release)
        assert diff(first, snapshot()) == tree_keys(sglang_release), "kept the replacements made for the first toggles"
        again = snapshot()
        assert patches.install(TreeToggles(tree_n=4, tree_max_bs=2)) == keys and diff(again, snapshot()) == set()
    assert caplog.text.count("reinstalling") == 2
    patches.uninstall()
    assert diff(before, snapshot()) == set()


def _foreign_wrappers():
    def with_wraps(ours):
        @functools.wraps(ours)
        def wrapper(*args, **kwargs):
            return ours(*args, **kwargs)

        return wrapper

    def with_closure(ours):
        def wrapper(*args, **kwargs):
            return ours(*args, **kwargs)

        return wrapper

    return {"functools.wraps": with_wraps, "closure": with_closure}


@pytest.mark.parametrize("wrap", _foreign_wrappers().values(), ids=_foreign_wrappers().keys())
def test_uninstall_refuses_while_another_wrapper_sits_over_ours(sglang_release, wrap):
    before = snapshot()
    keys = patches.install(TreeToggles(tree_n=4))
    ours = vars(owner(W))["_forward_decode"]
    setattr(owner(W), "_forward_decode", wrap(ours))  # another plugin, after flashtree
    installed = snapshot()
    try:
        with pytest.raises(RuntimeError, match=r"another wrapper sits over flashtree's replacement of "
                           r"sglang\.srt\.speculative\.dspark_components\.dspark_worker_v2\.DSparkWorkerV2\._forward_decode"):
            patches.uninstall()
        assert diff(installed, snapshot()) == set() and installer.installed_keys() == keys  # nothing restored
    finally:
        setattr(owner(W), "_forward_decode", ours)  # that plugin removes its wrapper
    assert sorted(patches.uninstall()) == sorted(keys)
    assert diff(before, snapshot()) == set()


def test_uninstall_leaves_a_foreign_replacement_and_says_so(sglang_release, caplog):
    before = snapshot()
    keys = patches.install(TreeToggles(tree_n=4))

    def theirs(self, batch, on_publish, *args, **kwargs):  # replaces flashtree's step without calling it
        raise AssertionError("never called")

    setattr(owner(W), "_forward_decode", theirs)
    try:
        with caplog.at_level("WARNING", logger="flashtree.patches"):
            restored = patches.uninstall()
        assert sorted(restored) == sorted(set(keys) - {"DSparkWorkerV2._forward_decode"})
        assert "DSparkWorkerV2._forward_decode was replaced by someone else after flashtree patched it" in caplog.text
        assert vars(owner(W))["_forward_decode"] is theirs and installer.installed_keys() == []
    finally:
        setattr(owner(W), "_forward_decode", before[(W, "_forward_decode")])
    assert diff(before, snapshot()) == set()


def test_unset_toggles_change_nothing():
    before = snapshot()
    patches.register()
    assert patches.install(environ={}) == []
    assert diff(before, snapshot()) == set()
    assert installer.installed_keys() == []


def test_register_reads_environment(monkeypatch, sglang_release):
    before = snapshot()
    monkeypatch.setenv("FLASHTREE_TREE_N", "2")
    patches.register()
    assert diff(before, snapshot()) == tree_keys(sglang_release) | SPLITKV_DEFAULT


def test_tree_max_bs_installs_the_same_patches_and_routes_big_batches_to_dspark(monkeypatch, sglang_release):
    """FLASHTREE_TREE_MAX_BS adds no patch; the installed `_forward_decode` hands batches above it to DSPARK's real
    `_forward_decode` (here it stops at its first check, on a stand-in draft input) and smaller ones to the tree step."""
    import torch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    import flashtree.patches.decode as decode
    from flashtree.patches import read_toggles

    before = snapshot()
    monkeypatch.setenv("FLASHTREE_TREE_N", "4")
    monkeypatch.setenv("FLASHTREE_TREE_MAX_BS", "2")
    patches.register()
    assert diff(before, snapshot()) == tree_keys(sglang_release) | SPLITKV_DEFAULT
    trees = []
    monkeypatch.setattr(decode, "tree_step", lambda state, worker, batch, on_publish, shape=None, **kw: trees.append(
        len(batch.seq_lens)))
    # the target backend's verify-mask buffer, which verify graphs captured for trees read
    buffer = torch.zeros(1000, dtype=torch.uint8)
    backend = types.SimpleNamespace(verify_mask=types.SimpleNamespace(buffer=buffer))
    worker = types.SimpleNamespace(verify_num_draft_tokens=8, model_runner=types.SimpleNamespace(page_size=1), device="cpu",
                                   target_worker=types.SimpleNamespace(model_runner=types.SimpleNamespace(attn_backend=backend)))
    worker._flashtree = decode.create_state(adapters.select_adapter(), read_toggles(), worker)

    # The draft input: not DSPARK's class (its step refuses it below), no reserved lengths (the host sum sizes the mask).
    draft_input = types.SimpleNamespace(reserved_seq_lens_cpu=None, reserved_seq_lens_sum=None, nxt_kv_lens_cpu=None,
                                        nxt_kv_lens_sum=None)

    def batch(lens):
        return types.SimpleNamespace(forward_mode=ForwardMode.DECODE, seq_lens=torch.tensor(lens), seq_lens_sum=sum(lens),
                                     sampling_info=None, has_grammar=False, return_logprob=False, spec_info=draft_input)

    forward = owner(W)._forward_decode
    with pytest.raises(RuntimeError, match="DSpark spec-v2 expected DFlashDraftInputV2"):  # DSPARK's own step ran
        forward(worker, batch([3, 0, 5]), None)
    # ... after the chain's causal FULL_MASK was staged: per request 8 rows of (prefix True, then causal 8 x 8)
    want = [[1] * n + [int(j <= i) for j in range(8)] for n in (3, 0, 5) for i in range(8)]
    flat = [x for row in want for x in row]
    assert buffer[: len(flat)].tolist() == flat and not buffer[len(flat):].any()
    buffer.zero_()
    forward(worker, batch([4, 4]), None)
    forward(worker, batch([9]), None)
    assert trees == [2, 1] and worker._flashtree.fallbacks == {"batch-size": 1}
    assert not buffer.any()  # tree steps pass their own mask; sglang copies it in


def test_bad_toggle_touches_nothing(monkeypatch):
    before = snapshot()
    monkeypatch.setenv("FLASHTREE_TREE_N", "8")
    monkeypatch.setenv("FLASHTREE_TREE_BUDGET", "a lot")
    with pytest.raises(SystemExit, match=r"FLASHTREE_TREE_BUDGET='a lot' is invalid; allowed: an integer from 0 to"):
        patches.register()
    assert diff(before, snapshot()) == set()


def test_unsupported_version_is_refused_untouched(monkeypatch):
    before = snapshot()
    monkeypatch.setattr(adapters, "installed_version", lambda: "0.5.99")
    monkeypatch.setenv("FLASHTREE_TREE_N", "8")
    with pytest.raises(SystemExit) as exc:
        patches.register()
    msg = str(exc.value)
    assert f"sglang 0.5.99 is not a supported release; supported releases: {', '.join(adapters.SUPPORTED)}" in msg
    assert diff(before, snapshot()) == set()


def test_a_broken_dependency_of_a_supported_release_is_named_as_such(monkeypatch, sglang_release):
    """A supported release whose modules fail to import (a dependency missing or broken) is refused with that import
    error, naming the module and the error, not as an unsupported release."""
    from flashtree.patches.adapters import probe

    worker_module = W.partition(":")[0]

    def import_module(name):
        if name == worker_module:
            raise ModuleNotFoundError("No module named 'sgl_kernel'", name="sgl_kernel")
        return importlib.import_module(name)

    monkeypatch.setattr(probe, "importlib", types.SimpleNamespace(import_module=import_module))
    before = snapshot()
    with pytest.raises(SystemExit) as exc:
        patches.install(TreeToggles(tree_n=8))
    msg = str(exc.value)
    assert msg == (
        f"flashtree: FLASHTREE_* toggles are set and sglang {sglang_release} is a supported release, but importing "
        f"{worker_module} fails (ModuleNotFoundError: No module named 'sgl_kernel'); install what it lacks "
        f"(flashtree's test venv: scripts/setup_sglang.sh {sglang_release}) or unset the FLASHTREE_* toggles."
    )
    assert "not a supported release" not in msg and diff(before, snapshot()) == set()
    # Another release's version with the same failure: unsupported, as before.
    monkeypatch.setattr(adapters, "installed_version", lambda: "0.5.99")
    with pytest.raises(SystemExit, match="sglang 0.5.99 is not a supported release"):
        patches.install(TreeToggles(tree_n=8))


def test_signature_drift_is_refused_untouched(monkeypatch, sglang_release):
    """Same version string, but a probed signature changed (a patched wheel, a backport): refuse."""
    planner = owner(P)

    def alloc_verify_window(*, batch, bs, device, verify_num_draft_tokens, page_table):
        raise AssertionError("never called")

    monkeypatch.setattr(planner, "alloc_verify_window", alloc_verify_window)
    before = snapshot()
    with pytest.raises(SystemExit) as exc:
        patches.install(TreeToggles(tree_n=8))
    msg = str(exc.value)
    assert f"sglang {sglang_release} is not a supported release" in msg and "alloc_verify_window" in msg
    assert diff(before, snapshot()) == set()


def test_splitkv_without_kernel_is_refused_untouched(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "flashtree.attention.triton_verify", types.SimpleNamespace())  # a build without it
    before = snapshot()
    with pytest.raises(SystemExit, match="FLASHTREE_SPLITKV_VERIFY=1 needs flashtree.attention.triton_verify:tree_attention_triton"):
        patches.install(TreeToggles(tree_n=4, splitkv_verify=True))
    assert diff(before, snapshot()) == set()
    assert installer.installed_keys() == []


def test_splitkv_with_kernel_patches_triton_backend(monkeypatch, sglang_release):
    calls = []

    def tree_verify_attention(q, k, v, k_buffer, v_buffer, kv_indptr, kv_indices, custom_mask, L, sm_scale=None,
                              mask_indptr=None, out=None):
        calls.append(sm_scale)
        return out

    monkeypatch.setattr("flashtree.attention.triton_verify.tree_attention_triton", tree_verify_attention)
    before = snapshot()
    patches.install(TreeToggles(splitkv_verify=True))
    finish = {(Q, "update_finish_state")} if sglang_release == "0.5.17" else set()  # finish.py
    assert diff(before, snapshot()) == {(T, "__init__")} | finish
    assert owner(T).__init__.__wrapped__ is before[(T, "__init__")]
    patches.uninstall()
    assert diff(before, snapshot()) == set()

    # The wrapper's own logic around a stand-in original (sglang's real __init__ needs a model runner); the verify
    # extend path through it is tested in test_splitkv_cpu.py.
    from flashtree.patches.splitkv import make_triton_init

    def fake_original(self, model_runner, *a, **k):  # what sglang's __init__ leaves on NVIDIA
        self.use_verify_splitkv = False
        self.use_verify_shared_kv = False
        self.verify_splitkv_fwd = None

    wrapped = make_triton_init(fake_original, tree_verify_attention, True)
    target = types.SimpleNamespace()
    wrapped(target, types.SimpleNamespace(is_draft_worker=False))
    assert target.use_verify_splitkv is True and target.use_verify_shared_kv is False
    assert callable(target.verify_splitkv_fwd)
    draft = types.SimpleNamespace()
    wrapped(draft, types.SimpleNamespace(is_draft_worker=True))
    assert draft.use_verify_splitkv is False and draft.verify_splitkv_fwd is None


def test_worker_checks_width_depth_and_page_size():
    from flashtree.patches.decode import create_state

    adapter = adapters.select_adapter()
    worker = types.SimpleNamespace(verify_num_draft_tokens=8, model_runner=types.SimpleNamespace(page_size=1), device="cpu")
    state = create_state(adapter, TreeToggles(tree_n=4), worker)
    assert (state.plan.gamma, state.plan.width, state.plan.tree_width) == (7, 8, 8)
    assert create_state(adapter, TreeToggles(tree_n=4, tree_width=5), worker).plan.tree_width == 5
    with pytest.raises(SystemExit, match=r"FLASHTREE_TREE_WIDTH=9 exceeds DSPARK's verify window .* = 8\); allowed: 'auto' or an integer from 2 to 8"):
        create_state(adapter, TreeToggles(tree_n=4, tree_width=9), worker)
    assert create_state(adapter, TreeToggles(tree_n=4), worker).plan.depth == 7
    assert create_state(adapter, TreeToggles(tree_n=4, tree_depth=3), worker).plan.depth == 3
    with pytest.raises(SystemExit, match=r"FLASHTREE_TREE_DEPTH=8 exceeds DSPARK's draft block \(gamma = 7\); allowed: 'auto' or an integer from 1 to 7"):
        create_state(adapter, TreeToggles(tree_n=4, tree_depth=8), worker)
    worker.model_runner.page_size = 16  # its pool is checked at init_cuda_graphs (test_paged_kv_check_waits_for_the_pools)
    assert create_state(adapter, TreeToggles(tree_n=4), worker).plan.page_size == 16


def test_paged_kv_check_waits_for_the_pools(sglang_release):
    """sglang builds DSparkWorkerV2 before it allocates the KV pools (seen live on 0.5.17 with --page-size 16: the
    start check found no pool and stopped every paged tree server). The worker then starts, and the installed
    init_cuda_graphs, which the scheduler calls once the pools exist, checks the pool before DSPARK captures."""
    from flashtree.patches.decode import make_worker_init
    from flashtree.patches.startup import make_init_cuda_graphs

    adapter = adapters.select_adapter()
    toggles = TreeToggles(tree_n=4)

    def build(pool):
        worker = types.SimpleNamespace(verify_num_draft_tokens=8, device="cpu",
                                       model_runner=types.SimpleNamespace(page_size=16, token_to_kv_pool=None))
        make_worker_init(lambda self: None, adapter, toggles)(worker)  # no pool yet: no refusal
        worker.model_runner.token_to_kv_pool = pool  # then the scheduler's init_memory_pools
        return worker

    refusal = r"with --page-size 16 the tree path commits by copying the accepted KV, but the target KV pool \(object\) has no move_kv_cache"
    patches.install(toggles)
    try:  # the installed wrapper refuses before the release's own init_cuda_graphs runs
        with pytest.raises(SystemExit, match=refusal):
            owner(W).init_cuda_graphs(build(object()))
    finally:
        patches.uninstall()
    captured = []
    init_cuda_graphs = make_init_cuda_graphs(captured.append, narrow=False)
    with pytest.raises(SystemExit, match=refusal):
        init_cuda_graphs(build(object()))
    assert captured == []  # stopped before DSPARK's capture
    worker = build(types.SimpleNamespace(move_kv_cache=lambda tgt, src: None))
    init_cuda_graphs(worker)
    assert captured == [worker] and worker._flashtree.plan.page_size == 16


def test_draft_rows_install_on_0_5_17_only(sglang_release, monkeypatch):
    """FLASHTREE_DRAFT_ROWS: 0.5.17 installs the tree path as usual (the D-row forward is built per worker); releases
    whose draft proposer sizes its forward by query_token_num refuse it before patching anything, and so does 0.5.17
    when the calls it builds on are gone."""
    from flashtree.patches.adapters import base
    from flashtree.patches.adapters.probe import Has
    from flashtree.patches.toggles import ToggleError

    before = snapshot()
    if sglang_release != "0.5.17":
        with pytest.raises(ToggleError, match=rf"FLASHTREE_DRAFT_ROWS=8 needs sglang 0\.5\.17's DSPARK draft proposer \(sglang {sglang_release}'s sizes its forward by query_token_num\); allowed: 'auto'"):
            patches.install(TreeToggles(tree_n=4, draft_rows=8))
        assert diff(before, snapshot()) == set() and installer.installed_keys() == []
        return
    try:
        patches.install(TreeToggles(tree_n=4, draft_rows=8))
        assert diff(before, snapshot()) == tree_keys(sglang_release)
    finally:
        patches.uninstall()
    monkeypatch.setattr(base, "DRAFT_ROWS_PROBES", (Has(f"{W}.no_such_draft_call"),))
    with pytest.raises(ToggleError, match="FLASHTREE_DRAFT_ROWS cannot hook sglang 0.5.17: .*no_such_draft_call"):
        patches.install(TreeToggles(tree_n=4, draft_rows=8))
    assert diff(before, snapshot()) == set() and installer.installed_keys() == []


def test_budget_on_a_release_without_its_hooks_is_refused_untouched(monkeypatch):
    from flashtree.patches.adapters import base
    from flashtree.patches.adapters.probe import Has
    from flashtree.patches.toggles import ToggleError

    monkeypatch.setattr(base, "NARROW_VERIFY_PROBES", (Has(f"{W}.no_such_capture_hook"),))
    before = snapshot()
    with pytest.raises(ToggleError, match="FLASHTREE_TREE_BUDGET / FLASHTREE_TREE_WIDTH cannot hook sglang .*no_such_capture_hook"):
        patches.install(TreeToggles(tree_n=4, tree_budget=64))
    assert diff(before, snapshot()) == set() and installer.installed_keys() == []


def test_simulated_chain_draws_dspark_lengths_from_the_table(monkeypatch, sglang_release, tmp_path):
    """FLASHTREE_SIMULATE_ACC alone (a chain server): DSPARK's simulate path takes each request's length from the
    table's chain shape (N = 1 over its window), capped at gamma; without SGLANG_SIMULATE_ACC_LEN it is refused, and on
    a release without a per-request simulated length too, leaving sglang untouched."""
    import torch

    from flashtree.patches.toggles import ToggleError
    from flashtree.planner.accept_table import AcceptTable

    table = tmp_path / "accept.json"
    # DSPARK's window below is 32 tokens: its chain takes the recorded chain (N = 1, W = 8), not the 32-token tree
    AcceptTable({(1, 8): (1, 0, 0, 3), (8, 8): (0, 1), (16, 32): (0, 0, 0, 0, 0, 1)}).save(table)
    toggles = TreeToggles(simulate_acc=str(table))
    executor = owner("sglang.srt.speculative.dspark_components.dspark_verify:TargetVerifyExecutor")
    before = dict(vars(executor))
    monkeypatch.setenv("SGLANG_SIMULATE_ACC_LEN", "1")
    if sglang_release == "0.5.23":
        with pytest.raises(ToggleError, match="FLASHTREE_SIMULATE_ACC cannot hook sglang 0.5.23"):
            patches.install(toggles)
        assert dict(vars(executor)) == before
        return
    monkeypatch.delenv("SGLANG_SIMULATE_ACC_LEN")
    with pytest.raises(ToggleError, match="set SGLANG_SIMULATE_ACC_LEN=1 as well"):
        patches.install(toggles)
    assert dict(vars(executor)) == before and patches.installed() == []
    monkeypatch.setenv("SGLANG_SIMULATE_ACC_LEN", "1")
    dflash = importlib.import_module("sglang.srt.speculative.dflash_worker_v2")
    stock = dflash.apply_dflash_simulated_acceptance
    try:
        installed = patches.install(toggles)
        assert "TargetVerifyExecutor._simulated_correct_len" in installed
        verify = types.SimpleNamespace(gamma=31)
        drawn = executor._simulated_correct_len(verify, bs=4000, dtype=torch.int32, device=torch.device("cpu"))
        assert drawn.dtype == torch.int32 and drawn.shape == (4000,) and set(drawn.tolist()) == {0, 3}
        assert 0.7 < float((drawn == 3).float().mean()) < 0.8
        # a DFLASH chain server's steps (no tree toggle) draw from the same table, through the name its worker calls
        assert "dflash_worker_v2.apply_dflash_simulated_acceptance" in installed
        bs, w = 4000, 16
        accept, commit = torch.zeros(bs, dtype=torch.int32), torch.zeros(bs, dtype=torch.int32)
        dflash.apply_dflash_simulated_acceptance(
            candidates=torch.zeros(bs, w, dtype=torch.int64), target_predict=torch.zeros(bs, w, dtype=torch.int64),
            accept_len=accept, commit_lens=commit, bonus=torch.zeros(bs, dtype=torch.int64),
            out_tokens=torch.zeros(bs, w, dtype=torch.int64), simulate_acc_len=1.0, simulate_acc_method="x",
            simulate_acc_token_mode="real-draft-token")
        assert set(accept.tolist()) == {0, 3} and torch.equal(commit, accept + 1)
    finally:
        patches.uninstall()
    assert dict(vars(executor)) == before and dflash.apply_dflash_simulated_acceptance is stock
