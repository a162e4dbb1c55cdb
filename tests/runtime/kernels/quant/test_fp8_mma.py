"""The FP8 W8A8 tensor-core kernel (kernels/quant/fp8_mma.py) against reference.fp8_linear_w8a8 on tiny shapes under
TRITON_INTERPRET=1 (one subprocess): per-tensor, per-channel and 128x128-block weight scales, static activation
scales, the activations quantized by fp8_act's launch or in the kernel (fused_act), with and without split K, K and N
past a tile, bias, 5-16 rows, float32 and float16; its tuned-table kind (quant_tuned.py) and its refusals; the
dispatch in fp8_gemm.fp8_linear_cuda, which takes it only where the table has an entry; and on CUDA (skipped without)
that dispatch at Llama-like shapes in a CUDA graph."""
from __future__ import annotations

import pytest
import torch

from radixlm.runtime.kernels.quant import quant_tuned
from radixlm.runtime.kernels.quant import reference as ref
from tests.runtime.kernels.quant.test_int4_mma import _bundled_ptxas, _sass
from tests.triton_interpret import interpreter_works, run_under_interpreter

MARKER = "fp8 mma cases passed"
BLOCK = (128, 128)


def _close(got: torch.Tensor, want: torch.Tensor, tol: float) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape, got.dtype, want.dtype)
    err = (got.float() - want.float()).abs().max().item()
    assert err <= tol * want.float().abs().max().item(), (err, want.float().abs().max().item())


STEP = 2.0 ** -6  # the activations' scale: x = v * STEP with v on e4m3's grid, |v| <= 448 = FP8_MAX


def _grid_x(m: int, k: int, g: torch.Generator) -> torch.Tensor:
    """Activations that quantize without rounding: every 128-channel group's absolute maximum is 448 * STEP, so the
    dynamic scale (per token or per group) and the static one are STEP and x / STEP is on e4m3's grid. (Triton 3.9's
    interpreter rounds float32 to e4m3 wrongly across the binade at 128: 124..128 becomes 64 where the GPU and torch
    give 128; the kernels' rounding is checked on CUDA.) Row 1 is zero: the epsilon scale."""
    v = (torch.randn(m, k, generator=g) * 100).to(ref.FP8_DTYPE).float()
    v[:, ::128] = 448.0
    v[1] = 0.0
    return v * STEP


def run_cases() -> None:
    from radixlm.runtime.kernels.quant.fp8_mma import Fp8MmaConfig, fp8_mma_linear

    g = torch.Generator().manual_seed(0)
    cases = [  # (n, k, scales, static input scale, rows, config): scales "tensor", "channel" or "block"
        (24, 256, "channel", False, 5, Fp8MmaConfig(16, 16, 64, 1, 1, 1)),  # N past a tile
        (16, 200, "channel", False, 9, Fp8MmaConfig(16, 16, 64, 1, 1, 2)),  # K tail, split K
        (16, 256, "tensor", False, 16, Fp8MmaConfig(16, 16, 128, 1, 1, 1)),
        (16, 256, "tensor", True, 7, Fp8MmaConfig(16, 16, 64, 1, 1, 2, fused_act=True)),  # static, fused, split
        (16, 192, "channel", True, 6, Fp8MmaConfig(16, 16, 64, 1, 1, 1)),  # static, quantized first
        (24, 384, "block", False, 6, Fp8MmaConfig(16, 16, 128, 1, 1, 1)),
        (16, 320, "block", False, 11, Fp8MmaConfig(16, 16, 128, 1, 1, 3, fused_act=True)),  # K past a block, split
        (16, 1024, "block", False, 8, Fp8MmaConfig(16, 16, 128, 1, 1, 0, fused_act=True)),  # tiles.split_k's split
        (16, 1024, "channel", False, 5, Fp8MmaConfig(16, 16, 128, 1, 1, 0))]
    for i, (n, k, kind, static, m, cfg) in enumerate(cases):
        block = BLOCK if kind == "block" else None
        w, s = ref.quant_fp8(torch.randn(n, k, generator=g) * 0.05, block=block, per_channel=kind == "channel")
        bias = torch.randn(n, generator=g) if i % 2 == 0 else None
        x = _grid_x(m, k, g)
        in_scale = torch.tensor(STEP) if static else None
        _close(fp8_mma_linear(x, w, s, block, bias, in_scale, cfg), ref.fp8_linear_w8a8(x, w, s, block, bias, in_scale),
               1e-5)
    # float16 rows, both activation paths of block weights, a strided (copied) x
    w, s = ref.quant_fp8(torch.randn(32, 256, generator=g) * 0.05, block=BLOCK)
    x = _grid_x(6, 512, g).to(torch.float16)[:, ::2]
    for fused in (False, True):
        _close(fp8_mma_linear(x, w, s, BLOCK, None, None, Fp8MmaConfig(16, 16, 128, 1, 1, 2, fused_act=fused)),
               ref.fp8_linear_w8a8(x, w, s, BLOCK), 2e-3)
    with pytest.raises(ValueError, match="tensor-core"):  # a K tile that is not the block's K size
        fp8_mma_linear(x, w, s, BLOCK, None, None, Fp8MmaConfig(16, 16, 64, 1, 1))
    with pytest.raises(ValueError, match="static input scale"):
        fp8_mma_linear(x, w, s, BLOCK, None, torch.tensor(0.1), Fp8MmaConfig(16, 16, 128, 1, 1))
    print(MARKER)


@pytest.mark.skipif(not interpreter_works(), reason="needs Triton's interpreter (3.7+)")
def test_fp8_mma_kernel_matches_the_reference_interpreted():
    run_under_interpreter(__file__, MARKER, hide_cuda=True, timeout=120)


def _entry(rows: int, group: int = 0, n: int = 4096, k: int = 4096, **config) -> dict:
    cfg = {"block_m": 16, "block_n": 64, "block_k": 128, "num_warps": 4, "num_stages": 4, "split_k": 0,
           "fused_act": False, **config}
    return {"kernel": "fp8_mma", "n": n, "k": k, "rows": rows, "group": group, "config": cfg, "us": 1.0}


def test_tuned_table_takes_the_fp8_mma_kind_and_refuses_bad_entries():
    from radixlm.runtime.kernels.quant.fp8_mma import Fp8MmaConfig

    table = quant_tuned.parse([_entry(8), _entry(256, 128, block_m=128, fused_act=True, split_k=1)])
    assert table[quant_tuned.TunedKey("fp8_mma", 4096, 4096, 8, 0)] == Fp8MmaConfig(16, 64, 128, 4, 4)
    assert table[quant_tuned.TunedKey("fp8_mma", 4096, 4096, 256, 128)].fused_act is True
    assert quant_tuned.lookup_in(table, "fp8_mma", 4096, 4096, 5) == Fp8MmaConfig(16, 64, 128, 4, 4)
    assert quant_tuned.lookup_in(table, "fp8_mma", 4096, 4096, 200, 128).block_m == 128
    for m in (4, 9, 257):  # other buckets
        assert quant_tuned.lookup_in(table, "fp8_mma", 4096, 4096, m) is None
    bads = (_entry(4), _entry(32), _entry(8, block_k=32), _entry(8, 64), _entry(8, block_m=24),
            _entry(8, fused_act="yes"), _entry(8, split_k=17), _entry(8, num_stages=0), _entry(8, tile=1),
            {**_entry(8), "config": [16, 64]}, {**_entry(8), "rows": None})
    for bad in bads:
        with pytest.raises(ValueError, match="bad quant_gemv tuned entry"):
            quant_tuned.parse([bad])
    assert quant_tuned.lookup(torch.device("cpu"), "fp8_mma", 4096, 4096, 8) is None


@pytest.mark.parametrize("kind", ["channel", "block"])
def test_dispatch_takes_the_kernel_only_with_an_entry(monkeypatch, kind):
    """fp8_linear_cuda's choice, with the kernels replaced by markers (the dispatch runs on any bf16 tensors)."""
    from radixlm.runtime.kernels.quant import fp8_gemm

    block = BLOCK if kind == "block" else None
    n, k = 256, 512
    table = quant_tuned.parse([_entry(8, 128 if block else 0, n, k), _entry(64, 128 if block else 0, n, k)])
    monkeypatch.setattr(quant_tuned, "lookup", lambda device, *key: quant_tuned.lookup_in(table, *key))
    calls = []
    monkeypatch.setattr(fp8_gemm.fp8_mma, "fp8_mma_linear",
                        lambda x2, *a, **kw: calls.append(("mma", x2.shape[0], a[-1])) or x2.new_zeros(x2.shape[0], n))
    for name in ("fp8_block_linear", "fp8_scaled_linear"):
        monkeypatch.setattr(fp8_gemm, name, lambda x2, *a, name=name, **kw: calls.append((name, x2.shape[0]))
                            or x2.new_zeros(x2.shape[0], n))
    w, s = ref.quant_fp8(torch.randn(n, k) * 0.05, block=block, per_channel=True)
    for m in (4, 5, 8, 12, 17, 64, 65):
        fp8_gemm.fp8_linear_cuda(torch.randn(m, k, dtype=torch.bfloat16), w, s, block)
    default = "fp8_block_linear" if block else "fp8_scaled_linear"
    assert [c[:2] for c in calls] == [(default, 4), ("mma", 5), ("mma", 8), (default, 12), ("mma", 17), ("mma", 64),
                                      (default, 65)]
    calls.clear()
    w, s = ref.quant_fp8(torch.randn(n, 256), block=block, per_channel=True)
    fp8_gemm.fp8_linear_cuda(torch.randn(8, 256, dtype=torch.bfloat16), w, s, block)
    assert calls[0][0] != "mma"  # another shape: no entry


def test_dispatch_with_a_prologue_chooses_once(monkeypatch):
    """With a prologue, the kernel choice that decides whether the step fuses its quantization is the one that runs:
    the tuned table is asked once per kind a call; the step fuses where the chosen kernel quantizes per token (here
    the tensor-core and scaled paths; fp8_prologue's launch, CUDA-only, replaced by the reference) and runs unfused
    before the weight-only few-row kernel."""
    from radixlm.runtime.kernels.gemm.prologue import Prologue, PrologueKind, apply
    from radixlm.runtime.kernels.quant import fp8_gemm, fp8_prologue
    from radixlm.runtime.layers.activation import SiluAndMul

    n, k = 256, 512
    table = quant_tuned.parse([_entry(8, 0, n, k), {"kernel": "fp8_channel", "n": n, "k": k, "rows": 2, "config": {
        "block_n": 64, "block_k": 128, "split_k": 1, "num_warps": 4, "num_stages": 2}}])
    asked, seen = [], []
    monkeypatch.setattr(quant_tuned, "lookup", lambda device, *key: asked.append(key[0])
                        or quant_tuned.lookup_in(table, *key))
    monkeypatch.setattr(fp8_prologue, "takes", lambda pro, x: True)
    monkeypatch.setattr(fp8_prologue, "quantized_rows", lambda pro, x: seen.append("fused")
                        or ref.quant_fp8_act(apply(pro, x)))
    for name, path in (("fp8_mma_linear", "mma"), ("fp8_gemv_linear", "gemv")):
        module = fp8_gemm.fp8_mma if path == "mma" else fp8_gemm.fp8_gemv
        monkeypatch.setattr(module, name, lambda x2, *a, path=path, **kw:
                            seen.append((path, kw.get("rows") is not None)) or x2.new_zeros(x2.shape[0], n))
    monkeypatch.setattr(fp8_gemm, "fp8_scaled_linear", lambda x2, *a, rows=None, **kw: seen.append(
        ("scaled", rows is not None)) or x2.new_zeros(x2.shape[0], n))
    w, s = ref.quant_fp8(torch.randn(n, k) * 0.05, per_channel=True)
    for m, path, kinds, fused in ((8, "mma", ["fp8_channel", "fp8_mma"], True),
                                  (12, "scaled", ["fp8_channel", "fp8_mma"], True),
                                  (2, "gemv", ["fp8_channel"], False)):
        x = torch.randn(m, 2 * k, dtype=torch.bfloat16)
        assert fp8_gemm.choose_path(x[:, :k], w, None, 0).path.value == path
        asked.clear()
        seen.clear()
        fp8_gemm.fp8_linear_cuda(x, w, s, prologue=Prologue(PrologueKind.SILU_MUL, SiluAndMul()))
        assert sorted(asked) == kinds, (m, asked)
        assert seen == (["fused", (path, True)] if fused else [(path, False)]), (m, seen)


@pytest.mark.parametrize("scheme", ["channel", "static", "block", "block_fused"])
def test_serving_launches_are_built_by_the_warm_up(monkeypatch, scheme):
    """No compile after start-up: every launch (fp8_mma's, fp8_act's, the split-K sum's) at the row counts and x views
    serving makes is among those of quant.warm_up_linear (one call per row bucket), by Triton's own cache key
    (tests/runtime/kernels/startup/test_kernel_variants.py's Recorder, on CPU tensors)."""
    import random

    from radixlm.runtime.kernels.quant import fp8_act, fp8_gemm, fp8_mma, splitk, warm_up_linear
    from tests.runtime.kernels.startup.test_kernel_variants import Recorder, _assert_covered

    n, k = 4096, 2048  # 64 N tiles, 16 K tiles: tiles.split_k's split would differ with the row tiles (1-4)
    block = BLOCK if scheme.startswith("block") else None
    group = 128 if block else 0
    table = quant_tuned.parse([_entry(8, group, n, k, fused_act=scheme != "channel"),
                               _entry(16, group, n, k, block_n=128, fused_act=scheme != "channel"),
                               _entry(64, group, n, k, block_m=32, split_k=1), _entry(256, group, n, k, block_m=64)])
    monkeypatch.setattr(quant_tuned, "lookup", lambda device, *key: quant_tuned.lookup_in(table, *key))
    rec = Recorder(monkeypatch, {"mma": fp8_mma._fp8_mma_kernel, "rows": fp8_act._quant_rows_kernel,
                                 "groups": fp8_act._quant_groups_kernel, "reduce": splitk._reduce_splits_kernel,
                                 "w8a8": fp8_gemm._w8a8_kernel})
    w, s = ref.quant_fp8(torch.randn(n, k) * 0.05, block=block, per_channel=True)
    bias = torch.randn(n, dtype=torch.bfloat16)
    in_scale = torch.tensor(0.02) if scheme == "static" else None

    def apply(x):
        return fp8_gemm.fp8_linear_cuda(x, w, s, block, bias, in_scale)

    warm_up_linear(apply, k, torch.bfloat16, "cpu", max_rows=256)  # (257 rows: torch._scaled_mm, not on the CPU)
    warm = rec.take()
    assert "mma" in warm
    rng = random.Random(0)
    for m in [1, 3, 4, 5, 8, 9, 16, 17, 33, 64, 65, 128, 256] + [rng.randrange(5, 257) for _ in range(6)]:
        views = [torch.randn(m, k, dtype=torch.bfloat16), torch.randn(m + 1, k + 16, dtype=torch.bfloat16)[1:, :k]]
        if m >= 5:  # rows 8 elements apart: copied by fp8_mma (the default paths' launches would specialize)
            views.append(torch.randn(m, k + 8, dtype=torch.bfloat16)[:, 8:])
        for x in views:
            apply(x)
    serving = rec.take()
    assert serving.keys() <= warm.keys()
    _assert_covered(warm, serving)


_INT_ARGS = ("M", "N", "K", "stride_xm", "stride_xsm", "stride_wn", "stride_wsn", "stride_wsk", "stride_ym",
             "stride_ys", "k_tiles_per_split")


@pytest.mark.skipif(not _bundled_ptxas(), reason="needs Triton's bundled ptxas")
@pytest.mark.parametrize("act, blockwise", [(0, False), (1, True)])
def test_the_kernel_builds_for_sm90_on_fp8_wgmma(act, blockwise):
    """Built for sm_90 on the CPU (no GPU): per-channel with fp8_act's launch, blocks with the quantization fused; the
    K loop's dot is an e4m3 x e4m3 warp-group MMA and nothing spills."""
    import re

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from radixlm.runtime.kernels.quant import fp8_mma

    sig = {"X": "*fp8e4nv" if act == 0 else "*bf16", "XS": "*fp32", "W": "*fp8e4nv", "WS": "*fp32", "Bias": "*bf16",
           "Y": "*fp32", **{name: "i32" for name in _INT_ARGS}, "eps": "fp32", "fp8_max": "fp32"}
    consts = dict(ACT=act, BLOCKWISE=blockwise, GROUP_N=128 if blockwise else 1, HAS_BIAS=False, SPLIT=True,
                  EVEN_K=True, BLOCK_M=16, BLOCK_N=128, BLOCK_K=128)
    sig.update({name: "constexpr" for name in consts})
    names = list(sig)
    aligned = [names.index(a) for a in ("X", "XS", "W", "WS", "Bias", "Y", "N", "K", "stride_xm", "stride_wn",
                                        "stride_ym")]
    kernel = triton.compile(ASTSource(fp8_mma._fp8_mma_kernel, sig, constexprs=consts,
                                      attrs={(i,): [["tt.divisibility", 16]] for i in aligned}),
                            target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 4})
    dots = re.findall(r"warp_group_dot %\S+, %\S+, %\S+ .*? : (.*)", kernel.asm["ttgir"])
    assert dots and all(d.count("f8E4M3FN") >= 2 for d in dots), dots[:1]
    assert not any(re.search(r"\b(LDL|STL)\b", line) for line in _sass(kernel.asm["cubin"]))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fp8_mma_dispatch_through_a_table_cuda(monkeypatch):
    from radixlm.runtime.kernels import quant
    from radixlm.runtime.kernels.quant import fp8_gemm

    if not fp8_gemm.fp8_supported(torch.device("cuda")):
        pytest.skip("needs FP8 tensor cores (compute capability 8.9+)")
    n, k = 1024, 4096
    entries = []
    for group in (0, 128):
        entries += [_entry(8, group, n, k), _entry(16, group, n, k, block_n=128, fused_act=True),
                    _entry(64, group, n, k, block_m=64, split_k=1), _entry(256, group, n, k, block_m=128,
                                                                            block_n=128, num_warps=8, fused_act=True)]
    table = quant_tuned.parse(entries)
    monkeypatch.setattr(quant_tuned, "_table", lambda name: table)
    wf = torch.randn(n, k, device="cuda") * 0.02
    for block, per_channel, static in ((None, True, None), (None, False, torch.tensor(0.05, device="cuda")),
                                       (BLOCK, False, None)):
        w, s = ref.quant_fp8(wf, block=block, per_channel=per_channel)
        for m, dtype in ((5, torch.bfloat16), (16, torch.float16), (40, torch.bfloat16), (200, torch.bfloat16)):
            x = torch.randn(m, k, device="cuda", dtype=dtype)
            _close(quant.fp8_linear(x, w, s, block, None, static), ref.fp8_linear_w8a8(x, w, s, block, None, static),
                   2e-2)
    w, s = ref.quant_fp8(wf, block=BLOCK)
    x = torch.randn(40, k, device="cuda", dtype=torch.bfloat16)
    quant.fp8_linear(x, w, s, BLOCK)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = quant.fp8_linear(x, w, s, BLOCK)
    x.copy_(torch.randn_like(x))
    graph.replay()
    _close(y, ref.fp8_linear_w8a8(x, w, s, BLOCK), 2e-2)


if __name__ == "__main__":
    run_cases()
