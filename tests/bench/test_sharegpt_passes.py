"""What benchmarks/peers/peer_side_by_side.py passes relies on, without a GPU (benchmarks/lib/profiling.py): passes
grouped by row count with their device and idle time, and the exclusion of a few-row GEMM kernel from start-up's
choice."""
from __future__ import annotations

import pytest

from benchmarks.lib import profiling


def test_buckets_split_prefill_and_decode_by_rows_with_busy_and_idle_time():
    passes = [{"rows": 1000, "prefill": True, "pass_us": 180_000.0, "gap_us": None},
              {"rows": 900, "prefill": False, "pass_us": 30_000.0, "gap_us": 20.0},
              {"rows": 7, "prefill": False, "pass_us": 6_000.0, "gap_us": 400.0},
              {"rows": 8, "prefill": False, "pass_us": 6_400.0, "gap_us": 200.0},
              {"rows": 9, "prefill": False, "pass_us": 7_000.0, "gap_us": 0.0}]
    rows = {r["bucket"]: r for r in profiling.pass_buckets(passes)}
    assert list(rows) == ["prefill", "<= 8", "<= 16", "<= 1024"]
    assert rows["<= 8"]["passes"] == 2 and rows["<= 8"]["pass_us_mean"] == 6_200.0
    assert rows["<= 8"]["gap_us_mean"] == 300.0 and rows["<= 8"]["idle_s"] == pytest.approx(600e-6)
    assert rows["prefill"]["gap_us_mean"] is None and rows["prefill"]["busy_s"] == pytest.approx(0.18)
    assert sum(r["share"] for r in rows.values()) == pytest.approx(1.0)


def test_exclude_kernels_leaves_them_out_of_the_measured_choice(monkeypatch):
    from radixlm.runtime.kernels.gemm import dispatch as gemm

    seen = []

    def fastest(kernels, *rest):
        seen.append(set(kernels))
        return next(iter(kernels))

    monkeypatch.setattr(gemm, "_fastest", fastest)
    profiling.exclude_gemm_kernels(["skinny_mma"])
    both = {gemm.GemmKernel.SKINNY: None, gemm.GemmKernel.SKINNY_MMA: None}
    assert gemm._fastest(both) is gemm.GemmKernel.SKINNY and seen == [{gemm.GemmKernel.SKINNY}]
    assert gemm._fastest({gemm.GemmKernel.SKINNY_MMA: None}) is gemm.GemmKernel.CUBLAS and len(seen) == 1
