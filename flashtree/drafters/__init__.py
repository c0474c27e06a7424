"""Drafters for the reference engine, and `load_drafter(name, target, **options)` to build one by name."""

from __future__ import annotations

from .base import DraftState, Drafter, Proposal
from .oracle import OracleDrafter
from .prompt_lookup import PromptLookupDrafter

NAMES = ("default", "prompt-lookup", "flashmap", "dspark", "dflash", "oracle")


def load_drafter(name: str, target, **options) -> Drafter:
    """Build drafter `name` for the transformers causal LM `target`.

    "default" / "prompt-lookup": PromptLookupDrafter(k=8, ngrams=(3, 2, 1), max_matches=64).
    "flashmap": FlashMapDrafter. Options: model (a FlashMapDraftModel, a local folder or a hub id) or config (a
        FlashMapConfig or dict, random init with `seed`; neither: a tiny random config fitting the target), dtype,
        temperature, num_steps.
    "dspark": DSparkDrafter (flashtree.drafters.dspark_drafter). Options: path (a DSPARK draft checkpoint folder in
        sglang's layout) or model (a flashtree.dspark.DSparkDraftModel), temperature (draft temperature of the N
        candidates; 0 = all greedy), greedy_first (candidate 0 is the greedy block), k (<= block_size), window
        (block rows the draft forward runs, >= k: an sglang server's wider window, FLASHTREE_TREE_DEPTH), dtype,
        return_probs (proposals carry the draft distributions, for walk="rejection"; needs temperature > 0 and
        greedy_first=False).
    "dflash": DFlashDrafter (flashtree.drafters.dflash_drafter): an sglang-DFLASH-format draft (no Markov head,
        independent positions). Options: path (a DFLASH checkpoint folder) or model, and the dspark options.
    "oracle": OracleDrafter. Options: sequences (required: each request's reference greedy tokens, prompt included),
        k, rate, decoys, seed, strict.
    A drafter whose vocabulary, hidden size or layers do not fit the target raises ValueError here, before any work.
    """
    key = name.lower().replace("_", "-")
    if key in ("default", "prompt-lookup"):
        drafter = PromptLookupDrafter(_target_vocab(target), **options)
    elif key == "flashmap":
        from .flashmap_drafter import FlashMapDrafter, build_flashmap_model

        build = {o: options.pop(o) for o in ("model", "config", "seed", "dtype") if o in options}
        drafter = FlashMapDrafter(build_flashmap_model(target, **build), target, **options)
    elif key == "dspark":
        from .dspark_drafter import build_dspark_drafter

        drafter = build_dspark_drafter(target, **options)
    elif key == "dflash":
        from .dflash_drafter import build_dflash_drafter

        drafter = build_dflash_drafter(target, **options)
    elif key == "oracle":
        if "sequences" not in options:
            raise ValueError("the oracle drafter needs sequences=: the target's greedy decoding of each prompt")
        drafter = OracleDrafter(options.pop("sequences"), _target_vocab(target), **options)
    else:
        raise ValueError(f"unknown drafter {name!r}: use one of {', '.join(NAMES)}")
    check_compatible(drafter, target)
    return drafter


def _target_vocab(target) -> int:
    return int(target.get_output_embeddings().weight.shape[0])


def check_compatible(drafter: Drafter, target) -> None:
    """Raise ValueError if `drafter` cannot draft for `target`: vocabulary, hidden size (drafters that read hidden
    states declare `target_hidden_size`), or hidden layers the target does not have."""
    config = target.config.get_text_config()
    vocab = _target_vocab(target)
    problems = []
    if drafter.vocab_size != vocab:
        problems.append(f"its vocabulary is {drafter.vocab_size}, the target's {vocab}")
    hidden = getattr(drafter, "target_hidden_size", None)
    if hidden is not None and hidden != config.hidden_size:
        problems.append(f"it reads hidden states of size {hidden}, the target's are {config.hidden_size}")
    bad = [i for i in drafter.hidden_layers if not 0 <= i < config.num_hidden_layers]
    if bad:
        problems.append(f"it reads layers {bad}, the target has layers 0..{config.num_hidden_layers - 1}")
    if problems:
        raise ValueError(f"{type(drafter).__name__} does not fit this target: " + "; ".join(problems))


__all__ = [
    "NAMES",
    "DraftState",
    "Drafter",
    "OracleDrafter",
    "PromptLookupDrafter",
    "Proposal",
    "check_compatible",
    "load_drafter",
]
