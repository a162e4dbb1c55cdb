"""kernels/quant/fp8_prologue.py: the norm (with and without the residual add) or SiLU-and-mul with its output
quantized per token in one launch gives the bits of the two launches it replaces (fused_kernels' step, then
fp8_act.quant_fp8_per_token), residual sum included (on the CPU under TRITON_INTERPRET=1 in a subprocess, float32 and
float16; on CUDA bfloat16 and float16 at the 8B model's widths); and fp8_linear_cuda takes that path exactly where
its GEMM quantizes per token, with the result of the unfused step followed by the GEMM."""
from __future__ import annotations

import pytest
import torch

from tests.triton_interpret import interpreter_works, run_under_interpreter

MARKER = "fp8 prologue cases passed"


def _prologue(kind, k: int, m: int, dtype, device: str):
    from radixlm.runtime.kernels.gemm.prologue import Prologue, PrologueKind
    from radixlm.runtime.layers.activation import SiluAndMul
    from radixlm.runtime.layers.norm import RMSNorm

    if kind is PrologueKind.SILU_MUL:
        return Prologue(kind, SiluAndMul()), torch.randn(m, 2 * k, device=device).mul(3).to(dtype)
    norm = RMSNorm(k, 1e-5).to(device)
    norm.weight.data = (torch.randn(k, device=device) * 0.2 + 1).to(dtype)
    residual = torch.randn(m, k, device=device).to(dtype) if kind is PrologueKind.ADD_RMSNORM else None
    return Prologue(kind, norm, residual), torch.randn(m, k, device=device).mul(2).to(dtype)


def _two_launches(pro, x):
    """The unfused step through fused_kernels' own kernels (on CPU too: the reference here is the kernels' roundings,
    not the torch modules'), then the per-token quantization."""
    from radixlm.runtime.kernels.elementwise import fused_kernels as fk
    from radixlm.runtime.kernels.gemm.prologue import PrologueKind
    from radixlm.runtime.kernels.quant import fp8_act

    res = None
    if pro.kind is PrologueKind.SILU_MUL:
        y = fk.silu_and_mul(x)
    elif pro.residual is None:
        y = fk.rmsnorm(x, pro.norm_weight, pro.eps)
    else:
        y, res = fk.rmsnorm(x, pro.norm_weight, pro.eps, pro.residual)
    q, s = fp8_act.quant_fp8_per_token(y)
    return q, s, res


def run_cases(device: str) -> None:
    from radixlm.runtime.kernels.gemm.prologue import PrologueKind
    from radixlm.runtime.kernels.quant import fp8_prologue

    torch.manual_seed(0)
    if device == "cpu":
        cases = [(dtype, k, m) for dtype in (torch.float32, torch.float16) for k, m in ((96, 3), (1100, 2), (64, 0))]
    else:
        cases = [(dtype, k, m) for dtype in (torch.bfloat16, torch.float16) for k, m in ((4096, 64), (14336, 9),
                                                                                          (576, 1), (64, 0))]
    for dtype, k, m in cases:
        for kind in PrologueKind:
            pro, x = _prologue(kind, k, m, dtype, device)
            want_q, want_s, want_res = _two_launches(pro, x)
            q, s = fp8_prologue.quantized_rows(pro, x)
            where = f"{kind.name} {dtype} K {k}, {m} rows"
            assert q.dtype == torch.float8_e4m3fn and q.shape == (m, k) and s.shape == (m, 1), where
            assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)), where
            assert torch.equal(s, want_s), where
            if want_res is not None:
                assert torch.equal(pro.residual_out, want_res), where
    print(MARKER)


@pytest.mark.skipif(not interpreter_works() or torch.cuda.is_available(), reason="needs triton's interpreter, no CUDA")
def test_quantized_rows_equal_the_step_then_the_quantization_interpreted():
    run_under_interpreter(__file__, MARKER, hide_cuda=True, timeout=300)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_quantized_rows_equal_the_step_then_the_quantization_cuda():
    run_cases("cuda")


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
                    reason="needs FP8 tensor cores")
@pytest.mark.parametrize("rows", [1, 8, 64, 300])
def test_fp8_linear_with_a_prologue_equals_the_step_then_the_gemm(rows, monkeypatch):
    """Both with per-channel weights of the 8B model's shapes: at 1 row the tuned weight-only kernel (unfused step), at
    8-64 the tensor-core kernel, at 300 torch._scaled_mm (each fused where it quantizes per token): the same bits as
    the step applied first, residual sum included."""
    from radixlm.runtime.kernels.gemm.prologue import PrologueKind, apply
    from radixlm.runtime.kernels.quant import fp8_gemm, fp8_linear, fp8_prologue, quant_fp8

    fused = []
    run = fp8_prologue.quantized_rows
    monkeypatch.setattr(fp8_prologue, "quantized_rows", lambda pro, x: fused.append(pro.kind) or run(pro, x))

    for kind, (n, k) in ((PrologueKind.ADD_RMSNORM, (6144, 4096)), (PrologueKind.RMSNORM, (28672, 4096)),
                         (PrologueKind.SILU_MUL, (4096, 14336))):
        torch.manual_seed(rows)
        w, ws = quant_fp8(torch.randn(n, k, device="cuda") * k ** -0.5, per_channel=True)
        pro, x = _prologue(kind, k, rows, torch.bfloat16, "cuda")
        want = fp8_linear(apply(pro, x), w, ws)
        want_res = pro.residual_out
        pro.residual_out = None
        got = fp8_linear(x, w, ws, prologue=pro)
        assert torch.equal(got, want), (kind, rows)
        if kind is PrologueKind.ADD_RMSNORM:
            assert torch.equal(pro.residual_out, want_res)
        # Fused exactly where the GEMM quantizes per token: not where the tuned weight-only kernel runs.
        weight_only = fp8_gemm.tuned_gemv(x[:, :k], w, None) is not None
        assert fused == ([] if weight_only else [kind]), (kind, rows, fused)
        fused.clear()


if __name__ == "__main__":
    run_cases("cpu")
