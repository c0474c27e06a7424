"""flashtree: multi-candidate tree speculative decoding for block drafters."""

__version__ = "0.1.0"
