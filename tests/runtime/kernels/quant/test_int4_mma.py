"""The W4A16 tensor-core kernel (kernels/quant/int4_mma.py) against reference.int4_linear on tiny shapes under
TRITON_INTERPRET=1 (one subprocess): group sizes 32, 64, 128 and one group, act-order, bias, split K, K past a tile,
N past a tile, two row tiles, each way of loading x, float32 and float16; its tuned-table kind (quant_tuned.py) and
the dispatch's refusals; its packed-asm build for sm_90 on the CPU (ptxas; the weight in wgmma's registers); and on
CUDA (skipped without) the dispatch through a table at Llama-like shapes (the packed asm dequantization too, bfloat16
and float16, which the interpreter cannot run) in a CUDA graph."""
from __future__ import annotations

import pytest
import torch

from radixlm.runtime.kernels.quant import quant_tuned
from radixlm.runtime.kernels.quant import reference as ref
from tests.triton_interpret import interpreter_works, run_under_interpreter

MARKER = "int4 mma cases passed"


def _close(got: torch.Tensor, want: torch.Tensor, tol: float) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape, got.dtype, want.dtype)
    err = (got.float() - want.float()).abs().max().item()
    assert err <= tol * want.float().abs().max().item(), (err, want.float().abs().max().item())


def run_cases() -> None:
    from radixlm.runtime.kernels.quant.int4_mma import Int4MmaConfig, XLoad, w4a16_mma_linear

    g = torch.Generator().manual_seed(0)
    cases = [  # (n, k, group, act-order, symmetric, rows, config)
        (16, 256, 128, False, False, (5,), Int4MmaConfig(16, 16, 128, 1, 1, 1, XLoad.SPLIT)),
        (24, 256, 64, True, True, (7,), Int4MmaConfig(16, 16, 128, 1, 1, 2, XLoad.STRIDED)),  # N past a tile
        (16, 384, 32, False, False, (20,), Int4MmaConfig(16, 16, 128, 1, 1, 3, XLoad.GATHERED)),  # two row tiles
        (16, 200, 200, True, False, (9,), Int4MmaConfig(16, 16, 128, 1, 1, 0, XLoad.SPLIT)),  # one group, K tail
        (16, 512, 256, False, False, (6,), Int4MmaConfig(16, 16, 256, 1, 1, 1, XLoad.STRIDED))]
    for i, (n, k, group, act, sym, rows, cfg) in enumerate(cases):
        qw, sc, z = ref.quant_int4(torch.randn(n, k, generator=g) * 0.05, group, symmetric=sym)
        perm = torch.randperm(k, generator=g) if act else None
        bias = torch.randn(n, generator=g) if i % 2 == 0 else None
        for m in rows:
            x = torch.randn(m, k, generator=g)
            _close(w4a16_mma_linear(x, qw, sc, z, group, perm, bias, cfg),
                   ref.int4_linear(x, qw, sc, z, group, perm, bias), 1e-5)
    # float16: the 16-bit magic number (bfloat16 dots are wrong in the interpreter)
    qw, sc, z = ref.quant_int4(torch.randn(16, 256, generator=g) * 0.05, 64, dtype=torch.float16)
    perm = torch.randperm(256, generator=g)
    x = torch.randn(6, 256, generator=g).to(torch.float16)
    for load in XLoad:
        _close(w4a16_mma_linear(x, qw, sc, z, 64, perm, None, Int4MmaConfig(16, 16, 128, 1, 1, 2, load)),
               ref.int4_linear(x.float(), qw, sc.float(), z.float(), 64, perm).half(), 2e-2)
    with pytest.raises(ValueError, match="tensor-core"):  # a group no K tile divides
        qw, sc, z = ref.quant_int4(torch.randn(16, 288, generator=g), 96)
        w4a16_mma_linear(torch.randn(5, 288), qw, sc, z, 96, None, None, cases[0][6])
    print(MARKER)


@pytest.mark.skipif(not interpreter_works(), reason="needs Triton's interpreter (3.7+)")
def test_int4_mma_kernel_matches_the_reference_interpreted():
    run_under_interpreter(__file__, MARKER, hide_cuda=True, timeout=120)


def _mma(rows: int, **config) -> dict:
    cfg = {"block_m": 16, "block_n": 64, "block_k": 128, "num_warps": 4, "num_stages": 3, "split_k": 0,
           "x_load": "split", **config}
    return {"kernel": "w4a16_mma", "n": 4096, "k": 4096, "rows": rows, "group": 128, "config": cfg, "us": 1.0}


def test_tuned_table_takes_the_mma_kind_and_refuses_bad_entries():
    from radixlm.runtime.kernels.quant.int4_mma import Int4MmaConfig, XLoad

    table = quant_tuned.parse([_mma(8), _mma(256, block_m=128, x_load="gathered", split_k=1)])
    assert table[quant_tuned.TunedKey("w4a16_mma", 4096, 4096, 8, 128)] == Int4MmaConfig(16, 64, 128, 4, 3)
    assert table[quant_tuned.TunedKey("w4a16_mma", 4096, 4096, 256, 128)].x_load is XLoad.GATHERED
    for bad in (_mma(4), _mma(32), _mma(8, block_k=64), _mma(8, x_load="other"), _mma(8, block_m=24)):
        with pytest.raises(ValueError, match="bad quant_gemv tuned entry"):
            quant_tuned.parse([bad])
    assert quant_tuned.lookup(torch.device("cpu"), "w4a16_mma", 4096, 4096, 64, 128) is None


def test_the_sweeps_mma_entries_parse_and_merge():
    from benchmarks.lib.quant_sweep import merge_entries

    old = [_mma(8), {**_mma(1), "kernel": "w4a16", "rows": 1,
                     "config": {"block_n": 512, "block_k": 64, "split_k": 16, "num_warps": 4, "num_stages": 1}}]
    new = [_mma(8, block_n=128), _mma(64)]
    merged = quant_tuned.parse(merge_entries(old, new))
    assert merged[quant_tuned.TunedKey("w4a16_mma", 4096, 4096, 8, 128)].block_n == 128
    assert len(merged) == 3


def _bundled_ptxas() -> bool:
    try:
        import triton
    except ImportError:
        return False
    from pathlib import Path

    return (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").exists()


_INT_ARGS = ("M", "N", "K", "group_size", "stride_xm", "stride_qk", "stride_sg", "stride_ym", "stride_ys",
             "k_tiles_per_split")
_ALIGNED = (0, 1, 2, 3, 4, 5, 8, 10, 11, 12, 13)  # pointers, K and the row strides: multiples of 16 at the 8B shapes


def _compile_sm90(cfg):
    """The kernel built for sm_90 on the CPU (no GPU needed) at cfg, unsplit, bf16 in and out."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from radixlm.runtime.kernels.quant import int4_mma

    sig = {"X": "*bf16", "QW": "*i32", "S": "*bf16", "Z": "*bf16", "Bias": "*bf16", "Y": "*bf16",
           **{name: "i32" for name in _INT_ARGS}}
    consts = dict(HAS_BIAS=False, SPLIT=False, EVEN_K=True, GROUPS=1, X_MODE=int4_mma._XMODE[cfg.x_load],
                  BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, MAGIC_BITS=0x4300, MAGIC=128.0,
                  HALF=True, ASM=1 if cfg.asm else 0)
    sig.update({name: "constexpr" for name in consts})
    src = ASTSource(int4_mma._w4a16_mma_kernel, sig, constexprs=consts,
                    attrs={(i,): [["tt.divisibility", 16]] for i in _ALIGNED})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})


def _sass(cubin: bytes) -> list[str]:
    """The cubin's SASS lines, by Triton's bundled nvdisasm."""
    import subprocess
    import tempfile
    from pathlib import Path

    import triton

    nvdisasm = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([str(nvdisasm), "-c", f.name], capture_output=True, text=True, check=True).stdout.split(
            "\n")


@pytest.mark.skipif(not _bundled_ptxas(), reason="needs Triton's bundled ptxas")
def test_the_asm_kernel_builds_for_sm90_with_the_weight_in_registers():
    """The packed asm (which the interpreter cannot run) passes ptxas, the weight reaches wgmma as its register
    operand, and nothing spills (the build of the retired benchmarks/kernels/w4a16_mma_sass.py, on the CPU)."""
    import re

    from radixlm.runtime.kernels.quant.int4_mma import Int4MmaConfig, XLoad

    kernel = _compile_sm90(Int4MmaConfig(16, 64, 128, 4, 2, 0, XLoad.GATHERED, True))
    dots = re.findall(r"warp_group_dot %\S+, %\S+, %\S+ .*? : (tensor<[^>]*>>?) \*", kernel.asm["ttgir"])
    assert len(dots) == 8 and all("opIdx = 0" in d for d in dots), dots[:1]
    assert "lop3.b32" in kernel.asm["ptx"] and "fma.rn.bf16x2" in kernel.asm["ptx"]
    assert not any(re.search(r"\b(LDL|STL)\b", line) for line in _sass(kernel.asm["cubin"]))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_mma_dispatch_through_a_table_cuda(monkeypatch):
    from radixlm.runtime.kernels import quant

    n, k = 1024, 4096
    entries = [_mma(r, block_m=max(16, min(r, 128)), x_load=load, asm=asm) for r, load, asm in
               ((8, "split", False), (16, "strided", True), (64, "gathered", True), (256, "split", True))]
    entries = [{**e, "n": n, "k": k} for e in entries]
    monkeypatch.setattr(quant_tuned, "_table", lambda name: quant_tuned.parse(entries))
    w = torch.randn(n, k, device="cuda") * 0.02
    perm = torch.randperm(k, device="cuda")
    for m, dtype in ((5, torch.bfloat16), (16, torch.float16), (40, torch.bfloat16), (200, torch.bfloat16)):
        x = torch.randn(m, k, device="cuda", dtype=dtype)
        qw, sc, z = ref.quant_int4(w, 128, dtype=dtype)
        _close(quant.int4_linear(x, qw, sc, z, 128), ref.int4_linear(x, qw, sc, z, 128), 2e-2)
        _close(quant.int4_linear(x, qw, sc, z, 128, perm), ref.int4_linear(x, qw, sc, z, 128, perm), 2e-2)
    x = torch.randn(40, k, device="cuda", dtype=torch.bfloat16)
    qw, sc, z = ref.quant_int4(w, 128, dtype=torch.bfloat16)
    quant.int4_linear(x, qw, sc, z, 128)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = quant.int4_linear(x, qw, sc, z, 128)
    x.copy_(torch.randn_like(x))
    graph.replay()
    _close(y, ref.int4_linear(x, qw, sc, z, 128), 2e-2)


if __name__ == "__main__":
    run_cases()
