"""The few-row GEMM kernels and their dispatch on CUDA (skinny_gemm.py, dispatch.py: measurement, prologue and
epilogue) against float32 and cuBLAS references, on fresh random inputs (run on the GPU machine; skipped without
CUDA)."""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m, n, k, bias", [(1, 4096, 14336, False), (2, 1000, 576, True), (3, 77, 64, True),
                                           (4, 28672, 4096, False), (2, 6144, 4100, False)])
def test_skinny_linear_matches_a_float32_reference(dtype, m, n, k, bias):
    from radixlm.runtime.kernels.gemm.skinny_gemm import skinny_linear, usable

    x = torch.randn(m, k, device="cuda", dtype=dtype)
    w = torch.randn(n, k, device="cuda", dtype=dtype) * k**-0.5
    b = torch.randn(n, device="cuda", dtype=dtype) if bias else None
    assert usable(x, w)
    ref = x.float() @ w.float().T + (b.float() if bias else 0)
    got = skinny_linear(x, w, b)
    assert got.dtype == dtype and got.shape == (m, n)
    # One rounding of a float32 accumulation, as F.linear: within the dtype's half-ulp of the exact value.
    torch.testing.assert_close(got.float(), ref, rtol=1e-2 if dtype == torch.bfloat16 else 2e-3, atol=1e-2)


def test_gemm_dispatch_measures_once_per_row_count_and_matches_cublas():
    import torch.nn.functional as F

    from radixlm.runtime.kernels.gemm import dispatch as gemm

    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16) * 0.02
    choices: dict[int, bool] = {}
    for m in (1, 2, 4, 40):
        x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
        torch.testing.assert_close(gemm.linear(x, w, None, None, choices), F.linear(x, w), rtol=2e-2, atol=2e-2)
    assert set(choices) == {1, 2, 4}  # 40 rows: past both Triton kernels (test_skinny_mma.py: up to 32 rows)


def test_gemm_timing_replays_each_candidate_and_ranks_a_heavier_one_slower():
    """gemm._time_us times each candidate's CUDA-graph replay: the calls' effects land (here: eight matmuls against
    one), the heavier candidate measures slower, and no capture is left open on the caller's stream."""
    from radixlm.runtime.kernels.gemm import dispatch as gemm

    a = torch.randn(1024, 1024, device="cuda")
    outs = torch.zeros(2, device="cuda")

    def light():
        outs[0] += 1
        return a @ a

    def heavy():
        outs[1] += 1
        return [a @ a for _ in range(8)]

    light_us, heavy_us = gemm._time_us([light, heavy], lambda: None, reps=5)
    assert 0 < light_us < heavy_us
    assert not torch.cuda.is_current_stream_capturing()
    torch.cuda.synchronize()
    assert outs.tolist() == [1 + 1 + 5, 1 + 1 + 5]  # the uncaptured first call, the first replay, one per rep


def test_gemm_timing_holds_no_memory_past_its_measurements():
    """Start-up times hundreds of GEMMs: once the allocator's cache is emptied (as the decode graphs' capture does),
    the measurements' graphs and streams leave no memory reserved (a cuBLAS workspace per stream would)."""
    from radixlm.runtime.kernels.gemm import dispatch as gemm

    w = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(2, 1024, device="cuda", dtype=torch.bfloat16)
    fns = [lambda: x @ w.t(), lambda: torch.nn.functional.linear(x, w)]
    gemm._time_us(fns, lambda: None, reps=2)
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved()
    for _ in range(40):
        gemm._time_us(fns, lambda: None, reps=2)
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() - before < 16 << 20


def _prologue_case(kind, m: int, k: int, dtype):
    from radixlm.runtime.layers.activation import SiluAndMul
    from radixlm.runtime.layers.norm import RMSNorm
    from radixlm.runtime.kernels.gemm.prologue import Prologue, PrologueKind

    if kind is PrologueKind.SILU_MUL:
        return Prologue(kind, SiluAndMul()), torch.randn(m, 2 * k, device="cuda", dtype=dtype) * 3
    norm = RMSNorm(k, 1e-5).cuda().to(dtype)
    norm.weight.data.normal_(1.0, 0.1)
    x = torch.randn(m, k, device="cuda", dtype=dtype) * 3
    res = torch.randn(m, k, device="cuda", dtype=dtype) if kind is PrologueKind.ADD_RMSNORM else None
    return Prologue(kind, norm, res), x


def _epilogue_case(hq: int, hkv: int, head_dim: int, dtype):
    """A RotaryStore of one token (position 3000, KV slot 5) into a fresh one-layer pool."""
    from radixlm.runtime.cache.memory_pool import TokenToKVPool
    from radixlm.runtime.kernels.gemm.epilogue import RotaryStore
    from radixlm.runtime.layers.rotary import get_rope

    pool = TokenToKVPool(16, 1, dtype, 1, hkv, head_dim, "cuda")
    return RotaryStore(get_rope(head_dim, 8192, 500000.0), torch.tensor([3000], device="cuda"),
                       torch.tensor([5], device="cuda"), pool.k_buffer[0], pool.v_buffer[0], hq * head_dim,
                       hkv * head_dim)


def test_gemm_dispatch_applies_the_epilogue_on_the_skinny_kernel_only():
    """gemm.linear at one row with a RotaryStore: on the skinny kernel q and k come back rotated and the KV is stored
    (applied); on cuBLAS or the tensor-core kernel, or at two rows, the plain GEMM and nothing stored."""
    import itertools

    import torch.nn.functional as F

    from radixlm.runtime.kernels.gemm import dispatch as gemm

    hq, hkv, d = 32, 8, 128
    w = torch.randn((hq + 2 * hkv) * d, 4096, device="cuda", dtype=torch.bfloat16) * 0.02
    for m, kernel in itertools.product((1, 2), gemm.GemmKernel):
        x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
        epi = _epilogue_case(hq, hkv, d, torch.bfloat16)
        got = gemm.linear(x, w, None, None, {m: kernel}, None, epi)
        q, k, v = F.linear(x, w).split([hq * d, hkv * d, hkv * d], dim=-1)
        assert epi.applied == (m == 1 and kernel is gemm.GemmKernel.SKINNY)
        if epi.applied:
            q, k = epi.rope(epi.positions, q.clone(), k.clone())
            torch.testing.assert_close(epi.k_buf[5], k.view(hkv, d), rtol=2e-2, atol=2e-2)
            torch.testing.assert_close(epi.v_buf[5], v.view(hkv, d), rtol=2e-2, atol=2e-2)
        else:
            assert not epi.k_buf.any() and not epi.v_buf.any()
        torch.testing.assert_close(got, torch.cat([q, k, v], dim=-1), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", [1, 2, 3, 4])
@pytest.mark.parametrize("kind_name", ["RMSNORM", "ADD_RMSNORM", "SILU_MUL"])
def test_skinny_prologue_matches_the_unfused_step(dtype, m, kind_name, monkeypatch):
    """The fused step rounds where its own kernel does: SiLU-and-mul and the residual sum are bit-identical; a norm's
    float32 sum of squares is taken in another order, which may move a rare input by one unit in the last place.
    Both runs take one tile config at a time: the autotuner keys on the prologue, so left to it the two may take
    different BLOCK_K and sum the products in another order (float16 shows that in its last bit)."""
    import dataclasses

    from radixlm.runtime.kernels.gemm import skinny_gemm
    from radixlm.runtime.kernels.gemm.prologue import PrologueKind
    from radixlm.runtime.kernels.gemm.skinny_gemm import skinny_linear, usable

    kind = PrologueKind[kind_name]
    torch.manual_seed(m)
    n, k = 3072, 4096
    w = torch.randn(n, k, device="cuda", dtype=dtype) * k**-0.5
    for cfg in skinny_gemm._CONFIGS[:3]:  # BLOCK_K 512, 256, 512 with another BLOCK_N
        monkeypatch.setattr(skinny_gemm._skinny_kernel, "configs", [cfg])
        pro, x = _prologue_case(kind, m, k, dtype)
        unfused = dataclasses.replace(pro)
        ref = skinny_linear(unfused.apply(x), w)
        assert usable(x, w, pro)
        got = skinny_linear(x, w, None, pro)
        assert got.shape == (m, n) and got.dtype == dtype
        if kind is PrologueKind.ADD_RMSNORM:
            assert torch.equal(pro.residual_out, unfused.residual_out)
        if kind is PrologueKind.SILU_MUL:
            assert torch.equal(got, ref), cfg
        else:
            assert (got != ref).float().mean() < 0.01
            torch.testing.assert_close(got, ref, rtol=2e-2, atol=2e-2)


def test_gemm_dispatch_with_a_prologue_sets_the_residual_either_way():
    """gemm.linear with an ADD_RMSNORM prologue, on the skinny kernel (fused at one row, after the norm's own kernel
    at four), the tensor-core kernel (after it, from two rows) and cuBLAS: the output and the new residual match the
    norm's module followed by F.linear."""
    import dataclasses

    import torch.nn.functional as F

    from radixlm.runtime.kernels.gemm import dispatch as gemm
    from radixlm.runtime.kernels.gemm.prologue import PrologueKind

    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16) * 0.02
    for m, key in ((1, 1), (4, 4), (9, 16)):
        pro, x = _prologue_case(PrologueKind.ADD_RMSNORM, m, 4096, torch.bfloat16)
        normed, res = pro.module(x, pro.residual)
        for kernel in gemm.GemmKernel:
            p = dataclasses.replace(pro)
            got = gemm.linear(x, w, None, None, {key: kernel}, p)
            assert torch.equal(p.residual_out, res)
            torch.testing.assert_close(got, F.linear(normed, w), rtol=2e-2, atol=2e-2)


def test_skinny_prebuild_builds_every_kernel_the_autotuner_launches():
    """After prebuild, autotuning new shapes (every config, each row count, bias flag and, at the rows gemm.linear
    fuses them, prologue) builds nothing."""
    from triton import knobs

    from radixlm.runtime.kernels.gemm import skinny_gemm
    from radixlm.runtime.kernels.startup.kernel_builds import ParallelBuilds
    from radixlm.runtime.kernels.gemm.prologue import PrologueKind

    builds = ParallelBuilds("cuda")
    n = skinny_gemm.prebuild(builds, torch.bfloat16, "cuda", (False, True), epilogue_head_dim=128)
    fused_rows = sum(m <= skinny_gemm.PROLOGUE_MAX_M for m in skinny_gemm.SKINNY_ROWS)
    epilogue_kernels = 2 * 3  # one row, one config; bias or not; no prologue, RMSNORM, ADD_RMSNORM
    assert n == 2 * (len(skinny_gemm.SKINNY_ROWS) + fused_rows * len(PrologueKind)) * len(skinny_gemm._CONFIGS) + \
        epilogue_kernels
    assert builds.finish() == n - 1  # the first one is built in place
    misses: list[str] = []
    prev = knobs.runtime.jit_cache_hook
    knobs.runtime.jit_cache_hook = lambda *a, **kw: misses.append(str(kw.get("repr"))) or False
    try:
        for m in (1, 2, 3, 4):
            for n, k, bias in ((6160, 4112, False), (912, 4880, True)):  # shapes no other test autotunes
                w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5
                b = torch.randn(n, device="cuda", dtype=torch.bfloat16) if bias else None
                skinny_gemm.skinny_linear(torch.randn(m, k, device="cuda", dtype=torch.bfloat16), w, b)
                for kind in PrologueKind if m <= skinny_gemm.PROLOGUE_MAX_M else ():
                    pro, x = _prologue_case(kind, m, k, torch.bfloat16)
                    skinny_gemm.skinny_linear(x, w, b, pro)
            for bias in (False, True) if m <= skinny_gemm.EPILOGUE_MAX_M else ():  # q, k, v of 5, 2, 2 heads
                w = torch.randn(9 * 128, 4112, device="cuda", dtype=torch.bfloat16) * 0.02
                b = torch.randn(9 * 128, device="cuda", dtype=torch.bfloat16) if bias else None
                for kind in (None, PrologueKind.RMSNORM, PrologueKind.ADD_RMSNORM):
                    pro, x = _prologue_case(kind, m, 4112, torch.bfloat16) if kind else (None, None)
                    x = torch.randn(m, 4112, device="cuda", dtype=torch.bfloat16) if x is None else x
                    epi = _epilogue_case(5, 2, 128, torch.bfloat16)
                    assert skinny_gemm.takes_epilogue(x, w, epi)
                    skinny_gemm.skinny_linear(x, w, b, pro, epi)
        torch.cuda.synchronize()
    finally:
        knobs.runtime.jit_cache_hook = prev
    assert misses == [], misses[:3]
