"""Kernel tests run on a CUDA device at real shapes, or on CPU under Triton's interpreter at small shapes."""

import os

import torch

if not torch.cuda.is_available():
    # must be set before any Triton kernel is defined (decoration time)
    os.environ.setdefault("TRITON_INTERPRET", "1")
