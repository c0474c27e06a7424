"""Admission on the real Scheduler._add_request_to_queue with real Req objects."""

from __future__ import annotations

import pytest

import flashtree.patches as patches
from flashtree.patches import adapters
from flashtree.patches.toggles import TreeToggles


def make_scheduler(algorithm: str = "DSPARK"):
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.managers.scheduler import Scheduler

    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    sched = object.__new__(Scheduler)  # the real method on a scheduler without GPUs, model or sockets
    sched.spec_algorithm = getattr(SpeculativeAlgorithm, algorithm)
    sched.disaggregation_mode = DisaggregationMode.NULL
    sched.waiting_queue = []
    sched.processed_tokens_counter = 0
    sched._set_or_validate_priority = lambda req: True
    sched._abort_on_queued_limit = lambda req: False
    sched._prefetch_kvcache = lambda req, *a, **k: None
    sched._release_aborted_request = lambda req: None
    return sched


def make_req(rid, **sampling):
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    return Req(rid, "hello", [5, 6, 7], SamplingParams(max_new_tokens=8, **sampling), vocab_size=128)


def arrive(sched, reqs):
    from sglang.srt.managers.scheduler import Scheduler

    for req in reqs:
        Scheduler._add_request_to_queue(sched, req)


def batch():
    return [
        make_req("greedy", temperature=0.0),
        make_req("json", json_schema='{"type": "object"}'),
        make_req("sampled", temperature=0.7, top_p=0.9),
        make_req("regex", regex="[ab]+"),
    ]


@pytest.mark.usefixtures("tp_rank0")
def test_unsupported_request_gets_flashtree_error_others_unaffected():
    patches.install(TreeToggles(tree_n=8))
    sched = make_scheduler()
    reqs = batch()
    hidden = make_req("hidden")
    hidden.return_hidden_states = True
    arrive(sched, reqs + [hidden])
    assert [r.rid for r in sched.waiting_queue] == ["greedy", "json", "sampled", "regex", "hidden"]
    err = hidden.to_finish.to_json()
    assert err["type"] == "abort" and err["status_code"] == 400
    assert err["message"].startswith("flashtree: this server runs flashtree tree speculative decoding (FLASHTREE_TREE_N=8)")
    assert "cannot serve return_hidden_states" in err["message"] and "Send the request without it" in err["message"]
    for req in reqs:  # grammar requests too: the tree step masks every node by its path's grammar state
        assert req.to_finish is None and req.finished_reason is None
        assert list(req.origin_input_ids) == [5, 6, 7]  # sglang's abort would have shrunk it
    assert reqs[2].sampling_params.temperature == 0.7


@pytest.mark.usefixtures("tp_rank0")
def test_other_refusals_and_retracted_requests():
    patches.install(TreeToggles(tree_n=2))
    sched = make_scheduler()
    logprob = make_req("lp")
    logprob.return_logprob = True
    hidden = make_req("hidden")
    hidden.return_hidden_states = True
    mask = make_req("mask")
    mask.return_sampling_mask = True
    served = [make_req("freq", frequency_penalty=0.5), make_req("pres", presence_penalty=0.3),
              make_req("rep", repetition_penalty=1.2), make_req("bias", logit_bias={"3": -5.0}),
              make_req("minp", temperature=0.8, min_p=0.1)]
    arrive(sched, [logprob, hidden, mask] + served)
    assert logprob.to_finish is None  # DSPARK: the tree step writes them (0.5.17 too, logprobs.py)
    assert "cannot serve return_hidden_states" in hidden.to_finish.message
    assert "cannot serve return_sampling_mask" in mask.to_finish.message
    assert all(r.to_finish is None for r in served), [r.to_finish.message for r in served if r.to_finish]
    from sglang.srt.managers.scheduler import Scheduler

    retracted = make_req("retracted")
    retracted.return_hidden_states = True
    Scheduler._add_request_to_queue(sched, retracted, is_retracted=True)
    assert retracted.to_finish is None  # admitted before; retraction does not re-judge it


@pytest.mark.usefixtures("tp_rank0")
def test_same_request_served_with_toggles_off():
    sched = make_scheduler()
    reqs = batch()
    arrive(sched, reqs)
    assert all(r.to_finish is None for r in reqs)
    assert [r.rid for r in sched.waiting_queue] == ["greedy", "json", "sampled", "regex"]


@pytest.mark.usefixtures("tp_rank0")
def test_sglang_own_abort_is_left_alone():
    patches.install(TreeToggles(tree_n=8))
    sched = make_scheduler()
    req = make_req("bad")
    req.return_hidden_states = True
    req.set_finish_with_abort("sglang: prompt too long")
    arrive(sched, [req])
    assert req.to_finish.message == "sglang: prompt too long"


@pytest.mark.usefixtures("tp_rank0")
def test_logprobs_on_a_dflash_server_where_its_worker_refuses_them():
    """0.5.17's DFLASH worker raises on return_logprob batches: a DFLASH tree server refuses the request with one clear
    message (DSPARK servers serve it there, later releases both)."""
    patches.install(TreeToggles(tree_n=4))
    sched = make_scheduler("DFLASH")
    logprob = make_req("lp")
    logprob.return_logprob = True
    plain = make_req("plain")
    arrive(sched, [logprob, plain])
    assert plain.to_finish is None
    if adapters.select_adapter().dspark_refuses_logprobs:
        assert "cannot serve return_logprob on a DFLASH server with this sglang release" in logprob.to_finish.message
    else:
        assert logprob.to_finish is None


@pytest.mark.usefixtures("tp_rank0")
def test_sglang_0_5_17_lets_logprob_requests_through_to_the_tree():
    """0.5.17 refuses return_logprob on DSPARK servers in its scheduler's check and at the worker's entry (prefill too):
    with the tree on, the check defers it to flashtree's admission (its other checks stay) and the worker's entry runs
    such batches' prefill and decode; without flashtree both refusals are sglang's own again."""
    import types

    from sglang.srt.managers import scheduler as scheduler_module
    from sglang.srt.speculative.dspark_components.dspark_worker_v2 import DSparkWorkerV2

    if not adapters.select_adapter().dspark_refuses_logprobs:
        pytest.skip("this release's DSPARK serves return_logprob itself")
    logprob = make_req("lp")
    logprob.return_logprob = True
    hidden = make_req("hidden")
    hidden.return_hidden_states = True
    assert "return_logprob" in scheduler_module.validate_dflash_request(logprob, True)
    patches.install(TreeToggles(tree_n=4))
    try:
        assert scheduler_module.validate_dflash_request(logprob, True) is None and logprob.return_logprob
        assert "return_hidden_states" in scheduler_module.validate_dflash_request(hidden, True)
        calls = []
        worker = object.__new__(DSparkWorkerV2)
        worker._verify_planner = types.SimpleNamespace(note_non_decode_step=lambda: calls.append("note-planner"))
        worker._observers = types.SimpleNamespace(note_prefill_step=lambda: calls.append("note-observers"))
        worker._forward_prefill = lambda batch, on_publish: calls.append(("prefill", on_publish)) or "prefilled"
        worker._forward_decode = lambda batch, on_publish, barrier: calls.append(("decode", barrier)) or "decoded"

        def batch(extend: bool, logprobs: bool = True):
            mode = types.SimpleNamespace(is_extend=lambda: extend)
            return types.SimpleNamespace(return_logprob=logprobs, forward_mode=mode, is_extend_in_batch=False)

        assert DSparkWorkerV2.forward_batch_generation(worker, batch(True), "pub") == "prefilled"
        assert DSparkWorkerV2.forward_batch_generation(worker, batch(False), None, "barrier") == "decoded"
        assert calls == ["note-planner", "note-observers", ("prefill", "pub"), ("decode", "barrier")]
    finally:
        patches.uninstall()
    assert "return_logprob" in scheduler_module.validate_dflash_request(logprob, True)
    with pytest.raises(ValueError, match="return_logprob"):
        DSparkWorkerV2.forward_batch_generation(object.__new__(DSparkWorkerV2), batch(True))
