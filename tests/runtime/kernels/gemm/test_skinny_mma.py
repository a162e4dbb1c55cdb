"""The tensor-core few-row GEMM (gemm/skinny_mma.py): each row's sum against a float32 reference, and bit-identical
whatever the other rows are and however many share its BLOCK_M (on the CPU under TRITON_INTERPRET=1 in a subprocess,
in float32 and float16; on CUDA in bfloat16 and float16); gemm.linear's choice keys and kernels, and the warm-up's row
counts that set them."""
from __future__ import annotations

import pytest
import torch

from tests.triton_interpret import interpreter_works, run_under_interpreter

MARKER = "skinny mma cases passed"


def _launch(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """One launch as skinny_mma_linear makes it, at two stages (the interpreter has no device to size them by)."""
    from radixlm.runtime.kernels.gemm import skinny_mma

    m, k = x.shape
    n = w.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    skinny_mma._skinny_mma_kernel[(-(-n // skinny_mma.BLOCK_N),)](
        x, w, bias if bias is not None else w, y, m, n, k, x.stride(0), w.stride(0), y.stride(0),
        HAS_BIAS=bias is not None, EVEN_K=k % skinny_mma.BLOCK_K == 0, BLOCK_M=skinny_mma.block_rows(m),
        BLOCK_N=skinny_mma.BLOCK_N, BLOCK_K=skinny_mma.BLOCK_K, num_warps=skinny_mma.NUM_WARPS, num_stages=2)
    return y


def run_cases(device: str, dtypes: tuple[torch.dtype, ...], launch=_launch) -> None:
    g = torch.Generator().manual_seed(0)
    # N past a multiple of BLOCK_N, K a multiple of BLOCK_K or not; 5..32 rows, both BLOCK_Ms.
    for dtype in dtypes:
        for n, k, bias in ((200, 512, False), (64, 272, True), (130, 96, False)):
            w = (torch.randn(n, k, generator=g) * k**-0.5).to(device, dtype)
            b = torch.randn(n, generator=g).to(device, dtype) if bias else None
            x = torch.randn(32, k, generator=g).to(device, dtype)
            ref = x.float() @ w.float().T + (b.float() if bias else 0)
            for m in (2, 5, 9, 16, 17, 32):
                got = launch(x[:m].contiguous(), w, b)
                assert got.shape == (m, n) and got.dtype == dtype
                tol = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1e-2}[dtype]
                torch.testing.assert_close(got.float(), ref[:m], rtol=tol, atol=tol)
            # A row's result depends on that row alone: the same at 2, 5 and 16 rows (BLOCK_M 16), and with other rows.
            at16, at32 = launch(x[:16].contiguous(), w, b), launch(x[:32].contiguous(), w, b)
            assert torch.equal(launch(x[:2].contiguous(), w, b), at16[:2])
            assert torch.equal(launch(x[:5].contiguous(), w, b), at16[:5])
            other = torch.cat([x[:3], torch.randn(13, k, generator=g).to(device, dtype)])
            assert torch.equal(launch(other, w, b)[:3], at16[:3])
            assert torch.equal(launch(x[:17].contiguous(), w, b), at32[:17])
            if device == "cuda":  # the MMA's column count (BLOCK_M) leaves each output element's sum alone
                assert torch.equal(at32[:16], at16)
    print(MARKER)


@pytest.mark.skipif(not interpreter_works() or torch.cuda.is_available(), reason="needs triton's interpreter, no CUDA")
def test_rows_match_a_float32_reference_and_each_other_interpreted():
    run_under_interpreter(__file__, MARKER, hide_cuda=True, timeout=600)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_rows_match_a_float32_reference_and_each_other_cuda(capsys):
    from radixlm.runtime.kernels.gemm.skinny_mma import skinny_mma_linear, usable

    x = torch.randn(8, 512, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(64, 512, device="cuda", dtype=torch.bfloat16)
    assert usable(x, w) and usable(x[:2], w) and not usable(x[:1], w) and not usable(torch.cat([x] * 5), w)
    assert not usable(x.float(), w.float())
    run_cases("cuda", (torch.bfloat16, torch.float16), launch=skinny_mma_linear)
    assert MARKER in capsys.readouterr().out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gemm_dispatch_keys_the_tensor_core_kernel_by_block_rows():
    """gemm.linear measures once per choice key: the row count up to 4 rows (the skinny kernel, the tensor-core one
    from 2 rows, cuBLAS), then 5..16 rows share key 16 and 17..32 key 32; each choice gives F.linear's values within
    a rounding, and a memo's choice runs the kernel it names (cuBLAS where that kernel cannot take the rows)."""
    import torch.nn.functional as F

    from radixlm.runtime.kernels.gemm import dispatch as gemm
    from radixlm.runtime.kernels.gemm.dispatch import GemmKernel
    from radixlm.runtime.kernels.gemm.skinny_gemm import skinny_linear
    from radixlm.runtime.kernels.gemm.skinny_mma import skinny_mma_linear

    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16) * 0.02
    choices: dict[int, GemmKernel] = {}
    for m in (1, 3, 5, 8, 16, 24, 32, 33):
        x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
        torch.testing.assert_close(gemm.linear(x, w, None, None, choices), F.linear(x, w), rtol=2e-2, atol=2e-2)
    assert set(choices) == {1, 3, 16, 32}  # 33 rows: always cuBLAS
    assert choices[1] in (GemmKernel.SKINNY, GemmKernel.CUBLAS)  # one row: never the tensor-core kernel
    x = torch.randn(12, 4096, device="cuda", dtype=torch.bfloat16)
    assert torch.equal(gemm.linear(x, w, None, None, {16: GemmKernel.SKINNY_MMA}), skinny_mma_linear(x, w))
    assert torch.equal(gemm.linear(x, w, None, None, {16: GemmKernel.CUBLAS}), F.linear(x, w))
    assert torch.equal(gemm.linear(x, w, None, None, {16: GemmKernel.SKINNY}), F.linear(x, w))
    x = x[:3]
    assert torch.equal(gemm.linear(x, w, None, None, {3: GemmKernel.SKINNY_MMA}), skinny_mma_linear(x, w))
    assert torch.equal(gemm.linear(x, w, None, None, {3: GemmKernel.SKINNY}), skinny_linear(x, w))


def test_choice_keys_and_the_warm_up_rows_that_set_them():
    from radixlm.runtime.kernels.gemm import skinny_mma
    from radixlm.runtime.kernels.gemm.dispatch import choice_keys, few_row_kernels
    from radixlm.runtime.kernels.startup.kernel_variants import mma_warmup_rows

    assert choice_keys() == (1, 2, 3, 4, 16, 32)
    assert [skinny_mma.block_rows(m) for m in (5, 16, 17, 32)] == [16, 16, 32, 32]
    assert mma_warmup_rows(None) == mma_warmup_rows(4096) == (16, 32)
    assert mma_warmup_rows(20) == (16, 20)  # a 20-row pass is the most that key 32 can meet
    assert mma_warmup_rows(16) == (16,) and mma_warmup_rows(8) == (8,)
    assert mma_warmup_rows(4) == ()
    # No Triton kernel takes these GEMMs (CPU tensors; past MMA_MAX_M rows on any device): no key either.
    w = torch.zeros(64, 256, dtype=torch.bfloat16)
    for m in (1, 3, 16, 33, 512):
        assert few_row_kernels(torch.zeros(m, 256, dtype=torch.bfloat16), w, None) is None


if __name__ == "__main__":
    run_cases("cpu", (torch.float32, torch.float16))
