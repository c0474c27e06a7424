"""SmolLM2's tokenizer stops where the model does (<|im_end|>), so the engine and `generate` agree on an answer that
ends inside the token limit."""

import pytest
import torch

from flashtree.datasets import encode_prompts
from flashtree.drafters import load_drafter
from flashtree.engine import tree_generate
from flashtree.models import load_target

pytestmark = pytest.mark.slow
LIMIT = 48


def test_engine_stops_at_the_models_end_of_turn():
    model, tok = load_target("smollm2-135m")
    assert tok.eos_token == "<|im_end|>"
    assert tok.eos_token_id == model.generation_config.eos_token_id
    ids = encode_prompts(tok, ["What is the capital of France? Answer with one word."])
    ref = model.generate(torch.tensor(ids), max_new_tokens=LIMIT, do_sample=False)[0].tolist()
    assert ref[-1] == tok.eos_token_id and len(ref) - len(ids[0]) < LIMIT  # the answer ends inside the limit
    res = tree_generate(model, load_drafter("default", model), ids, n=4, width=8, max_new_tokens=LIMIT,
                        stop_token_ids=[tok.eos_token_id])
    assert res.sequences[0].tolist() == ref
