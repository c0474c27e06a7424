"""flashtree's DFLASH-format drafter on CPU: the trainer's dflash objective and the engine's DFLASH drafter see the
same function (block rows 1..K after the anchor, no Markov head), a DFLASH checkpoint written by flashtree drafts
for the engine with greedy output equal to the target's, and the candidates are independent per-position draws."""

from __future__ import annotations

import pytest
import torch

from flashtree.drafters import load_drafter
from flashtree.dspark.dflash_format import load_dflash_checkpoint, save_dflash_checkpoint
from tests.test_dspark import (captured_logits, random_model, small_config, state_for,  # noqa: F401
                               tiny)  # tiny: the shared fixture


def dflash_model(target, seed: int = 0, std: float = 0.2):
    model = random_model(small_config(target), seed=seed, std=std)
    with torch.no_grad():
        model.markov_head.markov_w2.weight.zero_()  # a DFLASH draft has no head
    return model


def test_dflash_training_blocks_equal_the_dflash_drafters_blocks(tiny):
    model = dflash_model(tiny)
    cfg = model.config
    seq = torch.randint(0, 250, (1, 30), generator=torch.Generator().manual_seed(1))
    anchors = torch.tensor([[10, 17, 24]])
    _loss, train_logits = captured_logits(model, tiny, seq, anchors, dflash=True)
    drafter = load_drafter("dflash", tiny, model=model)
    dspark = load_drafter("dspark", tiny, model=model)
    for i, a in enumerate(anchors[0].tolist()):
        prefix = seq[:, : a + 1]
        for d in (drafter, dspark):
            d.start(state_for(tiny, prefix, cfg.target_layer_ids))
        assert torch.allclose(drafter.base_logits()[0], train_logits[i], atol=1e-4), a
        assert not torch.allclose(dspark.base_logits()[0], train_logits[i], atol=1e-2)  # DSPARK reads rows 0..K-1


def test_dflash_objective_ignores_the_markov_head(tiny):
    model = random_model(small_config(tiny))
    seq = torch.randint(0, 250, (1, 30), generator=torch.Generator().manual_seed(2))
    anchors = torch.tensor([[8, 20]])
    before = [captured_logits(model, tiny, seq, anchors, dflash)[0] for dflash in (True, False)]
    with torch.no_grad():
        model.markov_head.markov_w2.weight.mul_(3.0)
    after = [captured_logits(model, tiny, seq, anchors, dflash)[0] for dflash in (True, False)]
    assert torch.equal(before[0], after[0]) and not torch.equal(before[1], after[1])


def test_dflash_candidates_are_independent_draws_with_the_argmax_first(tiny):
    model = dflash_model(tiny)
    seq = torch.randint(0, 250, (1, 16), generator=torch.Generator().manual_seed(3))
    drafter = load_drafter("dflash", tiny, model=model, temperature=1.0)
    drafter.start(state_for(tiny, seq, model.config.target_layer_ids))
    prop = drafter.propose(8, generator=torch.Generator().manual_seed(0))
    base = drafter.base_logits()
    assert torch.equal(prop.candidates[:, 0], base.argmax(-1))
    assert torch.allclose(prop.scores.logp, base.log_softmax(-1).unsqueeze(1).expand(-1, 8, -1, -1).gather(
        3, prop.candidates.unsqueeze(-1)).squeeze(-1), atol=1e-5)
    with pytest.raises(ValueError, match="has no Markov head"):
        load_drafter("dflash", tiny, model=random_model(small_config(tiny)))


@pytest.mark.parametrize("n, width", [(1, 5), (4, 8)])
def test_engine_greedy_output_is_the_targets_with_a_dflash_checkpoint(tiny, tmp_path, n, width):
    from flashtree.dspark.evaluate import engine_identity

    save_dflash_checkpoint(dflash_model(tiny, std=0.05), tmp_path)
    assert load_dflash_checkpoint(tmp_path).config.block_size == 4
    drafter = load_drafter("dflash", tiny, path=tmp_path, temperature=1.0)
    prompts = [[10, 20, 30, 40, 50, 60], [7, 7, 7]]
    report = engine_identity(tiny, drafter, prompts, n=n, width=width, max_new_tokens=16, stop_ids=[258],
                             progress=False)
    assert report["identical"] == len(prompts), report["rows"]
