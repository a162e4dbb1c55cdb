"""Programmatic dependent launch (kernels/pdl.py): off on the CPU, under RADIXLM_PDL=0 and past PDL_MAX_ROWS rows;
the skinny kernel compiled for sm_90 with PDL waits, then releases the next kernel, before any load, and without PDL
does neither (Triton's bundled ptxas, no GPU); on an sm_90 GPU a decode layer's chain of PDL kernels (norms, the bf16
and FP8 few-row GEMMs, split-K's reduction, SiLU-and-mul), replayed in a CUDA graph, gives the bits of plain
launches."""
from __future__ import annotations

import pytest
import torch

from tests.triton_interpret import interpreter_works


def _set_pdl(monkeypatch, on: bool) -> None:
    from radixlm.runtime.kernels import pdl

    monkeypatch.setenv("RADIXLM_PDL", "1" if on else "0")
    pdl._device_takes_pdl.cache_clear()


def test_pdl_is_off_on_the_cpu_and_when_turned_off(monkeypatch):
    from radixlm.runtime.kernels import pdl

    assert pdl.pdl_options(torch.device("cpu"), 1) == {"PDL": False}
    assert not pdl.pdl_enabled(torch.device("cpu"))
    try:
        _set_pdl(monkeypatch, False)
        assert not pdl._device_takes_pdl(0)
    finally:
        pdl._device_takes_pdl.cache_clear()


def _skinny_ptx(pdl: bool) -> list[str]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from radixlm.runtime.kernels.gemm import skinny_gemm

    ptrs = {n: "*bf16" for n in ("X", "W", "B", "Y", "NW", "R", "RO")}
    ptrs.update({"Pos": "*i64", "CosSin": "*fp32", "Loc": "*i64", "KBuf": "*bf16", "VBuf": "*bf16"})
    ints = ("N", "K", "stride_xm", "stride_wn", "stride_ym", "stride_rm")
    consts = dict(M=1, HAS_BIAS=False, PRO=2, EPI=False, HEAD_DIM=0, BLOCK_N=8, BLOCK_K=512, NORM_BLOCK=4096, PDL=pdl)
    sig = {**ptrs, **{n: "i32" for n in ints}, "eps": "fp32",
           **{n: "i32" for n in ("n_q", "n_kv", "stride_cs", "stride_kb", "stride_vb")}, "k_scale": "fp32",
           "v_scale": "fp32", **{n: "constexpr" for n in consts}}
    aligned = [i for i, n in enumerate(sig) if (n in ptrs or n in ints) and n not in ("Pos", "Loc")]  # as the 8B
    src = ASTSource(skinny_gemm._skinny_kernel.fn, sig, constexprs=consts,
                    attrs={(i,): [["tt.divisibility", 16]] for i in aligned})
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 3}).asm["ptx"]
    return [line.strip() for line in ptx.splitlines()]


@pytest.mark.skipif(not interpreter_works(), reason="needs Triton 3.7+ with its bundled ptxas")
def test_the_skinny_kernel_waits_then_releases_before_any_load():
    lines = _skinny_ptx(True)
    wait = next(i for i, line in enumerate(lines) if line.startswith("griddepcontrol.wait"))
    release = next(i for i, line in enumerate(lines) if line.startswith("griddepcontrol.launch_dependents"))
    first_load = next(i for i, line in enumerate(lines) if "ld.global" in line)
    assert wait < release < first_load
    assert not any("griddepcontrol" in line for line in _skinny_ptx(False))


def _layer_chain(h: int, inter: int):
    """A decode layer's kernels at one row on fixed inputs: norm, gate_up (bf16 skinny), SiLU-and-mul, down (FP8
    few-row, split in two: its reduction too), the residual add-and-norm, then the FP8 GEMM unsplit."""
    from radixlm.runtime.kernels.elementwise.fused_kernels import rmsnorm, silu_and_mul
    from radixlm.runtime.kernels.gemm.skinny_gemm import skinny_linear
    from radixlm.runtime.kernels.quant.fp8_gemv import Fp8GemvConfig, fp8_gemv_linear

    g = torch.Generator().manual_seed(0)
    dt = torch.bfloat16
    x = torch.randn(1, h, generator=g).to("cuda", dt)
    wn = (1 + 0.1 * torch.randn(h, generator=g)).to("cuda", dt)
    w_up = (torch.randn(2 * inter, h, generator=g) / h ** 0.5).to("cuda", dt)
    w8 = (torch.randn(h, inter, generator=g) / inter ** 0.5).to("cuda").to(torch.float8_e4m3fn)
    s8 = (1 + torch.rand(h, generator=g)).to("cuda")
    split, whole = Fp8GemvConfig(8, 512, 2, 2, 1), Fp8GemvConfig(8, 512, 1, 2, 1)

    def run():
        y = rmsnorm(x, wn, 1e-5)
        b = silu_and_mul(skinny_linear(y, w_up))
        c = fp8_gemv_linear(b, w8, s8, None, None, split)
        out, res = rmsnorm(c, wn, 1e-5, residual=x)
        return out, res, fp8_gemv_linear(out.repeat(1, inter // h), w8, s8, None, None, whole)

    return run


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
                    reason="needs an sm_90 GPU")
def test_a_graph_of_pdl_kernels_gives_the_bits_of_plain_launches(monkeypatch):
    from radixlm.runtime.kernels import pdl

    try:
        _set_pdl(monkeypatch, False)
        run = _layer_chain(1024, 4096)
        want = [t.clone() for t in run()]
        _set_pdl(monkeypatch, True)
        assert pdl.pdl_options(torch.device("cuda"), 1) == {"PDL": True, "launch_pdl": True}
        assert pdl.pdl_options(torch.device("cuda"), pdl.PDL_MAX_ROWS + 1) == {"PDL": False}
        eager = run()
        for got, ref in zip(eager, want):
            assert torch.equal(got, ref)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            run()  # the autotuner's choices, outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = run()
        for _ in range(20):
            for t in outs:
                t.zero_()
            graph.replay()
            torch.cuda.synchronize()
            for got, ref in zip(outs, want):
                assert torch.equal(got, ref)
    finally:
        pdl._device_takes_pdl.cache_clear()
