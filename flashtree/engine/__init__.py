"""The reference engine: tree speculative decoding with a transformers target and a flashtree drafter."""

from .generate import tree_generate
from .records import GenerateResult, StepRecord

__all__ = ["GenerateResult", "StepRecord", "tree_generate"]
