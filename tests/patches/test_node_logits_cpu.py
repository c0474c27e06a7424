"""Sampling features on the tree step (node_logits.py, logprobs.py), checked against sglang's own sampling code on
real Req / SamplingBatchInfo objects: penalties through its penalizer orchestrator, logit_bias and custom logit
processors as its sampler applies them, logprobs as its result processor reads them. The tree step runs on the
stand-ins of test_decode_cpu (its `run` checks every commit against the expected sequence)."""

from __future__ import annotations

import types
from collections import Counter

import pytest
import torch

import sglang_cpu
from test_decode_cpu import MAX_LEN, V, W, chi2_critical_001, reference, run, skip_reason, target_logits

from flashtree.patches import node_logits

N_TOKENS = MAX_LEN - 2 * W


@pytest.fixture(autouse=True)
def sampling_context(monkeypatch):
    """What a running server publishes for SamplingBatchInfo.from_schedule_batch (no deterministic inference, custom
    logit processors enabled), sglang's torch.compile'd helpers run eagerly, and sglang's tree kernels in the Triton interpreter."""
    import sglang.srt.sampling.sampling_batch_info as sbi

    sglang_cpu.force_triton_tree_kernels()
    features = types.SimpleNamespace(enable_custom_logit_processor=True, enable_watermark=False)
    ctx = types.SimpleNamespace(deterministic=types.SimpleNamespace(enable_deterministic_inference=False),
                                features=features)
    monkeypatch.setattr(sbi, "get_exec", lambda: ctx)
    if hasattr(sbi, "get_server_args"):
        monkeypatch.setattr(sbi, "get_server_args", lambda: types.SimpleNamespace())
    import torch._dynamo

    with torch._dynamo.config.patch(disable=True):  # sglang compiles its repetition scaling: run it eagerly
        yield


def make_reqs(prompts, settings, logprobs=None):
    """Real Req objects; logprobs: per request None or (top_logprobs_num, token_ids_logprob) for return_logprob."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    reqs = []
    for i, (prompt, kw) in enumerate(zip(prompts, settings)):
        kw = dict(kw)
        processor = kw.pop("custom_logit_processor", None)
        params = SamplingParams(max_new_tokens=MAX_LEN, **kw)
        params.normalize(None)
        lp = None if logprobs is None else logprobs[i]
        extra = {} if lp is None else {"return_logprob": True, "top_logprobs_num": lp[0], "token_ids_logprob": lp[1]}
        reqs.append(Req(f"r{i}", "", list(prompt), params, vocab_size=V, custom_logit_processor=processor, **extra))
    return reqs


class Holder:
    """What SamplingBatchInfo reads from a ScheduleBatch (its penalizers keep a weak reference to it)."""

    def __init__(self, reqs):
        self.reqs, self.device = reqs, "cpu"


def batch_info(reqs):
    """sglang's SamplingBatchInfo for these requests (and the batch object its penalizers hold a reference to)."""
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

    holder = Holder(reqs)
    return SamplingBatchInfo.from_schedule_batch(holder, V), holder


def sequential(prompts, reqs, n: int, overlap: bool = False):
    """Each request's decode without speculation by sglang's own code path: its penalizers fed the last output token
    before every decode step, `apply_logits_bias` of the forward copy the overlap scheduler hands the model (additive
    penalties, then repetition scaling, then logit_bias; the non-overlap path applies the penalizers in the order of a
    set, which varies between processes), the custom logit processors, argmax. `overlap`: as under sglang's overlap
    scheduler, whose `cumulate_penalty_output_tokens` reads `Req.output_ids` before the step in flight has extended
    it: the prompt's last token before the first decode, then each output token one step late.
    -> (sequences, the adjusted logits of every generated position)."""
    from sglang.srt.layers.sampler import apply_custom_logit_processor

    info, _holder = batch_info(reqs)
    seqs, adjusted = [list(p) for p in prompts], [[] for _ in prompts]
    for step in range(n):
        logits = torch.stack([target_logits(s) for s in seqs])
        if step and not overlap:
            info.penalizer_orchestrator.cumulate_output_tokens(torch.tensor([s[-1] for s in seqs]))
        elif step:
            late = [p[-1] if step == 1 else s[-2] for p, s in zip(prompts, seqs)]
            info.penalizer_orchestrator.cumulate_output_tokens(torch.tensor(late))
        info.copy_for_forward().apply_logits_bias(logits)
        if info.has_custom_logit_processor:
            apply_custom_logit_processor(logits, info)
        for b, tok in enumerate(logits.argmax(-1).tolist()):
            seqs[b].append(tok)
            adjusted[b].append(logits[b].clone())
    return seqs, adjusted


def disallow(tokens):
    from sglang.srt.sampling.custom_logit_processor import DisallowedTokensLogitsProcessor

    return DisallowedTokensLogitsProcessor.to_str(), {"token_ids": tokens}


PROMPTS = [[3, 1, 4, 1, 5], [9, 2, 6], [5, 3, 5, 8, 9, 7, 9], [2, 7, 1, 8]]


def feature_batch():
    processor, params = disallow([(7 * 3 + 1) % V, 4, 9])
    return [
        {"temperature": 0.0, "frequency_penalty": 0.6, "presence_penalty": 0.3},
        {"temperature": 0.0, "repetition_penalty": 2.5},
        {"temperature": 0.0, "logit_bias": {"6": 30.7, "11": -3.0}, "custom_logit_processor": processor,
         "custom_params": params},
        {"temperature": 0.0},
    ]


def run_features(settings, steps: int = 12, batch_extra=None, on_step=None, reqs=None, overlap: bool = False):
    reqs = reqs or make_reqs(PROMPTS, settings)
    refs, adjusted = sequential(PROMPTS, make_reqs(PROMPTS, settings), N_TOKENS, overlap=overlap)
    info, holder = batch_info(reqs)
    result = run(n=4, steps=steps, prompts=PROMPTS, sampling_info=info.copy_for_forward(), refs=refs, reqs=reqs,
                 batch_extra=batch_extra, on_step=on_step)
    return result, refs, adjusted


def test_penalties_bias_and_processors_commit_the_sequential_decode():
    """A mixed batch (frequency + presence, repetition, logit_bias + a custom processor, none): every tree step's
    commits equal sglang's sequential greedy decode with the same settings, token for token; each feature changes
    that decode (so the check could fail), and drafts are accepted deep under them."""
    (accepts, state, _generated, _world), refs, _adjusted = run_features(feature_batch())
    plain = [reference(p, N_TOKENS) for p in PROMPTS]
    assert [refs[b] != plain[b] for b in range(4)] == [True, True, True, False]
    assert max(accepts) >= 2 and state.steps == 12
    assert state.fallbacks == {}


def test_root_state_penalties_are_not_the_sequential_decode(monkeypatch):
    """Negative control: penalties from the root's counts at every node (DSPARK's chain applies the root's state to
    its whole block) commit tokens the sequential decode does not."""
    monkeypatch.setattr(node_logits, "path_counts", lambda committed, ids, ancestors: committed.unsqueeze(1).repeat(
        1, ids.shape[1], 1))
    with pytest.raises(AssertionError):
        run_features(feature_batch())


@pytest.mark.parametrize("lag", [True, False], ids=["lagged", "negative-control"])
def test_overlap_scheduled_servers_count_penalties_as_their_decode_does(monkeypatch, lag):
    """Under sglang's overlap scheduler the decode without speculation counts the prompt's last token and each output
    one step late: a server that runs it (TreePlan.penalty_lag) commits that decode token for token, and without the
    lag (the negative control) does not; the two decodes differ, so the check can fail."""
    from flashtree.patches.adapters import base

    monkeypatch.setattr(base.SglangAdapter, "overlap_schedule", lambda self, worker: lag)
    settings = feature_batch()
    late, _ = sequential(PROMPTS, make_reqs(PROMPTS, settings), N_TOKENS, overlap=True)
    exact, _ = sequential(PROMPTS, make_reqs(PROMPTS, settings), N_TOKENS)
    assert [late[b] != exact[b] for b in range(4)][3] is False and late[:2] != exact[:2]
    if lag:
        (_accepts, state, _generated, _world), _refs, _adjusted = run_features(settings, overlap=True)
        assert state.plan.penalty_lag and state.steps == 12
    else:
        with pytest.raises(AssertionError):
            run_features(settings, overlap=True)


def test_penalized_and_logprob_batches_keep_the_tree_step_above_max_bs():
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from flashtree.patches import adapters

    adapter = adapters.select_adapter()
    plan = types.SimpleNamespace(toggles=types.SimpleNamespace(tree_max_bs=2, tree_n=8), adapter=adapter)
    greedy = [{"temperature": 0.0}] * 4
    # return_logprob: DSPARK's own decode returns none on 0.5.17 (logprobs.py), so such batches keep the tree step there
    logprob_want = None if adapter.dspark_refuses_logprobs else "batch-size"
    for settings, logprob, want in ((greedy, False, "batch-size"), (feature_batch(), False, None),
                                    (greedy, True, logprob_want)):
        reqs = make_reqs(PROMPTS, settings)
        info, _holder = batch_info(reqs)
        batch = types.SimpleNamespace(forward_mode=ForwardMode.DECODE, seq_lens=torch.zeros(4, dtype=torch.long),
                                      sampling_info=info.copy_for_forward(), has_grammar=False, reqs=reqs,
                                      return_logprob=logprob)
        assert skip_reason(plan, batch) == want


def test_logprobs_of_the_committed_path():
    """return_logprob: each committed token's logprob, its top 3 and two requested token ids' logprobs, as sglang's
    result processor appends them to the request, equal log_softmax of sglang's own adjusted logits at that position
    of the sequential decode."""
    from sglang.srt.managers.scheduler_components.batch_result_processor import SchedulerBatchResultProcessor

    settings = feature_batch()
    reqs = make_reqs(PROMPTS, settings, logprobs=[(3, None), (3, [2, 5]), (3, None), (3, None)])
    extra = {"return_logprob": True, "top_logprobs_nums": [3] * 4, "token_ids_logprobs": [None, [2, 5], None, None]}

    def on_step(res):
        out = res.logits_output
        # sglang's _normalize_decode_outputs: the device results as lists, then _apply_decode_logprobs per request.
        out.next_token_top_logprobs_val = [v.tolist() for v in out.next_token_top_logprobs_val]
        out.next_token_top_logprobs_idx = [list(x) if not torch.is_tensor(x) else x.tolist()
                                           for x in out.next_token_top_logprobs_idx]
        out.next_token_token_ids_logprobs_val = [v.tolist() if torch.is_tensor(v) else v
                                                 for v in out.next_token_token_ids_logprobs_val]
        lps = out.next_token_logprobs.tolist()
        ids = res.next_token_ids.view(4, W)
        for b, req in enumerate(reqs):
            c = int(res.accept_lens[b])
            SchedulerBatchResultProcessor._apply_decode_logprobs(
                None, req=req, i=b, batch=types.SimpleNamespace(spec_algorithm=types.SimpleNamespace(is_none=lambda: False)),
                next_token_id=ids[b, :c].tolist(), next_token_logprobs=lps, logits_output=out)

    (accepts, state, generated, _world), refs, adjusted = run_features(settings, steps=8, batch_extra=extra,
                                                                       on_step=on_step, reqs=reqs)
    assert max(accepts) >= 2
    for b, req in enumerate(reqs):
        got = req.logprob
        n = len(generated[b]) - 1  # generated[b][0] came from prefill
        assert got.output_token_logprobs_idx == generated[b][1:]
        want = [adjusted[b][j].log_softmax(-1) for j in range(1, n + 1)]
        assert torch.allclose(torch.tensor(got.output_token_logprobs_val),
                              torch.stack([w[t] for w, t in zip(want, generated[b][1:])]), atol=1e-5)
        top = [w.topk(3) for w in want]
        assert [list(i) for i in got.output_top_logprobs_idx] == [t.indices.tolist() for t in top]
        assert torch.allclose(torch.tensor(got.output_top_logprobs_val), torch.stack([t.values for t in top]),
                              atol=1e-5)
        if b == 1:
            assert torch.allclose(torch.tensor(got.output_token_ids_logprobs_val),
                                  torch.stack([w[[2, 5]] for w in want]), atol=1e-5)


# ---- sampled steps: chi-square against the exact law, with negative controls --------------------------------------

SAMPLED_BS, TEMP = 1600, 0.7


def sampled_prompt() -> list[int]:
    """A prompt whose second sampled token can repeat the first (a candidate t1 is in the support after ctx + [t1]),
    so counting the node's own path changes the law of the second token."""
    for a in range(V):
        prompt = [4, 4, 2, a]
        ctx = prompt + [target_logits(prompt).argmax().item()]
        support = [t for t in range(V) if target_logits(ctx)[t] > -1]
        if any(target_logits(ctx + [t])[t] > -1 for t in support):
            return prompt
    raise AssertionError("no prompt with a repeatable token")


def exact_law(prompt, kw):
    """{(t1, t2): probability} of the first two sampled tokens after prompt + anchor without speculation: sglang's
    penalizers fed [anchor] (then t1), its logit_bias, the temperature and its min_p filter (tokens below min_p x the
    top probability dropped, the rest renormalised)."""
    anchor = target_logits(prompt).argmax().item()

    def probs(ctx, outputs):
        reqs = make_reqs([prompt], [kw])
        info, _holder = batch_info(reqs)
        for t in outputs:
            info.penalizer_orchestrator.cumulate_output_tokens(torch.tensor([t]))
        logits = target_logits(ctx).view(1, -1)
        info.copy_for_forward().apply_logits_bias(logits)
        p = (logits[0] / TEMP).softmax(-1)
        p = torch.where(p < kw.get("min_p", 0.0) * p.max(), 0.0, p)
        return p / p.sum()

    ctx = prompt + [anchor]
    p1, law = probs(ctx, [anchor]), {}
    for t1 in range(V):
        if p1[t1] > 1e-9:
            p2 = probs(ctx + [t1], [anchor, t1])
            law.update({(t1, t2): float(p1[t1] * p2[t2]) for t2 in range(V) if p2[t2] > 1e-9})
    return law


def chi_square(prompt, kw) -> tuple[float, float]:
    """(statistic, critical value at p = 0.001) of the tree step's first two sampled tokens against the exact law."""
    reqs = make_reqs([prompt] * SAMPLED_BS, [kw] * SAMPLED_BS)
    info, holder = batch_info(reqs)
    refs = [reference(prompt, N_TOKENS)] * SAMPLED_BS  # the first token (prefill's) is the plain argmax here
    _accepts, _state, generated, _world = run(n=4, steps=2, prompts=[prompt] * SAMPLED_BS,
                                              sampling_info=info.copy_for_forward(), refs=refs, reqs=reqs)
    law = exact_law(prompt, kw)
    counts = Counter((g[1], g[2]) for g in generated)
    cells = sorted(set(law) | set(counts))
    stat = sum((counts.get(c, 0) - SAMPLED_BS * law.get(c, 1e-12)) ** 2 / (SAMPLED_BS * law.get(c, 1e-12))
               for c in cells)
    return stat, chi2_critical_001(max(len(law) - 1, 1))


PENALTIES = {"temperature": TEMP, "frequency_penalty": 0.8, "presence_penalty": 0.4, "repetition_penalty": 1.5}
MIN_P = {"temperature": TEMP, "min_p": 0.3}


@pytest.mark.parametrize("kw", [PENALTIES, MIN_P], ids=["penalties", "min_p"])
def test_sampled_steps_follow_the_exact_law(kw):
    stat, critical = chi_square(sampled_prompt(), kw)
    assert stat < critical, f"chi-square {stat:.1f} >= {critical:.1f}"


@pytest.mark.parametrize("kw, wrong", [(PENALTIES, "root-counts"), (MIN_P, "no-min-p")])
def test_sampled_negative_controls_fail(monkeypatch, kw, wrong):
    """The same test rejects a walk whose penalties count the root's tokens only, or that ignores min_p."""
    if wrong == "root-counts":
        monkeypatch.setattr(node_logits, "path_counts", lambda committed, ids, ancestors: committed.unsqueeze(1).repeat(
            1, ids.shape[1], 1))
    else:
        monkeypatch.setattr(node_logits, "min_p_filtered", lambda logits, temperature, min_p: logits)
    stat, critical = chi_square(sampled_prompt(), kw)
    assert stat > critical, f"chi-square {stat:.1f} <= {critical:.1f}: the test cannot tell the wrong walk"
