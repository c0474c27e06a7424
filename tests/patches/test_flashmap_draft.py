"""FlashMap drafts on the tree path: the N candidates are N noise draws of flashmap's own sglang model, in one forward.

sglang 0.5.20 with flashmap 0.1.0 installed (scripts/setup_sglang.sh): a tiny random `flashmap.sglang.model.
FlashMapDraftModel` (the real class, loaded through its own load_weights / attach_shared_modules) runs its real
forward, Triton kernels under the interpreter. Only its CUDA-only pieces stand aside on CPU: FlashAttention's paged
KV-cache attention (a torch reference of the same contract) and its tile scheduler, the fused anchor K/V write
(skipped: the pool's random content is the context) and sglang's forward-context pool lookups. Other releases: the
FlashMap path refuses the worker with a clear message.
"""

from __future__ import annotations

import importlib
import types

import pytest
import torch

from flashtree.patches import adapters, decode, flashmap_draft, plan
from flashtree.patches.toggles import ToggleError, TreeToggles
from flashtree.tree import build_vote_tree

V, TARGET_H, K, N, BS = 64, 32, 4, 6, 2
W = K + 1
SLOTS = 160


@pytest.fixture(scope="module")
def fm():
    """flashmap's sglang model module; its import hooks on DSparkWorkerV2 are undone afterwards."""
    from flashtree.patches.adapters import installed_version

    if installed_version() != "0.5.20":
        pytest.skip("flashmap 0.1.0's sglang model runs on sglang 0.5.20 only")
    pytest.importorskip("flashmap", reason="scripts/setup_sglang.sh 0.5.20 installs flashmap 0.1.0")
    from sglang.srt.speculative.dspark_components.dspark_worker_v2 import DSparkWorkerV2

    before = dict(vars(DSparkWorkerV2))
    module = importlib.import_module("flashmap.sglang.model")
    yield module
    for name in set(vars(DSparkWorkerV2)) - set(before):
        delattr(DSparkWorkerV2, name)
    for name, value in before.items():
        if vars(DSparkWorkerV2).get(name) is not value:
            setattr(DSparkWorkerV2, name, value)


def paged_attention(q, k_cache, v_cache, cache_seqlens, page_table, causal, scheduler_metadata, **kwargs):
    """flash_attn_with_kvcache's contract as flashmap calls it: q (bs, Q, H, D) onto each request's first
    cache_seqlens[b] pool rows listed by page_table[b] (page size 1), no causal mask."""
    assert not causal and not kwargs
    out = torch.empty_like(q)
    for b in range(q.shape[0]):
        rows = page_table[b, : int(cache_seqlens[b])].long()
        k, v = k_cache[rows, 0].float(), v_cache[rows, 0].float()
        scores = torch.einsum("qhd,shd->hqs", q[b].float(), k) * q.shape[-1] ** -0.5
        out[b] = torch.einsum("hqs,shd->qhd", scores.softmax(-1), v).to(q.dtype)
    return out


class Pool:
    """The draft KV pool: per layer (slots, heads, head_dim) bf16, random content."""

    def __init__(self, layers: int, heads: int, head_dim: int):
        g = torch.Generator().manual_seed(3)
        self.k = [torch.randn(SLOTS, heads, head_dim, generator=g).bfloat16() for _ in range(layers)]
        self.v = [torch.randn(SLOTS, heads, head_dim, generator=g).bfloat16() for _ in range(layers)]

    def get_key_buffer(self, layer):
        return self.k[layer]

    def get_value_buffer(self, layer):
        return self.v[layer]


def tiny_model(fm, monkeypatch, draft_vocab: int = 0):
    import flashmap

    monkeypatch.setenv("FLASHMAP_COMPILE", "0")  # eager: torch.compile on CPU adds minutes and nothing to the contract
    for name in ("FLASHMAP_TREE_N", "FLASHMAP_NUM_STEPS", "FLASHMAP_DRAFT_VOCAB"):
        monkeypatch.delenv(name, raising=False)
    config = flashmap.FlashMapConfig(
        target_hidden_size=TARGET_H, vocab_size=V, target_layer_ids=[0, 1], block_size=K, hidden_size=32,
        num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, cond_dim=32, time_embed_dim=32,
        draft_vocab_size=draft_vocab,
    )  # fmt: skip
    torch.manual_seed(0)
    model = fm.FlashMapDraftModel(config).bfloat16().eval()
    weights = [(n, t.detach().clone()) for n, t in [*model.named_parameters(), *model.named_buffers()]]
    weights = [(n, t) for n, t in weights if not n.startswith("markov_head.")]
    if draft_vocab:
        weights.append(("ids", torch.randperm(V, generator=torch.Generator().manual_seed(1))))  # frequency ranking
    model.load_weights(weights)
    model.attach_shared_modules(
        embed_tokens=torch.nn.Embedding(V, TARGET_H).bfloat16(), lm_head=torch.nn.Linear(TARGET_H, V).bfloat16()
    )
    # CPU stand-ins for the CUDA-only pieces of the draft forward (see the module docstring).
    pool = Pool(model.num_stages, model.num_heads, model.head_dim)
    req_to_token = torch.randperm(SLOTS - 1, generator=torch.Generator().manual_seed(2)).add(1)[: 3 * 48]
    monkeypatch.setattr(fm, "get_token_to_kv_pool", lambda: pool)
    table = types.SimpleNamespace(req_to_token=req_to_token.view(3, 48).int())
    monkeypatch.setattr(fm, "get_req_to_token_pool", lambda: table)
    monkeypatch.setattr(fm, "get_scheduler_metadata", lambda **kwargs: torch.zeros(1, dtype=torch.int32))
    monkeypatch.setattr(fm, "flash_attn_with_kvcache", paged_attention)
    monkeypatch.setattr(model, "_fused_write_args", lambda pool: None)
    monkeypatch.setattr(model, "_kv_write", lambda *args, **kwargs: None)
    return model


def make_worker(model, verify_tokens: int = W):
    return types.SimpleNamespace(
        device="cpu",
        verify_num_draft_tokens=verify_tokens,
        model_runner=types.SimpleNamespace(page_size=1),
        _proposer=types.SimpleNamespace(draft_model=model),
    )


def start_worker(adapter, worker, n: int = N):
    """The worker-start half of the install: flashtree's DSparkWorkerV2.__init__ replacement around a stand-in for
    sglang's own __init__ (which needs a live server)."""
    patch = next(p for p in plan.patches(adapter, TreeToggles(tree_n=n)) if p.key == "DSparkWorkerV2.__init__")
    patch.make(lambda self: None)(worker)


def draft_forward(model, seed: int) -> torch.Tensor:
    """DSPARK's draft forward for BS requests (what DraftBlockProposer._run_forward hands the model)."""
    seq_lens = torch.tensor([7, 11])
    batch = types.SimpleNamespace(
        batch_size=BS, seq_lens=seq_lens, req_pool_indices=torch.tensor([2, 0]), out_cache_loc=torch.arange(BS * K) + 1
    )
    positions = (seq_lens[:, None] + torch.arange(K)).reshape(-1)
    torch.manual_seed(seed)  # flashmap draws its noise from torch's default generator
    return model.forward(torch.zeros(BS * K, dtype=torch.long), positions, batch).hidden_states


def candidates(model, worker, seed: int):
    hidden = draft_forward(model, seed)
    base = model.compute_base_logits(hidden)[0].view(BS, K, -1)
    anchor = torch.tensor([5, 9])
    return decode.draw_candidates(worker._flashtree, worker, base, anchor, None, N), base


def check_tree(tree, cands: torch.Tensor) -> None:
    """A valid trie-vote tree over `cands`: parents first, prefix-closed, each node a candidate prefix, right votes."""
    for b in range(cands.shape[0]):
        rows = [tuple(c) for c in cands[b].tolist()]
        prefixes = {}
        for i in range(tree.width - 1):
            if not tree.valid[b, i]:
                assert not tree.valid[b, i:].any(), "padding must follow every valid node"
                break
            parent = int(tree.parents[b, i])
            assert 0 <= parent <= i, "a node's parent is the root or an earlier node"
            assert parent == 0 or tree.valid[b, parent - 1]
            prefix = (prefixes[parent] if parent else ()) + (int(tree.tokens[b, i]),)
            prefixes[i + 1] = prefix
            assert int(tree.depth[b, i]) == len(prefix)
            assert int(tree.votes[b, i]) == sum(r[: len(prefix)] == prefix for r in rows) > 0
        assert len(set(prefixes.values())) == len(prefixes), "a trie holds each prefix once"


@pytest.mark.parametrize("draft_vocab", [0, 24], ids=["full-vocab", "draft-vocab"])
def test_candidates_are_noise_draws_of_one_forward(fm, monkeypatch, draft_vocab):
    model = tiny_model(fm, monkeypatch, draft_vocab)
    adapter = adapters.select_adapter()
    assert adapter.release == "0.5.20"
    worker = make_worker(model)
    start_worker(adapter, worker)
    assert model.tree_mode and model.tree_n_for(BS) == N

    cands, base = candidates(model, worker, seed=7)
    assert cands.shape == (BS, N, K) and cands.dtype == torch.int64
    assert ((cands >= 0) & (cands < V)).all()
    if draft_vocab:
        assert torch.isin(cands, model.hot_ids).all(), "draft-vocabulary indices map back to token ids"
    # Candidate 0 is the block the forward handed DSPARK, and each candidate is the argmax block of its own noise.
    first = base.argmax(dim=-1)
    assert torch.equal(cands[:, 0], first if model.hot_ids is None else model.hot_ids[first])
    for b in range(BS):
        assert len({tuple(c) for c in cands[b].tolist()}) > 1, f"request {b}: every noise draw gave the same block"

    again, _ = candidates(model, worker, seed=7)
    assert torch.equal(again, cands), "the same seed must reproduce the draws"
    other, _ = candidates(model, worker, seed=8)
    assert not torch.equal(other, cands), "another seed must change the draws"

    tree = build_vote_tree(cands, W)
    assert tree.width == W and tree.valid.any(dim=1).all()
    check_tree(tree, cands)


def test_other_drafts_keep_the_markov_draws():
    model = torch.nn.Linear(2, 2)  # any draft without flashmap's marker
    worker = make_worker(model)
    flashmap_draft.prepare(adapters.select_adapter(), worker, N)
    assert "_draft_tree" not in vars(model) and flashmap_draft.noise_draws(adapters.select_adapter(), worker, BS) is None


def test_flashmap_path_is_unavailable_on_other_releases(sglang_release, request):
    """0.5.17 / 0.5.23 (any release but 0.5.20) refuse a FlashMap draft at worker start, naming the release."""
    others = [cls() for cls in adapters.ADAPTERS if not cls.flashmap_noise_draws]
    assert {a.release for a in others} == {"0.5.17", "0.5.23"}
    if sglang_release == "0.5.20":
        model = tiny_model(request.getfixturevalue("fm"), request.getfixturevalue("monkeypatch"))
    else:
        model = type("FlashMapDraftModel", (torch.nn.Module,), {"flashmap": True})()  # flashmap cannot load here
        others = [adapters.select_adapter()]
    for adapter in others:
        with pytest.raises(ToggleError, match=rf"sglang 0\.5\.20 only .* runs sglang {adapter.release}"):
            start_worker(adapter, make_worker(model))


@pytest.mark.parametrize(
    "change, verify_tokens, message",
    [
        (dict(tree_mode=True), W, "FLASHMAP_TREE_N set"),
        (dict(num_steps=2), W, "takes 2 jumps"),
        ({}, W - 1, "drafts blocks of 4, but DSPARK verifies 3"),
    ],
    ids=["flashmap-own-tree", "two-jumps", "short-block"],
)
def test_flashmap_configurations_the_path_cannot_serve_are_refused(fm, monkeypatch, change, verify_tokens, message):
    model = tiny_model(fm, monkeypatch)
    for name, value in change.items():
        setattr(model, name, value)
    with pytest.raises(ToggleError, match=message):
        start_worker(adapters.select_adapter(), make_worker(model, verify_tokens))
