"""Worker-start refusals (flashtree/patches/checks.py) through the installed DSparkWorkerV2.__init__ replacement, with
each release's real ServerArgs: multi-GPU servers (tensor, pipeline, attention data parallelism) are refused with one
message naming the setting; FLASHTREE_TP=1 lets tensor parallelism (only) start, with sglang's TP group; a single-GPU
server starts; on 0.5.20 a --enable-unified-memory server (virtual KV ids in req_to_token) is refused, on 0.5.23 one
whose target pool translates KV ids once the pools exist; a target with recurrent (mamba) state is refused."""

from __future__ import annotations

import inspect
import types

import pytest

from flashtree.patches import adapters, plan
from flashtree.patches.toggles import TreeToggles

REFUSAL = ("flashtree: FLASHTREE_TREE_N is set but this server runs {settings}; the tree path is single-GPU only for "
           "now: drop {flags} or unset FLASHTREE_TREE_N")
TP_OPT_IN = "; for --tp-size, FLASHTREE_TP=1 opts in to the tree path's tensor-parallel sync (not yet proven on GPUs)"
UNIFIED_REFUSAL = ("flashtree: FLASHTREE_TREE_N is set but this server runs --enable-unified-memory, whose unified KV "
                   "pool keeps virtual KV ids in req_to_token, which the tree commit rewrites (sglang audits only "
                   "DSPARK's chain verify on it); unset FLASHTREE_TREE_N for this server")


def server_args(**kwargs):
    from sglang.srt.server_args import ServerArgs

    return ServerArgs(model_path="dummy", **{"attention_backend": "triton", **kwargs})  # the tree verify's backend


def start_worker(args, **toggles):
    """flashtree's DSparkWorkerV2.__init__ replacement around a stand-in for sglang's own (which needs a live server
    and keeps `server_args` on the worker, as the last assertion of the test below checks)."""
    adapter = adapters.select_adapter()
    patch = next(p for p in plan.patches(adapter, TreeToggles(tree_n=4, **toggles)) if p.key == "DSparkWorkerV2.__init__")
    worker = types.SimpleNamespace(verify_num_draft_tokens=8, device="cpu", model_runner=types.SimpleNamespace(page_size=1),
                                   _proposer=types.SimpleNamespace(draft_model=types.SimpleNamespace()))

    def sglang_init(self, server_args):
        self.server_args = server_args

    patch.make(sglang_init)(worker, args)
    return worker


def dp_attention(release):
    # 0.5.23 sizes attention DP by its width; earlier releases switch it on over --dp-size
    if release == "0.5.23":
        return server_args(attn_dp_size=2), "--attn-dp-size 2", "--attn-dp-size"
    return server_args(dp_size=2, enable_dp_attention=True), "--enable-dp-attention", "--enable-dp-attention"


@pytest.mark.parametrize("case, tp_opt_in", [("tp", False), ("pp", False), ("dp-attention", False), ("tp-and-pp", False),
                                             ("pp", True), ("dp-attention", True), ("tp-and-pp", True)])
def test_multi_gpu_servers_are_refused_at_worker_start(case, tp_opt_in, sglang_release):
    """Refused by default; FLASHTREE_TP=1 lifts --tp-size only (it alone starts: the next test)."""
    if case == "dp-attention":
        args, settings, flags = dp_attention(sglang_release)
    else:
        args, settings, flags = {
            "tp": (server_args(tp_size=2), "--tp-size 2", "--tp-size"),
            "pp": (server_args(pp_size=2), "--pp-size 2", "--pp-size"),
            "tp-and-pp": (server_args(tp_size=2, pp_size=4), "--tp-size 2 --pp-size 4", "--tp-size / --pp-size"),
        }[case]
    if tp_opt_in and case == "tp-and-pp":
        settings, flags = "--pp-size 4", "--pp-size"
    with pytest.raises(SystemExit) as err:
        start_worker(args, tp=tp_opt_in)
    tp_refused = "--tp-size" in settings
    assert str(err.value) == REFUSAL.format(settings=settings, flags=flags) + (TP_OPT_IN if tp_refused else "")


def test_tp_opt_in_starts_with_sglangs_tp_group(monkeypatch):
    """FLASHTREE_TP=1 at --tp-size 2: the worker starts and its tree state syncs over sglang's TP group (the
    device group of parallel_state.get_tp_group, stood in for here: no process group exists on CPU)."""
    from sglang.srt.distributed import parallel_state

    asked = []
    group = types.SimpleNamespace(device_group=None)
    monkeypatch.setattr(parallel_state, "get_tp_group", lambda: asked.append(1) or group)
    worker = start_worker(server_args(tp_size=2), tp=True)
    assert asked == [1] and worker._flashtree.tp.group is None
    assert start_worker(server_args(), tp=True)._flashtree.tp.group is None and asked == [1]  # TP 1: not asked


def test_single_gpu_server_starts_and_workers_keep_server_args():
    from sglang.srt.speculative.dspark_components.dspark_worker_v2 import DSparkWorkerV2

    worker = start_worker(server_args())
    assert worker._flashtree.plan.width == 8 and worker._flashtree.plan.policy == "vote"
    assert "self.server_args = server_args" in inspect.getsource(DSparkWorkerV2.__init__)  # what parallelism() reads


def test_unified_memory_servers_are_refused_at_worker_start(sglang_release):
    """0.5.20 lets DSPARK (only) run --enable-unified-memory, whose target pool hands out virtual KV ids; the worker
    starts before sglang builds the pools and their KVIndexTranslator, so the flag is what the refusal reads."""
    if sglang_release != "0.5.20":
        pytest.skip("0.5.17's ServerArgs refuses the flag on every speculative server; 0.5.23: the pool check below")
    start_worker(server_args())  # without the flag: served
    with pytest.raises(SystemExit) as err:
        start_worker(server_args(enable_unified_memory=True))
    assert str(err.value) == UNIFIED_REFUSAL


def test_mamba_targets_are_refused_at_worker_start():
    """DSPARK marks a target with recurrent state (`_need_mamba_verify_commit`: its chain verify commits that state
    itself); a tree verify cannot commit it along one path of the tree."""
    from flashtree.patches.checks import ToggleError

    def sglang_init_mamba(self, server_args):
        self.server_args = server_args
        self._need_mamba_verify_commit = True

    adapter = adapters.select_adapter()
    patch = next(p for p in plan.patches(adapter, TreeToggles(tree_n=4)) if p.key == "DSparkWorkerV2.__init__")
    worker = types.SimpleNamespace(verify_num_draft_tokens=8, device="cpu", model_runner=types.SimpleNamespace(page_size=1),
                                   _proposer=types.SimpleNamespace(draft_model=types.SimpleNamespace()))
    with pytest.raises(ToggleError, match="FLASHTREE_TREE_N is set but the target has recurrent \\(mamba\\) state"):
        patch.make(sglang_init_mamba)(worker, server_args())


def test_translated_target_pools_are_refused_once_the_pools_exist(sglang_release):
    """0.5.23 can translate the target's KV ids (unified / fused pools: virtual ids in req_to_token, which the tree
    commit permutes); sglang builds the runner's KVIndexTranslator with the pools, after the worker, so the check runs
    at init_cuda_graphs."""
    from flashtree.patches import checks
    from flashtree.patches.checks import ToggleError

    if sglang_release != "0.5.23":
        pytest.skip("no KV index translation on DSPARK servers there (0.5.20: the flag check above)")
    adapter = adapters.select_adapter()
    worker = start_worker(server_args())  # no translator yet at worker start
    worker.model_runner.kv_index_translator = types.SimpleNamespace(is_translating=False)
    checks.at_init_cuda_graphs(adapter, worker, page_size=1)
    worker.model_runner.kv_index_translator = types.SimpleNamespace(is_translating=True)
    with pytest.raises(ToggleError, match="FLASHTREE_TREE_N is set but KV index translation .* is on"):
        checks.at_init_cuda_graphs(adapter, worker, page_size=1)
