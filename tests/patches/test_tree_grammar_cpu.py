"""Grammar-constrained requests on the tree step with sglang's real xgrammar backend (a regex over a 32-token raw
vocabulary): every node's row is masked by the grammar state of its own path, so the commits equal the sequential
greedy decode under the same grammar token for token, in a batch mixed with unconstrained requests."""

from __future__ import annotations

import types

import pytest
import torch

import sglang_cpu
from flashtree.patches import grammar_masks
from test_decode_cpu import MAX_LEN, V, W, reference, run, target_logits
from test_node_logits_cpu import batch_info, make_reqs, sampling_context  # noqa: F401 (an autouse fixture)

N_TOKENS = MAX_LEN - 2 * W
VOCAB = [chr(ord("a") + i) for i in range(26)] + [str(d) for d in range(5)] + ["</s>"]  # V = 32, id 31 = stop
REGEX = "([a-m]+[0-4])+"  # a token from n-z or the stop token is never allowed
PROMPTS = [[3, 1, 4, 1, 5], [9, 2, 6], [5, 3, 5, 8, 9, 7, 9]]


class RawTokenizer:
    """What XGrammarGrammarBackend asks of a tokenizer: xgrammar's TokenizerInfo (and no override stop tokens)."""

    def init_xgrammar(self):
        import xgrammar

        return xgrammar.TokenizerInfo(VOCAB, vocab_type=xgrammar.VocabType.RAW, vocab_size=V, stop_token_ids=[31]), None


@pytest.fixture(scope="module")
def grammar_backend():
    import xgrammar
    from sglang.srt.constrained import xgrammar_backend

    sglang_cpu.force_triton_tree_kernels()
    with pytest.MonkeyPatch.context() as mp:
        if hasattr(xgrammar_backend, "_allocate_token_bitmask"):  # 0.5.17 pins its masks: no pinned memory on CPU
            mp.setattr(xgrammar_backend, "_allocate_token_bitmask", lambda vocab_size, batch_size: torch.full(
                xgrammar.get_bitmask_shape(batch_size, vocab_size), -1, dtype=xgrammar.bitmask_dtype))
        backend = xgrammar_backend.XGrammarGrammarBackend(RawTokenizer(), vocab_size=V)
        grammar = backend.dispatch_regex(REGEX)
        try:
            grammar.apply_vocab_mask(torch.zeros(1, V), grammar.allocate_vocab_mask(V, 1, "cpu"))
        except RuntimeError:  # 0.5.17 applies masks with its CUDA / NPU kernels only: xgrammar's own CPU one here
            mp.setattr(xgrammar_backend.XGrammarGrammar, "apply_vocab_mask",
                       lambda self, logits, vocab_mask: xgrammar.apply_token_bitmask_inplace(logits, vocab_mask))
        yield backend


def masked_decode(backend, prompt, n: int) -> list[int]:
    """The greedy decode without speculation under the regex: sglang's grammar object fills the step's mask, the
    masked argmax is taken, the grammar accepts it."""
    grammar = backend.dispatch_regex(REGEX)
    seq = list(prompt)
    mask = grammar.allocate_vocab_mask(vocab_size=V, batch_size=1, device="cpu")
    for _ in range(n):
        if grammar.is_terminated():
            break
        grammar.fill_vocab_mask(mask, 0)
        logits = target_logits(seq).view(1, -1)
        grammar.apply_vocab_mask(logits, grammar.move_vocab_mask(mask, "cpu"))
        seq.append(int(logits.argmax()))
        grammar.accept_token(seq[-1])
    return seq


def grammar_reqs(backend, prompts, constrained):
    """Real greedy Req objects, the constrained ones with a compiled grammar, and their forward SamplingBatchInfo."""
    reqs = make_reqs(prompts, [{"temperature": 0.0}] * len(prompts))
    for req, c in zip(reqs, constrained):
        req.grammar = backend.dispatch_regex(REGEX) if c else None
    info, _holder = batch_info(reqs)
    return reqs, info.copy_for_forward()


def test_grammar_requests_commit_the_constrained_greedy_decode(grammar_backend):
    refs = [masked_decode(grammar_backend, PROMPTS[0], N_TOKENS), masked_decode(grammar_backend, PROMPTS[1], N_TOKENS),
            reference(PROMPTS[2], N_TOKENS)]
    assert all(set(r[len(p):]) <= set(range(13)) | set(range(26, 31)) for r, p in zip(refs[:2], PROMPTS))
    assert [refs[b] != reference(PROMPTS[b], N_TOKENS) for b in range(3)] == [True, True, False]
    reqs, info = grammar_reqs(grammar_backend, PROMPTS, [True, True, False])
    for req, ref, prompt in zip(reqs, refs, PROMPTS):
        if req.grammar is not None:
            req.grammar.accept_token(ref[len(prompt)])  # the prefill's token

    def advance(res):  # sglang's result processor: each request's grammar over its committed tokens
        out = res.next_token_ids.view(len(reqs), W)
        for b, req in enumerate(reqs):
            for tok in out[b, : int(res.accept_lens[b])].tolist():
                if req.grammar is not None:
                    req.grammar.accept_token(tok)

    accepts, state, generated, _world = run(n=4, steps=12, prompts=PROMPTS, refs=refs, reqs=reqs, on_step=advance,
                                            sampling_info=info, batch_extra={"has_grammar": True})
    assert state.steps == 12 and state.fallbacks == {} and max(accepts) >= 2
    assert all(g == r[len(p):][: len(g)] for g, r, p in zip(generated, refs, PROMPTS))


def test_verify_is_launched_before_the_grammar_wait(grammar_backend, monkeypatch):
    """A constrained step's one host wait (the drafted nodes its grammar walk needs) comes after the target verify's
    launch, and the nodes' copy is queued before that launch: the wait covers the draft only, and the device runs the
    verify while the host walks the grammar (the unmasked verify, masks applied before the walk)."""
    from test_decode_cpu import StandInAdapter

    calls = []

    def spy(cls, name):
        original = getattr(cls, name)

        def wrapped(*args, **kwargs):
            calls.append(name)
            return original(*args, **kwargs)

        monkeypatch.setattr(cls, name, wrapped)

    spy(grammar_masks.TreeGrammar, "start")
    spy(StandInAdapter, "target_verify")
    spy(grammar_masks.TreeGrammar, "walk")  # the barrier, then the wait for the nodes' copy, then the walk
    refs = [masked_decode(grammar_backend, PROMPTS[0], N_TOKENS), reference(PROMPTS[2], N_TOKENS)]
    reqs, info = grammar_reqs(grammar_backend, [PROMPTS[0], PROMPTS[2]], [True, False])
    reqs[0].grammar.accept_token(refs[0][len(PROMPTS[0])])

    def advance(res):
        for tok in res.next_token_ids.view(2, W)[0, : int(res.accept_lens[0])].tolist():
            reqs[0].grammar.accept_token(tok)

    run(n=4, steps=3, prompts=[PROMPTS[0], PROMPTS[2]], refs=refs, reqs=reqs, on_step=advance, sampling_info=info,
        batch_extra={"has_grammar": True})
    assert calls == ["start", "target_verify", "walk"] * 3


def test_unmasked_tree_breaks_the_grammar(grammar_backend, monkeypatch):
    """Negative control: the same run with the masks dropped commits tokens the grammar forbids."""
    from flashtree.patches import grammar_masks

    monkeypatch.setattr(grammar_masks.TreeGrammar, "apply", lambda *args: None)
    refs = [masked_decode(grammar_backend, PROMPTS[0], N_TOKENS)]
    reqs, info = grammar_reqs(grammar_backend, PROMPTS[:1], [True])
    reqs[0].grammar.accept_token(refs[0][len(PROMPTS[0])])
    with pytest.raises(AssertionError):
        run(n=4, steps=6, prompts=PROMPTS[:1], refs=refs, reqs=reqs, sampling_info=info,
            batch_extra={"has_grammar": True})


def random_trees(bs: int, w: int, seed: int):
    """Parents-first random trees (node i's parent among the 4 before it) with tokens from the regex's alphabet and
    beyond, and sglang's child / sibling links of the same trees."""
    g = torch.Generator().manual_seed(seed)
    parents = torch.full((bs, w), -1, dtype=torch.long)
    for i in range(1, w):
        parents[:, i] = torch.randint(max(0, i - 4), i, (bs,), generator=g)
    parents[:, w - 3:] = grammar_masks.INVALID  # padding
    tokens = torch.randint(0, V, (bs, w), generator=g)
    first, sibling = torch.full((bs, w), -1, dtype=torch.long), torch.full((bs, w), -1, dtype=torch.long)
    for b in range(bs):
        last = {}
        for i in range(1, w):
            p = int(parents[b, i])
            if p < 0:
                continue
            if p in last:
                sibling[b, last[p]] = i
            else:
                first[b, p] = i
            last[p] = i
    return parents, tokens, first, sibling


class BoolMasks:
    """A grammar object with outlines' mask layout (one bool per token, True where forbidden) over an xgrammar one."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def allocate_vocab_mask(self, vocab_size, batch_size, device):
        return torch.zeros(batch_size, vocab_size, dtype=torch.bool)

    def fill_vocab_mask(self, vocab_mask, idx):
        words = self.inner.allocate_vocab_mask(vocab_size=V, batch_size=1, device="cpu")
        self.inner.fill_vocab_mask(words, 0)
        allowed = (words[0].view(-1, 1) >> torch.arange(32)) & 1
        vocab_mask[idx] = allowed.flatten()[:V] == 0


@pytest.mark.parametrize("layout", ["bitmask", "bool"])
def test_tree_walk_fills_the_rows_sglang_fills(grammar_backend, layout):
    """flashtree's walk of each constrained request's tree gives every node the row sglang's own builder
    (`generate_token_bitmask`, DSPARK's) gives it, and leaves each grammar in its start state."""
    from sglang.srt.speculative import spec_utils

    bs, w = 6, 24
    parents, tokens, first, sibling = random_trees(bs, w, seed=5)
    tokens[:, 1:8] = torch.tensor([0, 3, 27, 5, 1, 26, 2])  # some allowed paths for sure ("ad1fb0c")
    grammars = [grammar_backend.dispatch_regex(REGEX) for _ in range(bs)]
    for b, grammar in enumerate(grammars):
        for tok in [0, 27, 1][: b % 3]:  # different start states
            grammar.accept_token(tok)
    reqs = [types.SimpleNamespace(grammar=g) for g in grammars]
    want, _ = spec_utils.generate_token_bitmask(reqs, first, sibling, tokens, V)
    for b, grammar in enumerate(grammars):
        wrapped = grammar if layout == "bitmask" else BoolMasks(grammar)
        rows = grammar_masks.MaskBuffer().take(wrapped, w, V)
        grammar_masks.walk_tree(wrapped, parents[b].numpy(), tokens[b].numpy(), rows, V)
        ref = want[b * w:(b + 1) * w]
        if layout == "bool":
            ref = ((ref.view(-1, 1) >> torch.arange(32)) & 1).view(w, -1)[:, :V] == 0
        assert torch.equal(rows, ref), b
        again, _ = spec_utils.generate_token_bitmask(reqs[b:b + 1], first[b:b + 1], sibling[b:b + 1], tokens[b:b + 1], V)
        assert torch.equal(again, want[b * w:(b + 1) * w])  # the walk rolled its grammar back
    filled = (want != -1).any(dim=1).view(bs, w)
    assert filled[:, 0].all() and 2 < int(filled[:, 1:].sum()) < bs * (w - 1)  # deep paths and forbidden nodes


class FakeFlag:
    """host_flag.HostFlag's contract on the CPU: tickets waited for and released, in a shared log."""

    def __init__(self, log):
        self.log, self.ticket = log, 0

    def wait(self, device):
        self.ticket += 1
        self.log.append(("wait", self.ticket))
        return self.ticket

    def release(self, ticket):
        self.log.append(("release", ticket))


def tree_grammar(backend, bs: int, w: int, seed: int, log=None):
    """A step's TreeGrammar over random trees, every request constrained (each grammar a few tokens in), its
    grammars' walks logged."""
    import numpy as np

    parents, tokens, _first, _sibling = random_trees(bs, w, seed)
    tokens[:, 1:8] = torch.tensor([0, 3, 27, 5, 1, 26, 2])
    valid = parents[:, 1:] != grammar_masks.INVALID
    tree = types.SimpleNamespace(valid=valid, parents=torch.where(valid, parents[:, 1:], 0))
    reqs = [types.SimpleNamespace(grammar=backend.dispatch_regex(REGEX)) for _ in range(bs)]
    for b, req in enumerate(reqs):
        for tok in [0, 27, 1][: b % 3]:
            req.grammar.accept_token(tok)
    grammar = grammar_masks.TreeGrammar.start(reqs, tree, tokens)
    assert np.array_equal(grammar.nodes.wait()[1].numpy(), tokens.numpy())
    if log is not None:
        walk = grammar.walk

        def logged(*args):
            log.append("grammar walk")
            return walk(*args)

        grammar.walk = logged
    return grammar


def test_deferred_walk_fills_at_finish_what_the_thread_fills_at_apply(grammar_backend):
    """FLASHTREE_GRAMMAR_OVERLAP: `apply` queues the flag's wait and walks nothing; `finish` walks (the barrier
    first) into the rows the masks' copy read, then releases the ticket; the rows are the immediate walk's."""
    bs, w = 4, 16
    info = types.SimpleNamespace(vocab_size=V, grammar_mask=None)
    now = tree_grammar(grammar_backend, bs, w, seed=3)
    now_buffer = grammar_masks.MaskBuffer()
    now.apply(torch.zeros(bs * w, V), now_buffer, info)
    log = []
    later = tree_grammar(grammar_backend, bs, w, seed=3, log=log)
    buffer = grammar_masks.MaskBuffer()
    logits = torch.zeros(bs * w, V)
    later.apply(logits, buffer, info, barrier=lambda: log.append("barrier"), flag=FakeFlag(log))
    assert log == [("wait", 1)]
    later.finish()
    assert log == [("wait", 1), "grammar walk", "barrier", ("release", 1)]
    assert torch.equal(buffer.rows[: bs * w], now_buffer.rows[: bs * w])
    later.finish()  # owed once
    assert len(log) == 4


def test_deferred_walk_releases_the_ticket_when_it_fails(grammar_backend):
    log = []
    grammar = tree_grammar(grammar_backend, 2, 16, seed=4)
    info = types.SimpleNamespace(vocab_size=V, grammar_mask=None)

    def barrier():
        raise RuntimeError("grammar barrier failed")

    grammar.apply(torch.zeros(32, V), grammar_masks.MaskBuffer(), info, barrier=barrier, flag=FakeFlag(log))
    with pytest.raises(RuntimeError, match="barrier failed"):
        grammar.finish()
    assert log == [("wait", 1), ("release", 1)]


def test_a_shapes_first_grammar_step_walks_before_the_wait(monkeypatch):
    """The flag serves a (logits rows, constrained requests) shape only from its second grammar step on: the first
    loads every kernel the step launches behind the wait; without a flag (lazy loading, say) none waits."""
    from flashtree.patches import decode, host_flag

    made = []
    monkeypatch.setattr(host_flag, "host_flag", lambda device: made.append(device) or "flag")
    run = types.SimpleNamespace(plan=types.SimpleNamespace(toggles=types.SimpleNamespace(grammar_overlap=True)),
                                grammar_flag=None, grammar_shapes=set())
    logits = types.SimpleNamespace(is_cuda=True, shape=(64, V), device="cuda:0")
    wide = types.SimpleNamespace(is_cuda=True, shape=(128, V), device="cuda:0")
    picks = [decode.grammar_flag(run, x, c) for x, c in [(logits, 3), (logits, 3), (logits, 4), (wide, 3), (logits, 4)]]
    assert picks == [None, "flag", None, None, "flag"] and len(made) == 1
    run.plan.toggles.grammar_overlap = False
    assert decode.grammar_flag(run, logits, 3) is None
    off = types.SimpleNamespace(plan=run.plan, grammar_flag=False, grammar_shapes={(64, 3)})
    off.plan.toggles.grammar_overlap = True
    assert decode.grammar_flag(off, logits, 3) is None and len(made) == 1


def deferred_step(grammar_backend, monkeypatch, fail_at: str):
    """One constrained tree step with a FakeFlag, stopped by an exception at `fail_at` (a logged call); returns the
    step's log of those calls, the flag's tickets and the grammar walk."""
    from flashtree.patches import decode
    from test_decode_cpu import StandInAdapter

    log = []
    flag = FakeFlag(log)
    monkeypatch.setattr(decode, "grammar_flag", lambda run, logits, constrained: flag)
    walk = grammar_masks.TreeGrammar.walk

    def logged_walk(self, *args):
        log.append("grammar walk")
        return walk(self, *args)

    monkeypatch.setattr(grammar_masks.TreeGrammar, "walk", logged_walk)
    def spy(owner, name, label):
        original = getattr(owner, name)

        def spied(*args, **kwargs):
            log.append(label)
            if label == fail_at:
                raise RuntimeError(f"stopped at {label}")
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, spied)

    spy(StandInAdapter, "target_verify", "target_verify")
    spy(StandInAdapter, "inject_committed", "inject_committed")
    spy(decode, "DeferredRows", "output")  # the step's statistics rows: after the commit
    refs = [masked_decode(grammar_backend, PROMPTS[0], N_TOKENS), reference(PROMPTS[2], N_TOKENS)]
    reqs, info = grammar_reqs(grammar_backend, [PROMPTS[0], PROMPTS[2]], [True, False])
    reqs[0].grammar.accept_token(refs[0][len(PROMPTS[0])])
    with pytest.raises(RuntimeError, match=f"stopped at {fail_at}"):
        run(n=4, steps=1, prompts=[PROMPTS[0], PROMPTS[2]], refs=refs, reqs=reqs, sampling_info=info,
            batch_extra={"has_grammar": True})
    return log


def test_deferred_walk_runs_after_the_step_is_queued(grammar_backend, monkeypatch):
    """The wait is queued after the verify's launch, the walk and commit (the draft context's injection) behind it,
    and only then does the thread walk the grammar and release the ticket, before the step's output."""
    log = deferred_step(grammar_backend, monkeypatch, "output")
    assert log == ["target_verify", ("wait", 1), "inject_committed", "grammar walk", ("release", 1), "output"]


def test_a_failing_step_still_releases_its_ticket(grammar_backend, monkeypatch):
    """An exception between the wait and the walk (here the commit's injection) still walks and releases: the
    stream never waits for a ticket nobody will release."""
    log = deferred_step(grammar_backend, monkeypatch, "inject_committed")
    assert log == ["target_verify", ("wait", 1), "inject_committed", "grammar walk", ("release", 1)]

