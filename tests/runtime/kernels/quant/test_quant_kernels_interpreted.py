"""The quantized GEMMs' Triton kernels (kernels/quant: fp8_act, fp8_gemm, fp8_w8a16, int4_gemm, int4_gemv, splitk)
against reference.py on small shapes, on the CPU under TRITON_INTERPRET=1 in a subprocess: every row bucket's tile
config, split K, K and N past a tile, bias, act-order permutation, static activation scales, and torch._scaled_mm's
call as the CUDA path makes it."""
from __future__ import annotations

import pytest
import torch

from tests.triton_interpret import interpreter_works, run_under_interpreter

MARKER = "quant kernel cases passed"


def _close(got: torch.Tensor, want: torch.Tensor, tol: float) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape, got.dtype, want.dtype)
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol * want.float().abs().max().item())


def act_cases(g: torch.Generator) -> None:
    from radixlm.runtime.kernels.quant import fp8_act, reference as ref

    for m, k in ((1, 96), (3, 1100), (5, 384), (2, fp8_act.WHOLE_ROW_MAX + 16)):  # the last: in TOKEN_BLOCK steps
        x = torch.randn(m, k, generator=g) * 3
        x[0, :] = 0.0  # an all-zero row takes the epsilon scale
        q, s = fp8_act.quant_fp8_per_token(x)
        rq, rs = ref.quant_fp8_act(x)
        assert q.dtype == ref.FP8_DTYPE and s.shape == (m, 1)
        torch.testing.assert_close(s, rs, rtol=1e-6, atol=0)
        assert torch.equal(q.float(), rq.float())
        static = torch.tensor(0.05)
        q, s = fp8_act.quant_fp8_per_token(x, static)
        assert torch.equal(q.float(), ref.quant_fp8_act(x, static_scale=static)[0].float()) and s.numel() == 1
        for group in (32, 128):
            q, s = fp8_act.quant_fp8_per_group(x, group)
            rq, rs = ref.quant_fp8_act(x, group)
            assert s.shape == (m, -(-k // group))
            torch.testing.assert_close(s, rs, rtol=1e-6, atol=0)
            assert torch.equal(q.float(), rq.float())
            qc, sc = fp8_act.quant_fp8_per_group(x, group, column_major=True, rows_multiple=4)  # torch's layout
            rows = -(-m // 4) * 4
            assert qc.shape == (rows, k) and sc.shape == (rows, s.shape[1]) and sc.stride() == (1, rows)
            assert torch.equal(sc[:m], s) and torch.equal(qc[:m].float(), q.float())


def fp8_cases(g: torch.Generator) -> None:
    from radixlm.runtime.kernels.quant import fp8_gemm, reference as ref

    # Block weights: every row bucket (1, 5, 20, 70 rows; 257 is the same kernel with BLOCK_M 128), N and K past
    # a block, split K at one row (K = 1024: 8 K tiles).
    for n, k, bias in ((200, 320, True), (128, 1024, False)):
        w, s = ref.quant_fp8(torch.randn(n, k, generator=g) * 0.05, block=(128, 128))
        b = torch.randn(n, generator=g) if bias else None
        for m in (1, 5, 20, 70):
            x = torch.randn(m, k, generator=g)
            _close(fp8_gemm.fp8_block_linear(x, w, s, (128, 128), b), ref.fp8_linear_w8a8(x, w, s, (128, 128), b),
                   1e-4)
            # and within FP8's rounding of the activations of the unquantized-activation reference
            _close(fp8_gemm.fp8_block_linear(x, w, s, (128, 128), b), ref.fp8_linear(x, w, s, (128, 128), b), 0.1)
    # Per-channel and per-tensor weights where _scaled_mm refuses the shape (K, N not multiples of 16; float32 out):
    # the kernel's per-channel mode; a static input scale.
    for n, k in ((72, 200), (48, 1040)):
        wf = torch.randn(n, k, generator=g) * 0.05
        b = torch.randn(n, generator=g)
        for per_channel in (True, False):
            w, s = ref.quant_fp8(wf, per_channel=per_channel)
            for m, static in ((1, None), (6, None), (20, torch.tensor(0.02)), (70, None)):
                x = torch.randn(m, k, generator=g)
                assert not fp8_gemm.scaled_mm_ok(x, w, per_tensor=static is not None and not per_channel) or k % 16 == 0
                got = fp8_gemm.fp8_scaled_linear(x, w, s, b, static) if k % 16 else fp8_gemm._w8a8(
                    *_act(x, static), w, s, None, b, x.dtype)
                _close(got, ref.fp8_linear_w8a8(x, w, s, None, b, static), 1e-4)
    # torch._scaled_mm as the CUDA path calls it (bfloat16, row-wise scales; two scalars with a static input scale).
    w, s = ref.quant_fp8(torch.randn(64, 128, generator=g) * 0.05, per_channel=True)
    wt, st = ref.quant_fp8(torch.randn(64, 128, generator=g) * 0.05)
    for m in (1, 3):
        x = torch.randn(m, 128, generator=g).to(torch.bfloat16)
        b = torch.randn(64, generator=g).to(torch.bfloat16)
        assert fp8_gemm.scaled_mm_ok(x, w, per_tensor=False)
        static = torch.tensor(0.03)
        for rows in (0, fp8_gemm.SCALED_MM_MIN_ROWS):  # _scaled_mm, then the default (the Triton kernel at decode)
            _close(fp8_gemm.fp8_scaled_linear(x, w, s, b, None, rows), ref.fp8_linear_w8a8(x, w, s, None, b), 2e-2)
            _close(fp8_gemm.fp8_scaled_linear(x, wt, st, None, static, rows),
                   ref.fp8_linear_w8a8(x, wt, st, None, None, static), 2e-2)
            _close(fp8_gemm.fp8_scaled_linear(x, wt, st, None, None, rows), ref.fp8_linear_w8a8(x, wt, st), 2e-2)


def w8a16_cases(g: torch.Generator) -> None:
    """The weight-only decode kernel (fp8_w8a16.py) against reference.fp8_linear: per tensor, per channel and
    blocks; the tensor cores (1 and 6 rows in a 16-row tile; the default) and the CUDA cores (1 and 3 rows: ROWS 1
    and 4); K past a tile, several K blocks per tile, blocks narrower than the tile along K."""
    from radixlm.runtime.kernels.quant import fp8_w8a16, reference as ref

    fma, dot = fp8_w8a16.W8A16Config(16, 128, 4, 1), fp8_w8a16.W8A16Config(16, 64, 4, 1)
    for n, k, mode in ((72, 200, "tensor"), (48, 256, "channel"), (128, 320, (64, 32)), (64, 256, (128, 128))):
        block = mode if isinstance(mode, tuple) else None
        w, s = ref.quant_fp8(torch.randn(n, k, generator=g) * 0.05, block=block, per_channel=mode == "channel")
        b = torch.randn(n, generator=g)
        for m, fma_rows in ((1, 0), (6, 0), (1, 4), (3, 4)):
            x = torch.randn(m, k, generator=g)
            cfg = fma if fma_rows else dot
            assert fp8_w8a16.takes(m, block, cfg, fma=fma_rows > 0)
            _close(fp8_w8a16.w8a16_linear(x, w, s, block, b, cfg, fma_rows), ref.fp8_linear(x, w, s, block, b), 1e-4)
    assert not fp8_w8a16.takes(1, (8, 128), fma, fma=True) and not fp8_w8a16.takes(17, None)
    assert fp8_w8a16.takes(16, (8, 128)) and not fp8_w8a16.takes(5, None, fma, fma=True)
    sms = 132  # the default configs: WIDE where N gives two programs an SM, else NARROW
    assert fp8_w8a16.config_for(1, 28672, None, sms) == fp8_w8a16.WIDE[False]
    assert fp8_w8a16.config_for(16, 4096, (128, 128), sms) == fp8_w8a16.NARROW[True]
    assert fp8_w8a16.config_for(2, 4096, None, sms, fma_max_rows=4) == fp8_w8a16.FMA_CONFIG


def _act(x: torch.Tensor, static: torch.Tensor | None):
    from radixlm.runtime.kernels.quant import fp8_act

    return fp8_act.quant_fp8_per_token(x, static)


def int4_cases(g: torch.Generator) -> None:
    from radixlm.runtime.kernels.quant import int4_gemm, reference as ref

    # (N, K, group): K tiles of 32 (split K at one row: 8 tiles), 64 (_w4a16_kernel), 128 and one group (K not a
    # multiple of the tile; _w4a16_nibbles_kernel).
    for n, k, group, symmetric in ((96, 256, 32, False), (136, 192, 64, True), (80, 256, 128, False),
                                   (64, 200, 200, False)):
        qw, sc, zs = ref.quant_int4(torch.randn(n, k, generator=g) * 0.05, group, symmetric=symmetric)
        b = torch.randn(n, generator=g)
        perm = torch.randperm(k, generator=g)
        for m in (1, 3, 5, 20):  # the tensor cores: 16-row tiles (1, 3, 5), 64-row (20)
            x = torch.randn(m, k, generator=g)
            _close(int4_gemm.w4a16_linear(x, qw, sc, zs, group), ref.int4_linear(x, qw, sc, zs, group), 1e-4)
            _close(int4_gemm.w4a16_linear(x, qw, sc, zs, group, perm, b),
                   ref.int4_linear(x, qw, sc, zs, group, perm, b), 1e-4)
    for m in (1, 9):  # the nibbles kernel's 16-bit magic numbers
        x = torch.randn(m, 256, generator=g).to(torch.float16)  # (bfloat16 dots are wrong in the interpreter)
        qw, sc, zs = ref.quant_int4(torch.randn(64, 256, generator=g) * 0.05, 128, dtype=torch.float16)
        _close(int4_gemm.w4a16_linear(x, qw, sc, zs, 128), ref.int4_linear(x, qw, sc, zs, 128), 2e-2)
    # the GEMV (off by default) forced at every decode bucket, group 128 and 32 (what the benchmark times beside the
    # defaults), with an act-order permutation and bias
    for k, group in ((256, 128), (128, 32)):
        qw, sc, zs = ref.quant_int4(torch.randn(40, k, generator=g) * 0.05, group)
        perm, b = torch.randperm(k, generator=g), torch.randn(40, generator=g)
        for m in (1, 2, 3, 6, 11):  # ROWS 1, 2, 4, 8, 16
            x = torch.randn(m, k, generator=g)
            _close(int4_gemm.w4a16_linear(x, qw, sc, zs, group, perm, b, gemv_max_rows=16),
                   ref.int4_linear(x, qw, sc, zs, group, perm, b), 1e-4)
    qw, sc, zs = ref.quant_int4(torch.randn(64, 256, generator=g) * 0.05, 32)
    x = torch.randn(2, 256, generator=g)
    _close(int4_gemm.w4a16_linear(x, qw, sc, zs, 32, gemv_max_rows=0), ref.int4_linear(x, qw, sc, zs, 32), 1e-4)
    qw, sc, zs = ref.quant_int4(torch.randn(48, 256, generator=g) * 0.05, 128)
    old = int4_gemm.TileConfig(16, 64, 4, 1, True, nibbles=False)  # the reshaping kernel where nibbles could run
    _close(int4_gemm.w4a16_linear(x, qw, sc, zs, 128, gemv_max_rows=0, cfg=old), ref.int4_linear(x, qw, sc, zs, 128),
           1e-4)


def patch_interpreter_fp8_rounding() -> None:
    """Triton's interpreter (3.9) rounds float32 -> float8e4nv half up and drops the mantissa's carry (-125.87 became
    -64, not -128); the GPU's conversion rounds to nearest even, as torch does. The interpreter's conversion is
    replaced with torch's for that pair, so that the kernels' other arithmetic is what these cases check."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    convert = interpreter._convert_float

    def fixed(input, input_dtype, output_dtype, rounding_mode):
        if output_dtype == tl.float8e4nv and input_dtype == tl.float32:
            t = torch.from_numpy(np.ascontiguousarray(input).view(np.float32).copy())
            return t.to(torch.float8_e4m3fn).view(torch.uint8).numpy().reshape(input.shape)
        return convert(input, input_dtype, output_dtype, rounding_mode)

    interpreter._convert_float = fixed


def run_cases() -> None:
    patch_interpreter_fp8_rounding()
    g = torch.Generator().manual_seed(0)
    act_cases(g)
    fp8_cases(g)
    w8a16_cases(g)
    int4_cases(g)
    print(MARKER)


@pytest.mark.skipif(not interpreter_works() or torch.cuda.is_available(), reason="needs triton's interpreter, no CUDA")
def test_quant_kernels_match_the_reference_interpreted():
    run_under_interpreter(__file__, MARKER, hide_cuda=True, timeout=300)


if __name__ == "__main__":
    run_cases()
