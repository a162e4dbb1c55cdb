"""benchmarks/quality/fp8_kv_quality.py's comparison of a float8 cache's greedy outputs with the reference's: match
rates position by position, the first divergence, and |delta logprob| only where both runs saw the same tokens."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.quality import fp8_kv_quality  # noqa: E402


def test_compare_counts_matches_divergence_and_logprob_deltas():
    ref = [[(-0.1, 5), (-0.2, 6), (-0.3, 7)], [(-1.0, 1), (-1.0, 2)]]
    run = {"free": [[(-0.1, 5), (-0.4, 6), (-0.3, 7)], [(-1.5, 1), (-0.5, 9)]],
           "forced": [[(-0.2, 5), (-0.2, 6), (-0.3, 8)], [(-1.0, 1), (-2.0, 3)]],
           "kv_pool_tokens": 64, "kv_pool_dtype": "float8_e4m3fn", "wall_s": 1.0}
    row = fp8_kv_quality.compare(ref, run)
    assert row["greedy_match_rate"] == pytest.approx(4 / 5) and row["identical_outputs"] == 1
    assert row["mean_first_divergence"] == pytest.approx((3 + 1) / 2)
    # Free-running deltas: all of prompt 0, the first position of prompt 1 (before it diverged).
    assert row["mean_abs_dlogprob_free"] == pytest.approx((0 + 0.2 + 0 + 0.5) / 4)
    assert row["teacher_forced_match_rate"] == pytest.approx(3 / 5)
    assert row["mean_abs_dlogprob_forced"] == pytest.approx((0.1 + 0 + 0 + 0 + 1.0) / 5)
    assert row["max_abs_dlogprob_forced"] == pytest.approx(1.0)


def test_fp8_query_decode_is_undone():
    from radixlm.runtime.layers.attention.torch_native import TorchNativeAttnBackend

    plain = TorchNativeAttnBackend.forward_decode
    with fp8_kv_quality.fp8_query_decode():
        assert TorchNativeAttnBackend.forward_decode is not plain
    assert TorchNativeAttnBackend.forward_decode is plain
