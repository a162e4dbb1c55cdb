"""The grouped quantized MoE kernels on CUDA (skipped without it) at real shapes: Qwen3-30B-A3B's layer (128 experts,
top-8, hidden 2048, moe_intermediate 768) in bfloat16 against the dequantizing reference (quant_moe_ref.py) at decode
and prefill token counts (w8a8 past W8A8_MIN_PAIRS_PER_EXPERT pairs an expert), K split and not; CUDA-graph capture
and replay; no Triton build after warm_up_grouped; and a FusedMoE of each method taking the grouped path."""
from __future__ import annotations

import dataclasses

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

TOL = 2e-2  # bfloat16 roundings of the intermediates, relative to the output's largest value
# w8a8: an intermediate one bfloat16 rounding apart between kernel and reference can round to the neighbouring FP8
# value (1/16 of it) when the activations are quantized before the down projection.
W8A8_TOL = 6e-2


def _experts(fmt: str, e: int, h: int, i: int, seed: int = 0, static: float | None = None):
    from radixlm.runtime.kernels.moe.quant_moe_ref import quantize_experts

    g = torch.Generator(device="cuda").manual_seed(seed)
    w13 = torch.randn(e, 2 * i, h, device="cuda", generator=g) * h**-0.5
    w2 = torch.randn(e, h, i, device="cuda", generator=g) * i**-0.5
    return (quantize_experts(w13, fmt, static_input=static, seed=seed),
            quantize_experts(w2, fmt, static_input=static, seed=seed + 1))


def local_experts(w, start: int, n: int):
    """Experts start .. start + n of a stack (a rank's share under expert parallelism)."""
    per_expert = ("weight", "scale", "qweight", "scales", "zeros", "perm")
    return dataclasses.replace(w, **{f: getattr(w, f)[start : start + n] for f in per_expert
                                     if getattr(w, f, None) is not None and f in w.__dataclass_fields__})


def _routing(t: int, e: int, k: int, h: int, seed: int, num_experts: int | None = None):
    from radixlm.runtime.kernels.moe import select_experts

    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(t, h, device="cuda", generator=g).to(torch.bfloat16)
    weights, ids = select_experts(torch.randn(t, num_experts or e, device="cuda", generator=g), k, renormalize=True)
    return x, weights, ids


def _check(x, w13, w2, weights, ids, start=0, num_experts=None, **kw):
    from radixlm.runtime.kernels.moe.quant_moe import ActQuant, act_quant, fused_experts_quant, uses_w8a8
    from radixlm.runtime.kernels.moe.quant_moe_ref import fused_experts_quant_reference
    from tests.runtime.kernels.moe.quant_moe_cases import rel_err

    got = fused_experts_quant(x, w13, w2, weights, ids, start, num_experts, **kw)
    w8a8 = kw.get("w8a8")
    if w8a8 is None:
        w8a8 = uses_w8a8(ids.numel(), w13.shape[0])
    want = fused_experts_quant_reference(x, w13, w2, weights, ids, start, w8a8)
    assert got.dtype == x.dtype and got.shape == want.shape
    err = rel_err(got, want)
    quantized_act = act_quant(w13, w8a8, x.dtype) is not ActQuant.NONE
    assert err <= (W8A8_TOL if quantized_act else TOL), (ids.shape, kw, err)
    return got


@pytest.mark.parametrize("fmt", ["fp8_channel", "fp8_block", "int4"])
def test_qwen3_moe_layer(fmt):
    torch.manual_seed(0)
    e, k, h, i = 128, 8, 2048, 768
    w13, w2 = _experts(fmt, e, h, i)
    for t in (1, 8, 64, 256, 1000):  # 1000 tokens: 62 pairs an expert, w8a8 for FP8
        x, weights, ids = _routing(t, e, k, h, seed=t)
        _check(x, w13, w2, weights, ids)
    x, weights, ids = _routing(3, e, k, h, seed=3)
    for split in (True, False):
        _check(x, w13, w2, weights, ids, split=split)
    if fmt.startswith("fp8"):
        x, weights, ids = _routing(64, e, k, h, seed=64)
        _check(x, w13, w2, weights, ids, w8a8=True)


@pytest.mark.parametrize("fmt, static", [("fp8_tensor", 0.02), ("fp8_tensor", None), ("int4_actorder", None),
                                         ("int8", None)])
def test_other_formats_and_expert_parallel(fmt, static):
    e, k, h, i = 16, 4, 1024, 384
    w13, w2 = _experts(fmt, e, h, i, seed=1, static=static)
    for t in (1, 40, 400):
        x, weights, ids = _routing(t, e, k, h, seed=t)
        _check(x, w13, w2, weights, ids)
        # the rank holding experts 8..15 of 16 (whole experts, expert parallelism)
        _check(x, local_experts(w13, 8, 8), local_experts(w2, 8, 8), weights, ids, 8, e)


def test_cuda_graph_replay_matches_eager():
    from radixlm.runtime.kernels.moe.quant_moe import fused_experts_quant, warm_up_grouped

    e, k, h, i = 128, 8, 2048, 768
    for fmt in ("fp8_block", "int4_actorder"):
        w13, w2 = _experts(fmt, e, h, i, seed=2)
        warm_up_grouped(w13, w2, k, 0, e, torch.bfloat16, "cuda")
        for t in (1, 8, 64):
            x, weights, ids = _routing(t, e, k, h, seed=t)
            sx, sw, si = x.clone(), weights.clone(), ids.clone()
            fused_experts_quant(sx, w13, w2, sw, si)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = fused_experts_quant(sx, w13, w2, sw, si)
            for seed in (10, 11):
                x2, w2_, ids2 = _routing(t, e, k, h, seed=seed + t)
                sx.copy_(x2)
                sw.copy_(w2_)
                si.copy_(ids2)
                graph.replay()
                torch.cuda.synchronize()
                eager = fused_experts_quant(x2, w13, w2, w2_, ids2)
                # Within an expert the pairs' rows follow the atomics' order: equal up to the sum's order.
                torch.testing.assert_close(out, eager, rtol=1e-2, atol=1e-2 * eager.abs().max().item())


def test_no_triton_build_after_warm_up():
    from radixlm.runtime.kernels.moe import quant_moe

    def compiled() -> int:
        return sum(len(c[0]) for c in quant_moe._quant_grouped_kernel.device_caches.values())

    e, k, h, i = 32, 4, 1024, 256
    for fmt in ("fp8_channel", "int4"):
        w13, w2 = _experts(fmt, e, h, i, seed=3)
        quant_moe.warm_up_grouped(w13, w2, k, 0, e, torch.bfloat16, "cuda")
        before = compiled()
        for t in (1, 2, 5, 17, 100, 385, 700, 3000):
            x, weights, ids = _routing(t, e, k, h, seed=t)
            quant_moe.fused_experts_quant(x, w13, w2, weights, ids)
        torch.cuda.synchronize()
        assert compiled() == before, fmt


def test_fused_moe_layers_take_the_grouped_kernels(monkeypatch):
    from tests.runtime.kernels.moe.quant_moe_cases import rel_err
    from tests.runtime.quantization.test_moe_grouped import _layer, _methods

    for name, method in _methods().items():
        moe = _layer(method, e=8, k=2, h=256, i=128)
        # A static scale covering both GEMMs' inputs (the dummy 1/64 clips the down projection's, as a badly
        # calibrated checkpoint would; the CPU path does not quantize activations).
        for p in ("w13_input_scale", "w2_input_scale"):
            if hasattr(moe, p):
                getattr(moe, p).data.fill_(0.1)
        x = torch.randn(5, 256)
        logits = torch.randn(5, 8)
        want = moe(x, logits)  # CPU: the dequantizing path
        moe.to("cuda")
        monkeypatch.setattr(type(method), "dequantized", lambda *a: pytest.fail("dequantized on CUDA"))
        got = moe(x.cuda().to(torch.bfloat16), logits.cuda())
        monkeypatch.undo()
        assert rel_err(got.cpu(), want) < 5e-2, name
