"""benchmarks/decode_order_check.py, the H200 check that the decode-order kernel equals sglang's decode kernel bit
for bit: its harness on one tiny case under the Triton interpreter (where the dots are numpy's, so close, not equal)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))  # as when it runs as a script
import decode_order_check  # noqa: E402


def test_check_compares_the_three_paths_on_one_case():
    result = decode_order_check.check(decode_order_check.QUICK[0], torch.device("cpu"))
    assert result["rows"] == 2 * 5 and result["max_abs_diff"] < 1e-5 and result["fast_max_abs_diff"] < 1e-5
    assert set(result["us"]) == {"sglang_decode_rows", "decode_order", "splitkv_fast"}


def test_a_differing_row_is_counted_and_fails_the_run(monkeypatch, capsys):
    real = decode_order_check.decode_order_verify_triton

    def off_by_one_ulp(*args, out, **kwargs):
        real(*args, out=out, **kwargs)
        out[3] = torch.nextafter(out[3], torch.full_like(out[3], float("inf")))
        return out

    monkeypatch.setattr(decode_order_check, "decode_order_verify_triton", off_by_one_ulp)
    result = decode_order_check.check(decode_order_check.QUICK[0], torch.device("cpu"))
    assert result["rows_differing"] >= 1 and result["bit_equal"] is False
