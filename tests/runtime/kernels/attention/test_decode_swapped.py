"""The decode kernel's transposed walk (span._block_t, DecodeKernelConfig.swapped) against a dense float32 reference:
float32 exactly; an e4m3 pool widened to halves with its Q K^T in FP8 (queries on e4m3's grid at a power-of-two
scale, so that the kernel's per-row quantization does not round: Triton 3.9's interpreter rounds float32 to e4m3
wrongly near 128), and at 16 dimensions (too few for an FP8 dot) with K widened too; an e5m2 pool (K widened); one
and two splits and a chunked pass, Triton's pipeline and the prefetching walk. On the CPU under TRITON_INTERPRET=1
(a subprocess), or on CUDA. And, built for sm_90, the walk's loop runs both products on the warpgroup MMA (Q K^T on
the FP8 one), widens V alone and takes fewer instructions than the plain walk."""
from __future__ import annotations

import pytest
import torch

from tests.runtime.kernels.attention.test_decode_attn_variants import make_case, reference
from tests.runtime.kernels.quant.test_int4_mma import _bundled_ptxas
from tests.triton_interpret import interpreter_works, run_under_interpreter

MARKER = "swapped decode passed"


def run_cases(device: str) -> None:
    from radixlm.runtime.cache.kv_quant import quantize_kv
    from radixlm.runtime.kernels.attention.decode import decode_attention
    from radixlm.runtime.kernels.attention.decode_splits import DecodeKernelConfig, KvWiden

    # e4m3 at 16 dimensions: too narrow for Triton's FP8 dot (K >= 32), so K is widened too (decode.fp8_query).
    for pool, head_dim in (("f32", 32), ("e4m3", 32), ("e4m3", 16), ("e5m2", 32)):
        q, k, v, rt, rows, seq_lens = make_case(3, 8, 2, head_dim, 0, 1, torch.float32, device, seed=7,
                                                lens=[5, 130, 64])
        if pool == "f32":
            scales, pool_k, pool_v, tol = (1.0, 1.0), k, v, 1e-5
        else:
            dtype = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[pool]
            scales = (0.5, 2.0)
            pool_k, pool_v = quantize_kv(k * 4, 0.5, dtype), quantize_kv(v * 0.1, 2.0, dtype)
            grid = (q * 60).to(torch.float8_e4m3fn).float()
            grid[..., 0] = 448.0  # each row's largest: its scale is 2^-6, q / scale the grid itself
            q, tol = (grid * 2.0 ** -6).to(torch.float16), 2e-3
        want = reference(q, pool_k.float() * scales[0], pool_v.float() * scales[1], rt, rows, seq_lens, 0.25)
        for block_n, stages, prefetch in ((64, 2, 0), (64, 1, 1), (128, 3, 0)):
            config = DecodeKernelConfig(block_n, 4, stages, prefetch, widen=KvWiden.F16, swapped=True)
            for splits in (1, 2, None):  # None: a chunked pass (its work list)
                got = decode_attention(q, pool_k, pool_v, rt, rows, seq_lens, 0.25, int(seq_lens.max()), splits,
                                       chunked=splits is None, k_scale=scales[0], v_scale=scales[1], config=config)
                assert got.dtype == q.dtype and got.shape == q.shape
                err = ((got.float() - want).abs().max() / want.abs().max()).item()
                assert err <= tol, (pool, head_dim, block_n, prefetch, splits, err)
    print(MARKER)


if __name__ == "__main__":
    run_cases("cpu")


@pytest.mark.skipif(not interpreter_works(), reason="needs Triton's interpreter, 3.7 or later")
def test_swapped_walk_matches_reference_interpreted():
    run_under_interpreter(__file__, MARKER, hide_cuda=True, timeout=300)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA")
def test_swapped_walk_matches_reference_cuda():
    run_cases("cuda")


@pytest.mark.skipif(not _bundled_ptxas(), reason="needs Triton's bundled ptxas")
def test_swapped_walk_runs_on_the_warpgroup_mma_sm90():
    from tests.runtime.kernels.attention.test_decode_kv_widen import _loop_ops

    fp8_qk, plain = _loop_ops("f16", swapped=True), _loop_ops("f16")
    assert fp8_qk["QGMMA.64"] > 0 and fp8_qk["HGMMA.64"] > 0 and not any(op.startswith("HMMA") for op in fp8_qk)
    # Per thread and 128-position block: V's 128 x 128 e4m3 over 128 threads, two a packed cvt; K is not widened.
    assert fp8_qk["F2FP.F16.E4M3.UNPACK_B"] == 64 and plain["F2FP.F16.E4M3.UNPACK_B"] == 128
    # The runtime's swapped walk stacks 8 query rows a program (decode.py's block_h), half the softmax's: 518
    # instructions a loop against the plain walk's 719 under Triton 3.9 (on the warpgroup MMA), 614 against 724 under
    # Triton 3.6 (which builds its products with mma.sync at 8 rows, K widened).
    narrow = _loop_ops("f16", swapped=True, block_h=8)
    assert sum(narrow.values()) < 0.9 * sum(plain.values())
