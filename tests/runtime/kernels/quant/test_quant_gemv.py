"""The quantized few-row kernels (kernels/quant/fp8_gemv.py, int4_skinny.py) against reference.py on tiny shapes under
TRITON_INTERPRET=1 (one subprocess): each row bucket 1..4 (and 3, padded), split K, K past a tile, N past a tile,
bias, per-tensor / per-channel / block FP8 scales, INT4 groups, one group and act-order, float32 and bf16 words; their
tuned table (quant_tuned.py: parsing, refusals, no lookup off CUDA); and on CUDA (skipped without) the dispatch
through a tuned table at Llama-like shapes, captured in a CUDA graph."""
from __future__ import annotations

import pytest
import torch

from radixlm.runtime.kernels.quant import quant_tuned
from radixlm.runtime.kernels.quant import reference as ref
from radixlm.runtime.kernels.quant.fp8_gemv import Fp8GemvConfig
from radixlm.runtime.kernels.quant.int4_skinny import Int4GemvConfig
from tests.triton_interpret import interpreter_works, run_under_interpreter

MARKER = "quant gemv cases passed"


def _close(got: torch.Tensor, want: torch.Tensor, tol: float) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape, got.dtype, want.dtype)
    err = (got.float() - want.float()).abs().max().item()
    assert err <= tol * want.float().abs().max().item(), (err, want.float().abs().max().item())


def run_cases() -> None:
    from radixlm.runtime.kernels.quant.fp8_gemv import fp8_gemv_linear
    from radixlm.runtime.kernels.quant.int4_skinny import w4a16_skinny_linear

    g = torch.Generator().manual_seed(0)
    fp8 = [  # (n, k, scales, config): per channel / per tensor / blocks; split K, K and N past a tile
        (16, 256, "channel", Fp8GemvConfig(8, 64, 1, 1, 1)),
        (20, 200, "tensor", Fp8GemvConfig(8, 64, 2, 1, 1)),
        (32, 256, (16, 64), Fp8GemvConfig(8, 64, 3, 1, 1)),
        (24, 192, (8, 32), Fp8GemvConfig(8, 128, 2, 1, 1))]
    for i, (n, k, mode, cfg) in enumerate(fp8):
        w = torch.randn(n, k, generator=g) * 0.05
        block = mode if isinstance(mode, tuple) else None
        q, s = ref.quant_fp8(w, block=block, per_channel=mode == "channel")
        bias = torch.randn(n, generator=g) if i % 2 else None
        for m in ((1, 4), (3,), (2,), (4,))[i]:  # every row bucket, 3 padded to 4
            x = torch.randn(m, k, generator=g)
            _close(fp8_gemv_linear(x, q, s, block, bias, cfg), ref.fp8_linear(x, q, s, block, bias), 1e-5)
        if i != 0:
            continue
        xb = torch.randn(2, k, generator=g).to(torch.bfloat16)  # bf16 as int64 words, widened by shifts
        _close(fp8_gemv_linear(xb, q, s, block, bias, cfg), ref.fp8_linear(xb.float(), q, s, block, bias).bfloat16(),
               1e-2)
    int4 = [  # (n, k, group, act-order, config)
        (16, 256, 64, False, Int4GemvConfig(16, 64, 1, 1, 1)),
        (24, 256, 128, True, Int4GemvConfig(16, 128, 2, 1, 1)),  # N past a tile, the group caps nothing
        (16, 192, 192, False, Int4GemvConfig(16, 128, 2, 1, 1)),  # one group: K past a tile
        (16, 256, 32, False, Int4GemvConfig(16, 128, 4, 1, 1))]  # the group caps BLOCK_K at 32
    for i, (n, k, group, act, cfg) in enumerate(int4):
        qw, sc, z = ref.quant_int4(torch.randn(n, k, generator=g) * 0.05, group, symmetric=i == 3)
        perm = torch.randperm(k, generator=g) if act else None
        bias = torch.randn(n, generator=g) if i % 2 else None
        for m in ((1,), (2,), (3,), (4,))[i]:
            x = torch.randn(m, k, generator=g)
            _close(w4a16_skinny_linear(x, qw, sc, z, group, perm, bias, cfg),
                   ref.int4_linear(x, qw, sc, z, group, perm, bias), 1e-5)
        if i != 1:
            continue
        xb = torch.randn(1, k, generator=g).to(torch.bfloat16)
        sb, zb = sc.bfloat16(), z.bfloat16()
        _close(w4a16_skinny_linear(xb, qw, sb, zb, group, perm, bias, cfg),
               ref.int4_linear(xb.float(), qw, sb.float(), zb.float(), group, perm, bias).bfloat16(), 1e-2)
    packed = [  # int4_packed.py's roundings emulated (bf16 products and half-word sums): rows 1, 2, 3 -> 4, split K
        # summed in the kernel (fused) and apart, N and K past a tile, act-order, bias
        (16, 256, 64, False, Int4GemvConfig(16, 64, 2, 1, 1, packed=True, fused_reduce=True), (1, 3)),
        (24, 200, 200, True, Int4GemvConfig(16, 64, 2, 1, 1, packed=True), (2,)),
        (40, 256, 128, False, Int4GemvConfig(16, 32, 4, 1, 1, packed=True, fused_reduce=True), (2,))]
    for i, (n, k, group, act, cfg, rows) in enumerate(packed):
        qw, sc, z = ref.quant_int4(torch.randn(n, k, generator=g) * 0.05, group)
        perm = torch.randperm(k, generator=g) if act else None
        bias = torch.randn(n, generator=g) if i else None
        for m in rows:
            x = torch.randn(m, k, generator=g).bfloat16().float()
            want = ref.int4_linear(x, qw, sc, z, group, perm, bias)
            got = w4a16_skinny_linear(x, qw, sc, z, group, perm, bias, cfg)
            _close(got, want, 1e-2)
            if m == 1:  # not the float32 kernel's result: the packed sums are rounded
                assert (got - want).abs().max() > 1e-6 * want.abs().max()
    from radixlm.runtime.kernels.quant.splitk import split_counters

    assert not split_counters(torch.device("cpu")).counters.any()  # the last programs zeroed their counters
    with pytest.raises(ValueError, match="fused_reduce needs packed"):
        Int4GemvConfig(16, 64, 2, 1, 1, fused_reduce=True)
    with pytest.raises(ValueError, match="few-row"):
        fp8_gemv_linear(torch.randn(5, 256), *ref.quant_fp8(torch.randn(32, 256), per_channel=True), None, None,
                        fp8[0][3])
    print(MARKER)


@pytest.mark.skipif(not interpreter_works(), reason="needs Triton's interpreter (3.7+)")
def test_quant_gemv_kernels_match_the_reference_interpreted():
    run_under_interpreter(__file__, MARKER, hide_cuda=True, timeout=120)


def _entry(kernel: str, rows: int, config: dict, group: int = 0) -> dict:
    return {"kernel": kernel, "n": 4096, "k": 4096, "rows": rows, "group": group, "config": config, "us": 1.0}


def test_tuned_table_parses_and_refuses_bad_entries():
    table = quant_tuned.parse([
        _entry("fp8_channel", 1, {"block_n": 4, "block_k": 1024, "split_k": 1, "num_warps": 4, "num_stages": 1}),
        _entry("w4a16", 2, {"block_n": 256, "block_k": 64, "split_k": 4, "num_warps": 4, "num_stages": 1}, 128)])
    assert table[quant_tuned.TunedKey("fp8_channel", 4096, 4096, 1, 0)] == Fp8GemvConfig(4, 1024, 1, 4, 1)
    assert table[quant_tuned.TunedKey("w4a16", 4096, 4096, 2, 128)] == Int4GemvConfig(256, 64, 4, 4, 1)
    packed = quant_tuned.parse([_entry("w4a16", 1, {"block_n": 128, "block_k": 64, "split_k": 32, "num_warps": 1,
                                                    "num_stages": 1, "packed": True}, 128)])
    assert packed[quant_tuned.TunedKey("w4a16", 4096, 4096, 1, 128)] == Int4GemvConfig(128, 64, 32, 1, 1, True)
    good = {"block_n": 4, "block_k": 1024, "split_k": 1, "num_warps": 4, "num_stages": 1}
    for bad in (_entry("fp8_tensor", 1, good), _entry("fp8_channel", 3, good), _entry("fp8_channel", 8, good),
                _entry("fp8_channel", 1, {**good, "block_n": 3}), _entry("fp8_channel", 1, {**good, "split_k": 99}),
                _entry("fp8_channel", 1, {**good, "tile": 1}), {"kernel": "w4a16", "n": 1}):
        with pytest.raises(ValueError, match="bad quant_gemv tuned entry"):
            quant_tuned.parse([bad])


def test_the_sweeps_table_entries_parse():
    import dataclasses

    from benchmarks.kernels.quant_gemv_sweep import table_entry

    cfg = Fp8GemvConfig(4, 1024, 2, 4, 1)
    entries = [table_entry(fmt, 4096, 14336, 2, {"config": dataclasses.asdict(cfg), "us": 9.0}, 12.0, 6.2)
               for fmt in ("fp8_channel", "fp8_block")]
    table = quant_tuned.parse(entries)
    assert table[quant_tuned.TunedKey("fp8_block", 4096, 14336, 2, 128)] == cfg
    assert table[quant_tuned.TunedKey("fp8_channel", 4096, 14336, 2, 0)] == cfg


def test_committed_tables_entries_beat_their_default_by_the_margin():
    import json
    from pathlib import Path

    from radixlm.runtime.kernels.gemm import cublaslt

    for path in (Path(cublaslt.__file__).parent / "tuned").glob("quant_gemv_*.json"):
        table = json.loads(path.read_text())
        quant_tuned.parse(table["entries"])
        for e in table["entries"]:
            if e.get("us") is not None and e.get("default_us") is not None:
                assert e["us"] * table["margin"] <= e["default_us"], (path.name, e)


def test_no_tuned_lookup_off_cuda_and_table_path():
    from radixlm.runtime.kernels.gemm import cublaslt

    assert quant_tuned.lookup(torch.device("cpu"), "fp8_channel", 4096, 4096, 1) is None
    assert cublaslt.table_path("NVIDIA H200", "quant_gemv").name == "quant_gemv_NVIDIA_H200.json"
    assert cublaslt.table_path("NVIDIA H200").name == "cublaslt_NVIDIA_H200.json"
    assert cublaslt.load_table("no such GPU", "quant_gemv") == []


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
                    reason="needs an FP8-capable GPU")
def test_tuned_dispatch_cuda(monkeypatch):
    from radixlm.runtime.kernels import quant

    n, k = 1024, 4096
    fp8_cfg = {"block_n": 4, "block_k": 1024, "split_k": 2, "num_warps": 4, "num_stages": 1}
    int4_cfg = {"block_n": 256, "block_k": 64, "split_k": 4, "num_warps": 4, "num_stages": 1}
    entries = [{"kernel": kind, "n": n, "k": k, "rows": r, "group": group, "config": cfg}
               for r in (1, 2, 4) for kind, group, cfg in (("fp8_channel", 0, fp8_cfg), ("fp8_block", 128, fp8_cfg),
                                                           ("w4a16", 128, int4_cfg))]
    monkeypatch.setattr(quant_tuned, "_table", lambda name: quant_tuned.parse(entries))
    w = torch.randn(n, k, device="cuda") * 0.02
    q, s = ref.quant_fp8(w, per_channel=True)
    qb, sb = ref.quant_fp8(w, block=(128, 128))
    qw, sc, z = ref.quant_int4(w, 128, dtype=torch.bfloat16)
    for m in (1, 2, 3, 4):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        _close(quant.fp8_linear(x, q, s), ref.fp8_linear(x, q, s), 2e-2)
        _close(quant.fp8_linear(x, qb, sb, (128, 128)), ref.fp8_linear(x, qb, sb, (128, 128)), 2e-2)
        _close(quant.int4_linear(x, qw, sc, z, 128), ref.int4_linear(x, qw, sc, z, 128), 2e-2)
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    quant.fp8_linear(x, q, s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = quant.fp8_linear(x, q, s)
    x.copy_(torch.randn_like(x))
    graph.replay()
    _close(y, ref.fp8_linear(x, q, s), 2e-2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_packed_dispatch_cuda(monkeypatch):
    """The packed kernel through a tuned table (fused split K at 1 and 4 rows, reduce_splits at 2; float16 takes the
    float32 kernel), eager and replayed twice from a CUDA graph (the arrival counters back at zero each time)."""
    from radixlm.runtime.kernels import quant
    from radixlm.runtime.kernels.quant.splitk import split_counters

    n, k = 4096, 4096
    cfgs = {1: (128, 128, 32, 1, True), 2: (512, 64, 16, 4, False), 4: (256, 32, 16, 2, True)}
    entries = [{"kernel": "w4a16", "n": n, "k": k, "rows": r, "group": 128,
                "config": {"block_n": bn, "block_k": bk, "split_k": sk, "num_warps": nw, "num_stages": 1,
                           "packed": True, "fused_reduce": fused}} for r, (bn, bk, sk, nw, fused) in cfgs.items()]
    monkeypatch.setattr(quant_tuned, "_table", lambda name: quant_tuned.parse(entries))
    w = torch.randn(n, k, device="cuda") * 0.02
    for dtype in (torch.bfloat16, torch.float16):
        qw, sc, z = ref.quant_int4(w, 128, dtype=dtype)
        for m in (1, 2, 3, 4):
            x = torch.randn(m, k, device="cuda", dtype=dtype)
            _close(quant.int4_linear(x, qw, sc, z, 128), ref.int4_linear(x, qw, sc, z, 128), 2e-2)
    qw, sc, z = ref.quant_int4(w, 128, dtype=torch.bfloat16)
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    quant.int4_linear(x, qw, sc, z, 128)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = quant.int4_linear(x, qw, sc, z, 128)
    for _ in range(2):
        x.copy_(torch.randn_like(x))
        graph.replay()
        _close(y, ref.int4_linear(x, qw, sc, z, 128), 2e-2)
    assert not split_counters(x.device).counters.any()


def _loop_ops(sass: str) -> list[str]:
    """The opcodes of the SASS's longest loop (a backward branch to a label)."""
    import re

    labels, ops = {}, []
    for line in sass.split("\n"):
        if m := re.match(r"\s*\.(L_x_\d+):", line):
            labels[m.group(1)] = len(ops)
        elif m := re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)(.*);", line):
            ops.append((m.group(1).split(".")[0], m.group(2)))
    best: list[str] = []
    for i, (op, rest) in enumerate(ops):
        target = re.search(r"\(\.(L_x_\d+)\)", rest)
        if op == "BRA" and target and labels.get(target.group(1), i + 1) <= i:
            best = max(best, [o for o, _ in ops[labels[target.group(1)]:i + 1]], key=len)
    return best


@pytest.mark.skipif(not interpreter_works(), reason="needs Triton 3.7+ with its bundled ptxas and nvdisasm")
def test_the_packed_kernel_builds_for_sm90():
    """int4_packed's inline asm (which the interpreter cannot run) passes ptxas for sm_90 (Triton's bundled tools, no
    GPU), with the fused split-K reduction: at most one value on the stack, the packed bf16x2 arithmetic and PRMT
    pairs in the K loop, under 3.2 instructions a weight at one row (int4_skinny's float32 kernel: ~4.3 at this tile,
    255 registers)."""
    import re
    import subprocess
    import tempfile
    from pathlib import Path

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from radixlm.runtime.kernels.quant import int4_packed

    ints = ("M", "N", "K", "group_size", "stride_xm", "stride_qk", "stride_sg", "stride_ym", "stride_ys",
            "stride_om", "tiles_per_split", "splits")
    sig = {"X": "*i64", "QW": "*i32", "S": "*bf16", "Z": "*bf16", "Bias": "*bf16", "Y": "*fp32", "Out": "*bf16",
           "Cnt": "*i32", **{name: "i32" for name in ints}}
    block_n, block_k, warps = 512, 64, 4
    consts = dict(ROWS=1, HAS_BIAS=False, SPLIT=True, FUSED=True, SPLIT_P2=32, EVEN_K=True, EVEN_N=True,
                  BLOCK_N=block_n, BLOCK_K=block_k, ASM=True, PDL=True)
    sig.update({name: "constexpr" for name in consts})
    aligned = [i for i, name in enumerate(sig)
               if name not in ("Cnt", "M", "stride_xm", "tiles_per_split", "splits") and name not in consts]
    src = ASTSource(int4_packed._w4a16_packed_kernel, sig, constexprs=consts,
                    attrs={(i,): [["tt.divisibility", 16]] for i in aligned})
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": 1})
    assert "fma.rn.bf16x2" in kernel.asm["ptx"] and "prmt.b32" in kernel.asm["ptx"]
    assert "atom.global.gpu.acq_rel.add" in kernel.asm["ptx"] and "ld.global.cg" in kernel.asm["ptx"]  # fused split K
    assert "griddepcontrol.wait" in kernel.asm["ptx"]  # as sm_90 launches it (kernels/pdl.py)
    nvdisasm = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        sass = subprocess.run([str(nvdisasm), "-c", f.name], capture_output=True, text=True, check=True).stdout
    ops = _loop_ops(sass)
    # ptxas (Triton 3.9's) keeps one 8-byte value on the stack to stay at 128 registers (four programs an SM)
    assert len(re.findall(r"\b(LDL|STL)\b", sass)) <= 2
    assert ops.count("PRMT") >= block_k // 8 * 4 and sum(map(ops.count, ("HFMA2", "HADD2", "HMUL2"))) >= 8 * 32
    assert len(ops) / (block_n * block_k / (32 * warps)) < 3.2, len(ops)


if __name__ == "__main__":
    run_cases()
