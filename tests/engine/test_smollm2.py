"""The embedded default on the real model: SmolLM2-135M (dequantized from its Q4_1 GGUF), prompt lookup, fp32 CPU."""

import pytest
import torch

from flashtree.datasets import encode_prompts, load_prompts
from flashtree.drafters import load_drafter
from flashtree.engine import tree_generate
from flashtree.models import load_target

pytestmark = pytest.mark.slow
NEW = 32


@pytest.fixture(scope="module")
def smollm2():
    model, tok = load_target("smollm2-135m")
    prompts = []
    for name in ("gsm8k", "humaneval", "mtbench"):
        prompts += encode_prompts(tok, load_prompts(name, limit=1))
    refs = [model.generate(torch.tensor([p]), max_new_tokens=NEW, do_sample=False)[0] for p in prompts]
    return model, tok, prompts, refs


@pytest.mark.parametrize("n,width", [(1, 4), (4, 16)])
def test_default_drafter_is_lossless_on_smollm2(smollm2, n, width):
    model, tok, prompts, refs = smollm2
    accepted = 0
    for p, ref in zip(prompts, refs):
        drafter = load_drafter("default", model)
        res = tree_generate(model, drafter, [p], n=n, width=width, max_new_tokens=NEW,
                            stop_token_ids=[tok.eos_token_id])
        assert res.sequences[0].tolist() == ref.tolist()
        accepted += sum(s.accept_len for s in res.steps)
    assert accepted > 0  # prompt lookup does find real continuations
