"""flashtree's DSPARK drafter on CPU: config and checkpoint layout (sglang's names and shapes), training/inference
agreement, the Markov head's step rule, candidate draws, the engine's greedy identity, the training data's sampled
responses, and the training app."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from flashtree.drafters import DraftState, load_drafter
from flashtree.dspark import DSparkConfig, DSparkDraftModel, load_checkpoint, read_tensors, save_checkpoint
from flashtree.dspark.data import canonical_source
from flashtree.dspark.loss import block_loss, target_features
from flashtree.engine import tree_generate
from flashtree.files import DamagedFile
from flashtree.models import load_target

CONFIGS = Path(__file__).resolve().parents[1] / "flashtree" / "configs" / "train"


@pytest.fixture(scope="module")
def tiny():
    return load_target("tiny-llama")[0]


def small_config(target, **kw) -> DSparkConfig:
    args = dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=64,
                block_size=4, target_layer_ids=(0, 2), markov_rank=8, mask_token_id=5)
    args.update(kw)
    return DSparkConfig.for_target(target, **args)


def random_model(cfg: DSparkConfig, seed: int = 0, std: float = 0.2) -> DSparkDraftModel:
    model = DSparkDraftModel(cfg)
    g = torch.Generator().manual_seed(seed)
    model.init_weights(g, std=std)
    with torch.no_grad():
        model.markov_head.markov_w2.weight.copy_(torch.randn(model.markov_head.markov_w2.weight.shape, generator=g) * std)
    return model.eval()


def hidden_of(target, tokens: torch.Tensor, layers) -> dict:
    """The engine's DraftState.hidden for a committed sequence: positions 0 .. L-2 (the anchor has no KV)."""
    with torch.no_grad():
        states = target(tokens[:, :-1], output_hidden_states=True).hidden_states
    return {i: states[i + 1] for i in layers}


def state_for(target, tokens: torch.Tensor, layers) -> DraftState:
    return DraftState(tokens=tokens, lengths=torch.tensor([tokens.shape[1]]), new_from=torch.tensor([0]),
                      hidden=hidden_of(target, tokens, layers))


# ---- config and checkpoint layout -----------------------------------------------------------------------------------


def test_config_json_has_what_sglang_reads_and_round_trips(tiny):
    cfg = small_config(tiny)
    d = cfg.to_hf_dict()
    assert d["architectures"] == ["DSparkDraftModel"] and d["model_type"] == "qwen3"
    assert d["dflash_config"] == {"target_layer_ids": [0, 2], "mask_token_id": 5, "block_size": 4,
                                  "num_target_layers": 4}
    assert d["markov_rank"] == 8 and d["markov_head_type"] == "vanilla"
    assert d["hidden_size"] == tiny.config.hidden_size and d["vocab_size"] == 259
    assert DSparkConfig.from_hf_dict(json.loads(json.dumps(d))) == cfg


@pytest.mark.parametrize("bad, match", [
    (dict(target_layer_ids=(0, 3)), "outside 0..2"),  # a 4-layer Llama: sglang captures at most layer 2
    (dict(mask_token_id=259), "outside the vocabulary"),
    (dict(markov_rank=0), "markov_rank"),
])
def test_config_refuses_what_sglang_would_refuse(tiny, bad, match):
    with pytest.raises(ValueError, match=match):
        small_config(tiny, **bad)


def expected_names(layers: int) -> set[str]:
    names = {"norm.weight", "fc.weight", "hidden_norm.weight", "markov_head.markov_w1.weight",
             "markov_head.markov_w2.weight"}
    for i in range(layers):
        p = f"layers.{i}."
        names |= {p + "input_layernorm.weight", p + "post_attention_layernorm.weight"}
        names |= {p + f"self_attn.{x}_proj.weight" for x in "qkvo"}
        names |= {p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"}
        names |= {p + f"mlp.{x}_proj.weight" for x in ("gate", "up", "down")}
    return names


@pytest.mark.parametrize("shard", [None, 40_000])
def test_checkpoint_names_shapes_and_round_trip(tiny, tmp_path, shard):
    cfg = small_config(tiny)
    model = random_model(cfg)
    save_checkpoint(model, tmp_path, dtype="float32", max_shard_bytes=shard)
    tensors = read_tensors(tmp_path)
    assert set(tensors) == expected_names(2)
    assert tensors["fc.weight"].shape == (64, 2 * 64)
    assert tensors["markov_head.markov_w1.weight"].shape == (259, 8)
    assert tensors["markov_head.markov_w2.weight"].shape == (259, 8)
    assert tensors["layers.0.self_attn.k_proj.weight"].shape == (2 * 16, 64)
    if shard:
        index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
        assert len(set(index["weight_map"].values())) > 1 and set(index["weight_map"]) == set(tensors)
    loaded = load_checkpoint(tmp_path)
    for name, p in model.named_parameters():
        assert torch.equal(dict(loaded.named_parameters())[name], p), name


def test_load_refuses_a_checkpoint_that_does_not_match_its_config(tiny, tmp_path):
    model = random_model(small_config(tiny))
    save_checkpoint(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["num_hidden_layers"] = 3
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="missing"):
        load_checkpoint(tmp_path)


@pytest.mark.parametrize("damage, message", [
    (lambda d: (d / "config.json").write_text('{"hidden_size":'), "the DSPARK draft config {d}/config.json is damaged"),
    (lambda d: (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:50]),
     "the DSPARK checkpoint weights {d}/model.safetensors is damaged"),
    (lambda d: (d / "model.safetensors.index.json").write_text('{"weight_map": {"fc.weight": "gone.safetensors"}}'),
     "the DSPARK checkpoint weights {d}/gone.safetensors is missing"),
])
def test_a_damaged_checkpoint_file_is_named(tiny, tmp_path, damage, message):
    save_checkpoint(random_model(small_config(tiny)), tmp_path)
    damage(tmp_path)
    with pytest.raises((DamagedFile, FileNotFoundError)) as err:
        load_checkpoint(tmp_path)
    assert message.format(d=tmp_path) in str(err.value)


def test_load_drafter_refuses_a_draft_for_another_target(tiny, tmp_path):
    cfg = small_config(tiny).replace(hidden_size=32, head_dim=8)
    save_checkpoint(DSparkDraftModel(cfg), tmp_path)
    with pytest.raises(ValueError, match="hidden size 32"):
        load_drafter("dspark", tiny, path=tmp_path)


# ---- the math -------------------------------------------------------------------------------------------------------


def captured_logits(model, target, seq, anchors, dflash: bool = False):
    """(the training loss, its block logits (anchors, block, V)) of the batched training forward over `seq`."""
    cfg = model.config
    feats = target_features(target, seq, torch.tensor([seq.shape[1]]), cfg.target_layer_ids)
    captured = {}
    original = torch.nn.functional.cross_entropy

    def capture(logits, labels, reduction):
        captured["logits"] = logits.detach().clone()
        return original(logits, labels, reduction=reduction)

    torch.nn.functional.cross_entropy = capture
    try:
        loss, _ = block_loss(model, target.get_input_embeddings(), target.get_output_embeddings().weight, feats, seq,
                             torch.tensor([seq.shape[1]]), anchors, torch.ones_like(anchors, dtype=torch.bool), None,
                             dflash=dflash)
    finally:
        torch.nn.functional.cross_entropy = original
    return loss, captured["logits"].view(anchors.shape[1], cfg.block_size, -1)


def test_training_blocks_equal_the_drafters_incremental_blocks(tiny):
    """The batched training forward (many anchors, block-diagonal mask) and the engine's drafter (context K/V built
    up position by position) give the same logits: train and serve see the same function."""
    cfg = small_config(tiny)
    model = random_model(cfg)
    seq = torch.randint(0, 250, (1, 30), generator=torch.Generator().manual_seed(1))
    anchors = torch.tensor([[10, 17, 25]])
    _loss, train_logits = captured_logits(model, tiny, seq, anchors)
    drafter = load_drafter("dspark", tiny, model=model)
    for i, a in enumerate(anchors[0].tolist()):
        prefix = seq[:, : a + 1]
        drafter.start(state_for(tiny, prefix[:, : a - 5], cfg.target_layer_ids))
        drafter.advance(state_for(tiny, prefix, cfg.target_layer_ids))  # the context grows as in the engine
        served = drafter.base_logits()[0] + model.markov_bias(seq[0, a : a + 4]).float()
        assert torch.allclose(served, train_logits[i], atol=1e-4), a


def test_markov_head_feeds_each_step_the_previous_choice_starting_from_the_anchor(tiny):
    """sglang's rule: step j adds markov_w2 @ markov_w1[prev], prev = the anchor at step 0, then the token chosen at
    step j-1. A bias table that dominates the base logits makes the greedy block follow it exactly."""
    cfg = small_config(tiny)
    model = random_model(cfg, std=0.02)
    nxt = {40: 41, 41: 42, 42: 43, 43: 44}
    with torch.no_grad():
        w1, w2 = model.markov_head.markov_w1.weight, model.markov_head.markov_w2.weight
        w1.zero_(), w2.zero_()
        for slot, (a, b) in enumerate(nxt.items()):
            w1[a, slot] = 10.0
            w2[b, slot] = 10.0
    drafter = load_drafter("dspark", tiny, model=model)
    tokens = torch.tensor([[7, 8, 9, 40]])
    drafter.start(state_for(tiny, tokens, cfg.target_layer_ids))
    assert drafter.propose(3).candidates[0].tolist() == [[41, 42, 43, 44]] * 3


def test_candidates_greedy_first_diverse_and_prefix_stable(tiny):
    cfg = small_config(tiny)
    model = random_model(cfg, std=0.05)
    tokens = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    greedy = load_drafter("dspark", tiny, model=model, temperature=0.0)
    greedy.start(state_for(tiny, tokens, cfg.target_layer_ids))
    chain = greedy.propose(4).candidates[0]
    assert (chain == chain[0]).all()  # temperature 0: the tree is the chain
    hot = load_drafter("dspark", tiny, model=model, temperature=1.0)
    hot.start(state_for(tiny, tokens, cfg.target_layer_ids))
    many = hot.propose(8, torch.Generator().manual_seed(3)).candidates[0]
    few = hot.propose(3, torch.Generator().manual_seed(3)).candidates[0]
    assert torch.equal(many[0], chain[0])  # candidate 0 is the greedy block
    assert torch.equal(many[:3], few)  # the first n of a draw of N are the draw of n (replay relies on it)
    assert torch.unique(many, dim=0).shape[0] > 1


def test_window_runs_more_block_rows_and_keeps_the_first_k(tiny):
    """window = W - 1 replays an sglang server with --speculative-num-draft-tokens W whose trees keep k positions:
    the block's rows attend to each other both ways, so the extra rows change the kept rows' logits."""
    cfg = small_config(tiny, block_size=8)
    model = random_model(cfg)
    tokens = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])

    def logits(**kw):
        drafter = load_drafter("dspark", tiny, model=model, **kw)
        drafter.start(state_for(tiny, tokens, cfg.target_layer_ids))
        return drafter.base_logits()

    full, kept, short = logits(), logits(k=4, window=8), logits(k=4)
    assert kept.shape == short.shape == (1, 4, cfg.vocab_size)
    assert torch.equal(kept, full[:, :4])
    assert not torch.allclose(short, kept, atol=1e-3)
    with pytest.raises(ValueError, match="window=3: the draft forward runs at least the k=4 rows it keeps"):
        load_drafter("dspark", tiny, model=model, k=4, window=3)


def test_return_probs_gives_the_distribution_each_candidate_token_was_drawn_from(tiny):
    cfg = small_config(tiny)
    model = random_model(cfg, std=0.05)
    for bad in (dict(temperature=0.0, greedy_first=False), dict(temperature=1.0)):  # greedy tokens have no q
        with pytest.raises(ValueError, match="return_probs"):
            load_drafter("dspark", tiny, model=model, return_probs=True, **bad)
    tokens = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    plain = load_drafter("dspark", tiny, model=model, temperature=0.8, greedy_first=False)
    drafter = load_drafter("dspark", tiny, model=model, temperature=0.8, greedy_first=False, return_probs=True)
    for d in (plain, drafter):
        d.start(state_for(tiny, tokens, cfg.target_layer_ids))
    n, k = 4000, cfg.block_size
    prop = drafter.propose(n, torch.Generator().manual_seed(3))
    same = plain.propose(n, torch.Generator().manual_seed(3))
    assert same.probs is None and torch.equal(prop.candidates, same.candidates)  # the flag changes no draw
    assert prop.probs.shape == (1, n, k, cfg.vocab_size)
    # q at slot j: softmax((base_j + markov bias of the previous token) / T), the anchor before slot 0
    cands = prop.candidates[0]
    prev = torch.cat([torch.full((n, 1), 6), cands[:, :-1]], dim=1)
    with torch.no_grad():
        logits = drafter.base_logits()[0] + model.markov_bias(prev).float()
    assert torch.allclose(prop.probs[0], (logits / 0.8).softmax(-1), atol=1e-6)
    # and the tokens are draws from it: slot 0's q is the same for every candidate
    from scipy.stats import chisquare

    q0 = prop.probs[0, 0, 0].double()
    counts = torch.bincount(cands[:, 0], minlength=cfg.vocab_size).double()
    big = q0 * n >= 5
    f_obs = torch.cat([counts[big], counts[~big].sum().view(1)])
    f_exp = torch.cat([q0[big], q0[~big].sum().view(1)]) * n
    assert big.sum() > 5 and chisquare(f_obs, f_exp * f_obs.sum() / f_exp.sum()).pvalue > 1e-3


# ---- the engine -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n, width", [(1, 5), (4, 8), (8, 16)])
def test_engine_greedy_output_is_the_targets_with_a_checkpoint_written_by_flashtree(tiny, tmp_path, n, width):
    from flashtree.dspark.evaluate import engine_identity

    save_checkpoint(random_model(small_config(tiny), std=0.05), tmp_path)  # bf16 on disk, as exported
    drafter = load_drafter("dspark", tiny, path=tmp_path, temperature=1.0)
    prompts = [[10, 20, 30, 40, 50, 60], [7, 7, 7], [100, 101, 102, 103, 104, 105, 106]]
    report = engine_identity(tiny, drafter, prompts, n=n, width=width, max_new_tokens=24, stop_ids=[258],
                             progress=False)
    assert report["identical"] == len(prompts), report["rows"]


def test_engine_rejection_walk_runs_with_the_drafters_probs(tiny):
    drafter = load_drafter("dspark", tiny, model=random_model(small_config(tiny), std=0.05), temperature=1.0,
                           greedy_first=False, return_probs=True)
    res = tree_generate(tiny, drafter, [[10, 20, 30, 40, 50, 60], [7, 7, 7]], n=1, width=5, max_new_tokens=24,
                        temperature=1.0, generator=torch.Generator().manual_seed(0), walk="rejection")
    assert res.new_tokens == [24, 24] and all(0 <= s.accept_len <= 4 for s in res.steps)


# ---- data guard and the training app -------------------------------------------------------------------------------


def test_the_held_out_gsm8k_half_cannot_be_a_training_source():
    for name in ("gsm8k", "gsm8k-second-half"):
        with pytest.raises(ValueError, match="held out"):
            canonical_source(name)
    assert canonical_source("gsm8k_first_half") == "gsm8k-first-half"


# ---- training data: extra sampled responses -------------------------------------------------------------------------


def generate(target, rows, ids, **kw):
    from flashtree.dspark.data import generate_responses

    args = dict(max_new_tokens=6, batch_size=2, stop_ids=[258], pad_id=256, progress=False,
                sampled=[r["sampled"] for r in rows])
    return generate_responses(target, ids, **{**args, **kw})


def sample_rows(extra: dict):
    """Two GSM8K-first-half and three builtin prompts (token ids of lengths 3..7), expanded by `extra`."""
    from flashtree.dspark.data import expand_samples

    prompts = [{"source": "gsm8k-first-half", "text": f"q{i}"} for i in range(2)]
    prompts += [{"source": "builtin", "text": f"b{i}"} for i in range(3)]
    g = torch.Generator().manual_seed(0)
    ids_of = {p["text"]: torch.randint(3, 250, (3 + i,), generator=g).tolist() for i, p in enumerate(prompts)}
    rows = expand_samples(prompts, extra)
    return rows, [ids_of[r["text"]] for r in rows]


def test_extra_samples_add_sampled_sequences_to_their_source_only(tiny, tmp_path):
    from flashtree.dspark.data import build_sequences, data_summary, load_sequences, save_sequences

    rows, ids = sample_rows({"gsm8k_first_half": 3})  # an alias of the canonical name
    seqs = build_sequences(rows, ids, generate(tiny, rows, ids))
    by = data_summary(seqs)["by_source"]
    assert (by["gsm8k-first-half"]["sequences"], by["gsm8k-first-half"]["sampled"]) == (2 * 4, 2 * 3)
    assert (by["builtin"]["sequences"], by["builtin"]["sampled"]) == (3, 0)
    save_sequences(tmp_path / "data.pt", seqs, {})
    assert [s.sampled for s in load_sequences(tmp_path / "data.pt")[0]] == [s.sampled for s in seqs]


def test_a_cpu_generation_batch_whose_cache_cannot_fit_is_refused_first(tiny, monkeypatch):
    """On the CPU an oversized batch's KV cache would be killed by the kernel without a word: the largest batch's
    cache (its tokens x the config's K and V bytes) is checked against the memory available, before generating."""
    from flashtree.dspark import data

    c = tiny.config
    per_token = data.kv_bytes_per_token(tiny)
    assert per_token == 2 * c.num_hidden_layers * c.num_key_value_heads * (
        getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads) * 4  # float32
    rows, ids = sample_rows({})  # prompts of 3..7 tokens, batches of 2, 6 new tokens: the largest holds 24 tokens
    monkeypatch.setattr(data, "available_memory", lambda: 24 * per_token - 1)
    monkeypatch.setattr(tiny, "generate", lambda *a, **k: pytest.fail("generated before the check"))
    with pytest.raises(ValueError, match=r"data.gen_batch_size=2: .* lower data.gen_batch_size"):
        generate(tiny, rows, ids)
    monkeypatch.undo()
    monkeypatch.setattr(data, "available_memory", lambda: 24 * per_token)  # just enough
    assert all(r is not None for r in generate(tiny, rows, ids))
    monkeypatch.undo()
    assert data.available_memory() > 0


def test_sampled_batches_run_first_and_survive_the_batch_limit(tiny, monkeypatch):
    calls = []
    real = tiny.generate
    monkeypatch.setattr(tiny, "generate", lambda *a, **kw: calls.append(kw["do_sample"]) or real(*a, **kw))
    rows, ids = sample_rows({"gsm8k-first-half": 3})  # 6 sampled rows: 3 batches of 2, then 3 greedy batches
    out = generate(tiny, rows, ids, max_batches=4)
    assert calls == [True, True, True, False]  # each batch all sampled or all greedy
    assert all(o is not None for o, r in zip(out, rows) if r["sampled"])
    assert sum(o is not None for o, r in zip(out, rows) if not r["sampled"]) == 2


def test_sampling_is_seeded_and_follows_the_temperature(tiny):
    rows, ids = sample_rows({"gsm8k-first-half": 4, "builtin": 1})

    def departs(out):  # prompts with a sampled response other than their greedy one
        greedy = {r["text"]: o for r, o in zip(rows, out) if not r["sampled"]}
        return {r["text"] for r, o in zip(rows, out) if r["sampled"] and o != greedy[r["text"]]}

    rng = torch.get_rng_state()
    first = generate(tiny, rows, ids, temperature=5.0, seed=3)
    assert torch.equal(torch.get_rng_state(), rng)  # the caller's RNG is left alone
    assert generate(tiny, rows, ids, temperature=5.0, seed=3) == first
    assert generate(tiny, rows, ids, temperature=5.0, seed=4) != first
    assert len(departs(first)) >= 2
    assert not departs(generate(tiny, rows, ids, temperature=1e-5, seed=3))  # ~greedy: the temperature is applied


@pytest.mark.parametrize("data, match", [
    (dict(extra_samples={"mt-bench": 2}), r"data\.extra_samples\.mt-bench=2: not a source of data\.sources: use one "
                                          r"of builtin, gsm8k-first-half"),
    (dict(extra_samples={"gsm8k": 2}), r"data\.extra_samples\.gsm8k: .*held out"),
    (dict(extra_samples={"builtin": -1}), r"data\.extra_samples\.builtin=-1: must be an int >= 0"),
    (dict(extra_samples={"builtin": 1.5}), r"data\.extra_samples\.builtin=1\.5: must be an int >= 0"),
    (dict(extra_samples={"builtin": 1}, sample_temperature=0.0), r"data\.sample_temperature=0\.0: must be > 0"),
])
def test_extra_samples_config_errors_name_the_key_and_the_choices(data, match):
    from flashtree.dspark.train_config import TrainConfigError, TrainDataConfig

    sources = {"builtin": 8, "gsm8k_first_half": None}
    with pytest.raises(TrainConfigError, match=match):
        TrainDataConfig(sources=sources, **data)
    TrainDataConfig(sources=sources, extra_samples={"builtin": 0}, sample_temperature=0.0)  # no samples, no need


def test_default_config_samples_gsm8k_first_and_keeps_those_batches():
    from hydra import compose, initialize_config_dir

    from flashtree.dspark.train_config import register, to_train_config

    register()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        d = to_train_config(compose(config_name="default")).data
    assert d.extra_samples == {"gsm8k-first-half": 15} and d.sample_temperature == 0.8
    sampled_batches = math.ceil(659 * 15 / d.gen_batch_size)  # all 659 GSM8K-first-half prompts fit
    assert sampled_batches == 10 < d.gen_max_batches == 12  # so the limit never cuts a sampled batch


def test_prepare_data_expands_samples_from_the_config_also_over_a_prompts_file(tmp_path):
    from hydra import compose, initialize_config_dir

    from flashtree.dspark.train import prepare_data
    from flashtree.dspark.train_config import register, to_train_config

    target, tokenizer = load_target("tiny-llama")
    register()

    def run(out, *overrides):
        out.mkdir()  # train() makes it
        with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
            cfg = to_train_config(compose(config_name="tiny", overrides=[f"out_dir={out}", "data.max_new_tokens=6",
                                                                         *overrides]))
        return prepare_data(cfg, target, tokenizer, out, log=lambda *a: None)

    seqs, meta = run(tmp_path / "a", "+data.extra_samples={builtin: 2}")  # `+`: tiny.yaml lists none
    assert (meta["generated"], meta["sampled_sequences"]) == (8 * 3, 8 * 2)
    assert meta["by_source"]["builtin"]["sampled"] == 16 and meta["total"]["sequences"] == 24
    assert all(s.source == "builtin" for s in seqs)
    seqs, meta = run(tmp_path / "b", f"data.prompts_file={tmp_path / 'a' / 'prompts.json.gz'}",
                     "+data.extra_samples={builtin: 1}")
    assert (meta["prompts_selected"], meta["generated"], meta["sampled_sequences"]) == (8, 16, 8)


def test_training_app_trains_exports_a_loadable_draft_and_resumes(tiny, tmp_path):
    from hydra import compose, initialize_config_dir

    from flashtree.dspark.train import train
    from flashtree.dspark.train_config import register, to_train_config

    register()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = to_train_config(compose(config_name="tiny", overrides=[f"out_dir={tmp_path}"]))
    summary = train(cfg, log=lambda *a: None)
    assert summary["steps"] == 6
    log = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert [row["step"] for row in log] == [3, 6] and all(row["loss"] > 0 for row in log)
    drafter = load_drafter("dspark", tiny, path=tmp_path / "draft")
    assert drafter.k == 4 and drafter.hidden_layers == (0, 2)
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        more = to_train_config(compose(config_name="tiny", overrides=[f"out_dir={tmp_path}", "optim.steps=9"]))
    lines = []
    summary = train(more, log=lines.append)
    assert summary["steps"] == 9 and any("resumed" in line and "step 6" in line for line in lines)
    assert any("reusing" in line for line in lines)  # the data is not regenerated


def test_a_training_can_pause_and_resume_on_one_time_schedule(tiny, tmp_path):
    """stop_after_s ends a run early (checkpoint + export, `paused`); a resume continues the schedule that
    time_limit_s spans over all runs: trained time carries over, so the learning rate picks up where it was."""
    from hydra import compose, initialize_config_dir

    from flashtree.dspark.train import train
    from flashtree.dspark.train_config import register, to_train_config

    register()

    def cfg(*overrides):
        with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
            return to_train_config(compose(config_name="tiny", overrides=[f"out_dir={tmp_path}", "optim.steps=12",
                                                                         "optim.warmup=1", *overrides]))

    first = train(cfg("optim.stop_after_s=1e-9", "optim.time_limit_s=1000"), log=lambda *a: None)
    assert first["paused"] and not first["stopped_by_time_limit"] and first["steps"] == 0
    assert (tmp_path / "draft" / "config.json").is_file()
    # as if the first run had trained for 999 of the 1000 s: the resumed run starts at the schedule's end
    state = torch.load(tmp_path / "state.pt", weights_only=False)
    state["step"], state["train_time_s"] = 3, 999.0
    torch.save(state, tmp_path / "state.pt")
    lines = []
    second = train(cfg("optim.time_limit_s=1000"), log=lines.append)
    assert not second["paused"] and second["train_time_s"] >= 999.0
    rows = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    lr = cfg().optim.lr
    assert rows and all(row["lr"] < 0.2 * lr for row in rows), [row["lr"] for row in rows]
    assert any("resumed" in line and "step 3" in line for line in lines)


@pytest.mark.parametrize("key", ["time_limit_s", "stop_after_s"])
def test_time_limits_must_be_positive(key):
    from flashtree.dspark.train_config import TrainOptimConfig

    with pytest.raises(ValueError, match=f"optim.{key}"):
        TrainOptimConfig(**{key: 0})


def test_scores_are_the_drafts_own_log_probabilities_and_feed_every_policy(tiny):
    """DraftScores.logp of each candidate token equals step_logprobs after its parent (prob reads the first,
    best-first the second), and every registered policy builds a tree from one proposal."""
    from flashtree.tree import build_tree, policy_names

    cfg = small_config(tiny)
    model = random_model(cfg, std=0.05)
    tokens = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    drafter = load_drafter("dspark", tiny, model=model, temperature=1.0)
    drafter.start(state_for(tiny, tokens, cfg.target_layer_ids))
    prop = drafter.propose(6, torch.Generator().manual_seed(3))
    scores, cands = prop.scores, prop.candidates
    bs, n, k = cands.shape
    assert int(scores.anchor[0]) == 6
    for m in range(n):
        prev = scores.anchor
        for j in range(k):
            lp = scores.step_logprobs(torch.tensor([0]), torch.tensor([j]), prev)
            assert torch.allclose(lp.exp().sum(-1), torch.ones(1))
            assert torch.allclose(scores.logp[0, m, j], lp[0, cands[0, m, j]], atol=1e-5)
            prev = cands[0, m, j : j + 1]
    for policy in policy_names():
        tree = build_tree(cands, 8, policy, scores)
        assert bool(tree.valid[:, 0].all())


def test_a_damaged_checkpoint_or_data_file_is_set_aside_and_redone(tiny, tmp_path, capsys):
    from hydra import compose, initialize_config_dir

    from flashtree.dspark.train import train
    from flashtree.dspark.train_config import register, to_train_config

    register()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = to_train_config(compose(config_name="tiny", overrides=[f"out_dir={tmp_path}"]))
    train(cfg, log=lambda *a: None)
    for name in ("state.pt", "data.pt"):
        blob = (tmp_path / name).read_bytes()
        (tmp_path / name).write_bytes(blob[: len(blob) // 2])  # truncated, as by a full disk or a killed copy
    lines = []
    summary = train(cfg, log=lines.append)
    out = capsys.readouterr().out
    assert f"the training checkpoint {tmp_path / 'state.pt'} is damaged" in out and "starts from step 0" in out
    assert f"the training data {tmp_path / 'data.pt'} is damaged" in out and "generated again" in out
    assert (tmp_path / "state.pt.damaged").is_file() and (tmp_path / "data.pt.damaged").is_file()
    assert summary["steps"] == 6 and not any("resumed" in line for line in lines)


def test_the_held_out_filter_never_runs_without_the_gsm8k_set(monkeypatch):
    import flashtree.datasets as datasets
    from flashtree.dspark.data import heldout_texts

    def missing(*args, **kwargs):
        raise ModuleNotFoundError("No module named 'gsm8k_package'")

    monkeypatch.setattr(datasets, "load_prompts", missing)
    with pytest.raises(ModuleNotFoundError, match="must exclude the held-out GSM8K half"):
        heldout_texts()


@pytest.mark.parametrize("policy", ["prob", "best-first"])
def test_engine_greedy_output_is_the_targets_under_the_probability_policies(tiny, policy):
    cfg = small_config(tiny)
    model = random_model(cfg, std=0.05)
    prompt = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])
    ref = tiny.generate(prompt.view(1, -1), max_new_tokens=12, do_sample=False)[0]
    drafter = load_drafter("dspark", tiny, model=model, temperature=1.0)
    res = tree_generate(tiny, drafter, [prompt], n=6, width=8, max_new_tokens=12, policy=policy,
                        generator=torch.Generator().manual_seed(0))
    assert res.sequences[0].tolist() == ref.tolist()
    assert all(s.policy == policy for s in res.steps)
