"""The tree decode step end to end on CPU: real flashtree tree code, sglang's real EAGLE tree kernel (Triton
interpreter), real Markov head / draft-input / batch-result classes; stand-ins only for the draft forward and the
target verify (tiny deterministic models that keep the real contracts: shapes, dtypes, KV slots written per node)."""

from __future__ import annotations

import types
from collections import Counter

import pytest
import torch

import sglang_cpu
from flashtree.patches import adapters
from flashtree.patches.adapters.base import Verified, Window
from flashtree.patches.decode import create_state, tree_step
from flashtree.patches.toggles import TreeToggles
from flashtree.tree.encode import child_links

V, GAMMA, BS, H = 32, 5, 3, 2
W = GAMMA + 1
MAX_LEN = 160


def target_next(context: list[int]) -> int:
    """The stand-in target's greedy next token: depends on the whole context (a wrong tree mask shows)."""
    return (7 * sum(context) + 3 * len(context) + 1) % V


def reference(prompt: list[int], n: int) -> list[int]:
    seq = list(prompt)
    while len(seq) < len(prompt) + n:
        seq.append(target_next(seq))
    return seq


class StandIns:
    """Target KV pool, draft KV pool and the two model forwards, over a real req_to_token table."""

    def __init__(self, prompts, refs):
        self.refs = refs
        slots = torch.randperm(BS * MAX_LEN, generator=torch.Generator().manual_seed(1)) + 1  # slot 0 = dummy
        self.req_to_token = torch.zeros((BS + 1, MAX_LEN), dtype=torch.int64)
        self.rows = torch.tensor([2, 0, 3][:BS])
        self.req_to_token[self.rows] = slots.view(BS, MAX_LEN)
        self.kv = torch.full((BS * MAX_LEN + 1, 2), -1, dtype=torch.int64)  # target KV: (position, token) per slot
        self.draft_kv = torch.full((BS * MAX_LEN + 1, H), -1.0)
        for b, p in enumerate(prompts):
            s = self.req_to_token[self.rows[b], : len(p)]
            self.kv[s, 0] = torch.arange(len(p))
            self.kv[s, 1] = torch.tensor(p)
        self.gen = torch.Generator().manual_seed(0)

    def context(self, b: int, seq_len: int) -> list[int]:
        slots = self.req_to_token[self.rows[b], :seq_len]
        assert torch.equal(self.kv[slots, 0], torch.arange(seq_len)), "req_to_token prefix is not sequential"
        return self.kv[slots, 1].tolist()


class StandInAdapter:
    """The release's real adapter with the two model forwards (and the window) replaced."""

    def __init__(self, real, world: StandIns):
        self.real, self.world = real, world
        self.release = real.release

    def __getattr__(self, name):
        return getattr(self.real, name)

    def alloc_window(self, worker, batch, bs, draft_input):
        # alloc_verify_window's contract: slots req_to_token[req, seq_len : seq_len + W], positions seq_len + j.
        cols = batch.seq_lens.view(-1, 1) + torch.arange(W)
        loc = self.world.req_to_token[batch.req_pool_indices.view(-1, 1), cols]
        return Window(cols, loc.reshape(-1), loc, None)

    def draft_forward(self, worker, batch, draft_input, window, bs):
        # A draft that knows the right block but puts only 60% on each right token (the rest on a per-depth decoy).
        anchor = draft_input.bonus_tokens.view(-1)
        base = torch.full((bs, GAMMA, V), -30.0)
        for b in range(bs):
            L = int(batch.seq_lens[b])
            right = self.world.refs[b][L + 1 : L + 1 + GAMMA]
            for j, tok in enumerate(right):
                decoy = (tok + 1 + j) % V
                base[b, j, tok] = 0.0
                base[b, j, decoy] = -0.4055  # log(0.4/0.6)
        return anchor, base, None

    def target_verify(self, worker, batch, draft_input, window, ids_2d, positions_2d, custom_mask):
        world = self.world
        bs = ids_2d.shape[0]
        # A target writes KV for every verify token at its window slot.
        world.kv[window.cache_loc, 0] = positions_2d.reshape(-1)
        world.kv[window.cache_loc, 1] = ids_2d.reshape(-1)
        logits = torch.full((bs, W, V), -10.0)
        offset = 0
        for b in range(bs):
            L = int(batch.seq_lens[b])
            rows = custom_mask[offset : offset + W * (L + W)].view(W, L + W)
            offset += W * (L + W)
            assert rows[:, :L].all(), "prefix must be visible to every tree node"
            prefix = world.context(b, L)
            for i in range(W):
                seen = rows[i, L:].nonzero().flatten()
                tokens = ids_2d[b, seen]
                assert positions_2d[b, i] == L + len(seen) - 1, "position must be prefix + depth"
                logits[b, i, target_next(prefix + tokens.tolist())] = 10.0
        hidden = torch.stack([positions_2d.reshape(-1).float(), ids_2d.reshape(-1).float()], dim=1)
        out = types.SimpleNamespace(next_token_logits=logits.view(bs * W, V), hidden_states=hidden, customized_info=None)
        return Verified(out, out.next_token_logits, hidden, False)

    def req_to_token(self, worker):
        return self.world.req_to_token

    def inject_committed(self, worker, batch, hidden, cache_loc_2d, positions_2d, commit_lens):
        for b in range(cache_loc_2d.shape[0]):
            c = int(commit_lens[b])
            self.world.draft_kv[cache_loc_2d[b, :c]] = hidden.view(-1, W, H)[b, :c]

    def publish_req_to_token_write(self, worker):
        pass


def real_markov_head():
    from sglang.srt.models.dspark import VanillaMarkov  # 0.5.17/0.5.20: sample_block; 0.5.23: init_state/step_bias

    head = VanillaMarkov(vocab_size=V, markov_rank=4)
    torch.nn.init.zeros_(head.markov_w2.weight)  # no bigram bias: draws follow the base logits
    return head


@pytest.fixture(scope="module")
def tree_kernels():
    sglang_cpu.force_triton_tree_kernels()


def run(n: int, steps: int):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative.dspark_components.dspark_draft import make_next_draft_input

    real = adapters.select_adapter()
    prompts = [[3, 1, 4, 1, 5], [9, 2, 6], [5, 3, 5, 8, 9, 7, 9]][:BS]
    refs = [reference(p, MAX_LEN - len(p) - 2 * W) for p in prompts]
    world = StandIns(prompts, refs)
    adapter = StandInAdapter(real, world)
    worker = types.SimpleNamespace(
        verify_num_draft_tokens=W,
        device="cpu",
        model_runner=types.SimpleNamespace(page_size=1),
        _proposer=types.SimpleNamespace(draft_model=types.SimpleNamespace(markov_head=real_markov_head())),
    )
    state = create_state(adapter, TreeToggles(tree_n=n, seed=5), worker)
    seq_lens = torch.tensor([len(p) for p in prompts])
    bonus = torch.tensor([r[len(p)] for r, p in zip(refs, prompts)])
    draft_input = make_next_draft_input(bonus_tokens=bonus, new_seq_lens=seq_lens)
    published, accepts = [], Counter()
    for _ in range(steps):
        if int(seq_lens.max()) + 2 * W >= MAX_LEN - 2 * W:
            break
        batch = types.SimpleNamespace(
            seq_lens=seq_lens.clone(),
            seq_lens_cpu=seq_lens.clone(),
            seq_lens_sum=int(seq_lens.sum()),
            req_pool_indices=world.rows.clone(),
            forward_mode=ForwardMode.DECODE,
            sampling_info=None,
            spec_info=draft_input,
            has_grammar=False,
            return_logprob=False,
        )
        res = tree_step(state, worker, batch, published.append)
        commit = res.accept_lens.to(torch.int64)
        assert res.accept_lens.dtype == torch.int32 and res.next_token_ids.shape == (BS * W,)
        assert torch.equal(res.new_seq_lens, seq_lens + commit)
        assert torch.equal(published[-1], res.new_seq_lens)
        out = res.next_token_ids.view(BS, W)
        for b in range(BS):
            L, c = int(seq_lens[b]), int(commit[b])
            # Committed tokens: the anchor's successors, exactly the target's sequential greedy decode.
            assert out[b, :c].tolist() == refs[b][L + 1 : L + 1 + c]
            assert int(res.next_draft_input.bonus_tokens[b]) == refs[b][L + c]
            # req_to_token after commit: positions 0 .. L + c - 1 hold the sequential KV (anchor + accepted drafts).
            assert world.context(b, L + c) == refs[b][: L + c]
            # The draft context was injected for the committed tokens only, at their sequential positions.
            slots = world.req_to_token[world.rows[b], L : L + c]
            assert world.draft_kv[slots, 0].tolist() == list(range(L, L + c))
            assert world.draft_kv[slots, 1].tolist() == refs[b][L : L + c]
            accepts[c - 1] += 1
        stats = res.logits_output.customized_info["flashtree"]
        assert [s[0] for s in stats] == [n] * BS and all(1 <= s[1] <= n and 1 <= s[2] <= W - 1 for s in stats)
        assert [s[3] for s in stats] == (commit - 1).tolist()
        seq_lens = res.new_seq_lens
        draft_input = res.next_draft_input
    return accepts, state


@pytest.mark.usefixtures("tree_kernels")
def test_tree_step_matches_sequential_greedy_decode(monkeypatch):
    """Drafts accepted deep, through non-first children, and rejected at every depth; every commit exact.
    (Seeded; seen on 0.5.20: accept lengths 0..5 -> 5, 34, 54, 18, 4, 5 request-steps over 40 steps.)"""
    import flashtree.patches.decode as decode

    seen = {"non_first_deep": 0}
    real_walk = decode.walk

    def walk(state, tree, logits, sampling_info):
        result = real_walk(state, tree, logits, sampling_info)
        first_child, _ = child_links(tree)
        path = result.path
        for b in range(tree.batch_size):
            nodes = [int(x) for x in path[b] if x >= 0]
            through_other = any(first_child[b, p] != c for p, c in zip(nodes, nodes[1:]))
            if through_other and len(nodes) - 1 >= 2:
                seen["non_first_deep"] += 1
        return result

    monkeypatch.setattr(decode, "walk", walk)
    accepts, state = run(n=4, steps=40)
    assert state.steps > 0
    assert all(accepts[d] > 0 for d in range(GAMMA)), f"not rejected at every depth: {sorted(accepts.items())}"
    assert sum(v for d, v in accepts.items() if d >= 2) > 0, sorted(accepts.items())
    assert seen["non_first_deep"] > 0, "no acceptance of depth >= 2 through a branch other than the first child"


@pytest.mark.usefixtures("tree_kernels")
def test_flashtree_walk_agrees_with_sglang_tree_walk():
    """flashtree's greedy walk and sglang's verify_tree_greedy_func (Triton) accept the same path on a vote tree."""
    from sglang.srt.speculative import eagle_utils

    from flashtree.tree import build_vote_tree, to_eagle, verify_greedy

    g = torch.Generator().manual_seed(3)
    cands = torch.randint(0, 3, (2, 6, GAMMA), generator=g)
    tree = build_vote_tree(cands, W)
    target = torch.randint(0, 3, (2, W), generator=g)
    mine = verify_greedy(tree, target)
    enc = to_eagle(tree)
    anchor = torch.tensor([7, 8])
    seq_lens = torch.tensor([4, 9])
    out = eagle_utils.build_tree_kernel_efficient(
        anchor, enc.parent_list, enc.top_scores_index, enc.draft_tokens, seq_lens, int(seq_lens.sum()),
        enc.topk, enc.spec_steps, enc.num_verify_tokens,
    )
    _mask, _pos, r_index, r_next, r_sib, flat = out
    accept_index = torch.full((2, GAMMA + 1), -1, dtype=torch.int32)
    accept_len = torch.zeros(2, dtype=torch.int32)
    predict = torch.zeros(2 * W, dtype=torch.int32)
    eagle_utils.verify_tree_greedy_func(
        predicts=predict, accept_index=accept_index, accept_token_num=accept_len,
        candidates=flat.view(2, W), retrieve_index=r_index, retrieve_next_token=r_next,
        retrieve_next_sibling=r_sib, target_predict=target,
    )
    assert accept_len.tolist() == mine.accept_len.tolist()
    for b in range(2):
        want = [b * W + int(x) for x in mine.path[b] if x >= 0]
        assert [int(x) for x in accept_index[b] if x >= 0] == want


@pytest.mark.usefixtures("tree_kernels")
def test_n1_chain_equals_dspark_chain_accept(monkeypatch):
    """N = 1: the tree is the drafted chain, and each step commits what DSPARK's own chain accept commits."""
    import flashtree.patches.decode as decode
    from sglang.srt.speculative.dspark_components.dspark_verify import accept_draft_tokens

    checked = []
    real_walk = decode.walk

    def walk(state, tree, logits, sampling_info):
        result = real_walk(state, tree, logits, sampling_info)
        bs = tree.batch_size
        assert torch.equal(tree.parents, torch.arange(W - 1).expand(bs, W - 1)), "N = 1 must give the chain"
        anchor = torch.zeros(bs, 1, dtype=torch.int64)  # the anchor is not compared by the chain accept
        block = types.SimpleNamespace(
            draft_tokens=tree.tokens, corrected_logits=None,
            greedy_mask=torch.ones(bs, dtype=torch.bool), temperatures=torch.ones(bs),
        )
        correct_len, bonus, _cap = accept_draft_tokens(
            candidates=torch.cat([anchor, tree.tokens], dim=1), target_logits=logits.view(bs * W, V),
            draft_block=block, sampling_info=None, draft_input=None, gamma=GAMMA, verify_num_draft_tokens=W,
        )
        assert correct_len.tolist() == result.accept_len.tolist()
        assert bonus.tolist() == result.bonus.tolist()
        checked.append(bs)
        return result

    monkeypatch.setattr(decode, "walk", walk)
    accepts, state = run(n=1, steps=12)
    assert len(checked) == state.steps > 0
    assert sum(accepts.values()) == BS * state.steps
