"""The quantized GEMMs' CUDA paths at real shapes (Llama-3.1-8B's o_proj and down_proj, a Qwen-like qkv with bias,
odd sizes that _scaled_mm refuses) against reference.py, each row bucket; CUDA-graph capture and replay; no Triton
build after a layer's warm-up (kernels.quant.warm_up_linear). Skipped without CUDA."""
from __future__ import annotations

import pytest
import torch

from radixlm.runtime.kernels import quant
from radixlm.runtime.kernels.quant import reference as ref
from radixlm.runtime.kernels.quant.fp8_gemm import W8A16_DEFAULT_MAX_ROWS, tuned_gemv
from radixlm.runtime.kernels.quant.fp8_w8a16 import W8A16_MAX_ROWS

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

ROWS = (1, 2, 3, 8, 16, 33, 100, 300)  # every row bucket (kernels/quant/tiles.py)


def _fp8_ok() -> bool:
    return torch.cuda.get_device_capability() >= (8, 9)


def _close(got: torch.Tensor, want: torch.Tensor, tol: float) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    err = (got.float() - want.float()).abs().max().item()
    assert err <= tol * want.float().abs().max().item(), (err, want.float().abs().max().item())


def _fp8_weight(n: int, k: int, mode: str):
    w = torch.randn(n, k, device="cuda") * 0.02
    block = (128, 128) if mode == "block" else None
    q, s = ref.quant_fp8(w, block=block, per_channel=mode == "channel")
    return q, s, block


@pytest.mark.parametrize("mode", ["tensor", "channel", "block"])
@pytest.mark.parametrize("n,k,bias", [(4096, 4096, False), (4096, 14336, False), (1280, 1024, True), (200, 1000, True)])
def test_fp8_linear_matches_the_reference(mode, n, k, bias):
    if not _fp8_ok():
        pytest.skip("no FP8 tensor cores")
    from radixlm.runtime.kernels.quant.fp8_gemm import fp8_linear_cuda

    q, s, block = _fp8_weight(n, k, mode)
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16) if bias else None
    for m in ROWS:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        got = quant.fp8_linear(x, q, s, block, b)
        # Up to W8A16_DEFAULT_MAX_ROWS, and where this GPU's tuned table names the few-row kernel (fp8_gemv.py) for
        # the shape, the weight-only arithmetic (activations not quantized: reference.fp8_linear's), else the W8A8
        # kernels (fp8_linear_w8a8's); each within the activations' FP8 rounding of the other.
        weight_only = m <= W8A16_DEFAULT_MAX_ROWS or tuned_gemv(x, q, block) is not None
        exact, other = ((ref.fp8_linear, ref.fp8_linear_w8a8) if weight_only
                        else (ref.fp8_linear_w8a8, ref.fp8_linear))
        _close(got, exact(x, q, s, block, b), 2e-2)  # the same arithmetic, other summation order
        _close(got, other(x, q, s, block, b), 8e-2)
        if m <= W8A16_MAX_ROWS:  # and each few-row path forced (the tuned few-row kernel, where named, runs first)
            _close(fp8_linear_cuda(x, q, s, block, b, w8a16_max_rows=0), exact(x, q, s, block, b), 2e-2)
            _close(fp8_linear_cuda(x, q, s, block, b, w8a16_max_rows=W8A16_MAX_ROWS), ref.fp8_linear(x, q, s, block, b),
                   2e-2)
    if mode != "block":
        for m in (5, 40):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            static = x.float().abs().max() / ref.FP8_MAX
            want = ref.fp8_linear(x, q, s, None, b) if m <= W8A16_DEFAULT_MAX_ROWS else ref.fp8_linear_w8a8(
                x, q, s, None, b, static)
            _close(quant.fp8_linear(x, q, s, None, b, static), want, 2e-2)
            xh = x.half()  # float16: row-wise _scaled_mm gives bfloat16 only -> the Triton kernel
            bh = b.half() if b is not None else None
            want = (ref.fp8_linear if m <= W8A16_DEFAULT_MAX_ROWS else ref.fp8_linear_w8a8)(xh, q, s, None, bh)
            _close(quant.fp8_linear(xh, q, s, None, bh), want, 2e-2)


@pytest.mark.parametrize("n,k,group,perm,bias", [(4096, 4096, 128, False, False), (4096, 14336, 128, True, False),
                                                  (1280, 1024, 32, False, True), (200, 1024, 1024, False, False)])
def test_int4_linear_matches_the_reference(n, k, group, perm, bias):
    qw, s, z = ref.quant_int4(torch.randn(n, k, device="cuda") * 0.02, group, dtype=torch.bfloat16)
    p = torch.randperm(k, device="cuda") if perm else None
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16) if bias else None
    for m in (*ROWS, 600):  # 600: the dequantize-then-GEMM path (int4_dequant.DEFAULT_MIN_ROWS)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        _close(quant.int4_linear(x, qw, s, z, group, p, b), ref.int4_linear(x, qw, s, z, group, p, b), 2e-2)


def test_zero_rows_give_an_empty_output():
    qw, s, z = ref.quant_int4(torch.randn(64, 256, device="cuda"), 128, dtype=torch.bfloat16)
    x = torch.empty(0, 256, device="cuda", dtype=torch.bfloat16)
    assert quant.int4_linear(x, qw, s, z, 128).shape == (0, 64)
    q, sc, _ = _fp8_weight(64, 256, "channel")
    assert quant.fp8_linear(x, q, sc).shape == (0, 64)


def _calls():
    calls = []
    qw, s, z = ref.quant_int4(torch.randn(4096, 4096, device="cuda") * 0.02, 128, dtype=torch.bfloat16)
    calls.append(("int4", 4096, lambda x: quant.int4_linear(x, qw, s, z, 128)))
    if _fp8_ok():
        for mode in ("channel", "block"):
            q, sc, block = _fp8_weight(1024, 4096, mode)
            calls.append((mode, 4096, lambda x, q=q, sc=sc, block=block: quant.fp8_linear(x, q, sc, block)))
        q, sc, _ = _fp8_weight(200, 1000, "channel")  # _scaled_mm refuses it: the Triton kernel
        calls.append(("odd", 1000, lambda x: quant.fp8_linear(x, q, sc)))
    return calls


def test_every_path_replays_in_a_cuda_graph():
    for name, k, fn in _calls():
        for m in (1, 2, 4, 8, 16, 100):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            fn(x)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                y = fn(x)
            x.copy_(torch.randn_like(x))
            graph.replay()
            torch.testing.assert_close(y, fn(x), rtol=0, atol=0, msg=f"{name} at {m} rows")


def _built() -> int:
    from radixlm.runtime.kernels.quant import fp8_act, fp8_gemm, fp8_w8a16, int4_dequant, int4_gemm, int4_gemv, splitk

    kernels = (fp8_act._quant_rows_kernel, fp8_act._quant_groups_kernel, fp8_gemm._w8a8_kernel,
               fp8_w8a16._w8a16_kernel, int4_gemm._w4a16_nibbles_kernel, int4_gemm._w4a16_kernel,
               int4_gemv._w4a16_gemv_kernel, int4_dequant._dequant_int4_kernel, splitk._reduce_splits_kernel)
    return sum(len(cache[0]) for k in kernels for cache in k.device_caches.values())


def test_no_build_after_warm_up():
    calls = _calls()
    for name, k, fn in calls:  # the INT4 layer also at its dequantize-then-GEMM path's first row count
        quant.warm_up_linear(fn, k, torch.bfloat16, "cuda", extra_rows=(512,) if name == "int4" else ())
    built = _built()
    for _, k, fn in calls:
        for m in (2, 3, 4, 6, 8, 12, 16, 17, 31, 64, 77, 128, 255, 256, 511, 1000):
            x = torch.randn(m + 1, k, device="cuda", dtype=torch.bfloat16)[1:]  # rows at an odd offset too
            fn(x)
    assert _built() == built


def test_block_weights_take_torchs_block_scaling_on_hopper():
    if not _fp8_ok():
        pytest.skip("no FP8 tensor cores")
    from radixlm.runtime.kernels.quant import tiles
    from radixlm.runtime.kernels.quant.fp8_gemm import FP8_CONFIGS, block_scaled_mm_ok, fp8_block_linear

    q, s, block = _fp8_weight(1024, 2048, "block")
    b = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(200, 2048, device="cuda", dtype=torch.bfloat16)
    hopper = torch.cuda.get_device_capability() == (9, 0)
    assert block_scaled_mm_ok(x, q, s, block) == hopper
    assert not block_scaled_mm_ok(x.half(), q, s, block) and not block_scaled_mm_ok(x, q, s, (64, 128))
    for m in (3, 5, 64, 200):  # rows padded to BLOCK_SCALED_ROWS where cuBLASLt refuses them (5)
        triton_path = fp8_block_linear(x[:m], q, s, block, b, cfg=FP8_CONFIGS[tiles.bucket_of(m)])
        got = fp8_block_linear(x[:m], q, s, block, b)
        _close(got, ref.fp8_linear_w8a8(x[:m], q, s, block, b), 2e-2)
        rel = ((got.float() - triton_path.float()).norm() / triton_path.float().norm()).item()
        assert rel < 5e-3, (m, rel)  # the two differ by the output's rounding (2.5e-3 at 3 rows, 2e-5 at 200)
    y = fp8_block_linear(x, q, s, block, b)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = fp8_block_linear(x, q, s, block, b)
    x.copy_(torch.randn_like(x))
    graph.replay()
    _close(y, ref.fp8_linear_w8a8(x, q, s, block, b), 2e-2)
