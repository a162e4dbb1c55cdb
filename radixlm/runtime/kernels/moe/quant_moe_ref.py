"""What the grouped quantized kernels (quant_moe.py) compute, in torch: the experts dequantized with kernels/quant's
reference arithmetic (weight-only: exactly the dequantizing MoE methods' path, fused_moe.fused_experts_torch on the
dequantized stack), and with w8a8 the activations' FP8 rounding (per token, per token group, or the static scale)
before each GEMM. The tests and benchmarks/kernels/quant_moe.py check the kernels against it, on experts made by
quantize_experts."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from radixlm.runtime.kernels.moe.fused_moe import fused_experts_torch
from radixlm.runtime.kernels.moe.quant_moe import ActQuant, Int4Experts, QuantExperts, ScaledExperts, act_quant
from radixlm.runtime.kernels.quant.reference import (
    FP8_DTYPE, dequant_fp8, dequant_fp8_act, dequant_int4, dequant_int8, quant_fp8, quant_fp8_act, quant_int4,
    quant_int8)

# quantize_experts' formats: FP8 per tensor / per channel / blocks, INT8 per channel, INT4 with and without act-order
FORMATS = ("fp8_tensor", "fp8_channel", "fp8_block", "int8", "int4", "int4_actorder")


def quantize_experts(w: torch.Tensor, fmt: str, block: tuple[int, int] = (128, 128), group: int = 128,
                     dtype: torch.dtype = torch.bfloat16, static_input: float | None = None,
                     seed: int = 0) -> QuantExperts:
    """w (E, N, K) float -> the experts in format fmt (scales and zeros of INT4 in dtype)."""
    if fmt.startswith("int4"):
        parts = [quant_int4(w[e], group, dtype=dtype) for e in range(w.shape[0])]
        perm = None
        if fmt == "int4_actorder":
            g = torch.Generator().manual_seed(seed)
            perm = torch.stack([torch.randperm(w.shape[2], generator=g) for _ in range(w.shape[0])]).to(w.device)
        return Int4Experts(*(torch.stack([p[i] for p in parts]) for i in range(3)), group, perm)
    if fmt == "int8":
        parts = [quant_int8(w[e]) for e in range(w.shape[0])]
        return ScaledExperts(torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts]))
    blk = block if fmt == "fp8_block" else None
    parts = [quant_fp8(w[e], blk, per_channel=fmt == "fp8_channel") for e in range(w.shape[0])]
    static = None if static_input is None else torch.tensor(static_input, device=w.device)
    return ScaledExperts(torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts]), blk, static)


def dequant_experts(w: QuantExperts, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(E, N, K) float experts, input channels in the checkpoint's order (an act-order perm undone)."""
    out = []
    for e in range(w.shape[0]):
        if isinstance(w, Int4Experts):
            d = dequant_int4(w.qweight[e], w.scales[e], w.zeros[e], w.group_size, dtype)
            if w.perm is not None:
                unpermuted = torch.empty_like(d)
                unpermuted[:, w.perm[e].long()] = d
                d = unpermuted
        elif w.weight.dtype == FP8_DTYPE:
            d = dequant_fp8(w.weight[e], w.scale[e], w.block, dtype)
        else:
            d = dequant_int8(w.weight[e], w.scale[e], dtype)
        out.append(d)
    return torch.stack(out)


def _act_rounded(x: torch.Tensor, w: QuantExperts, act: ActQuant) -> torch.Tensor:
    if act is ActQuant.NONE:
        return x.float()
    assert isinstance(w, ScaledExperts)
    group = w.block[1] if act is ActQuant.GROUP else None
    q, s = quant_fp8_act(x, group, w.input_scale if act is ActQuant.TOKEN else None)
    return dequant_fp8_act(q, s, group)


def fused_experts_quant_reference(hidden: torch.Tensor, w13: QuantExperts, w2: QuantExperts,
                                  topk_weights: torch.Tensor, topk_ids: torch.Tensor, expert_start: int = 0,
                                  w8a8: bool = False) -> torch.Tensor:
    """(T, H) in hidden's dtype. Weight-only: fused_experts_torch on the dequantized experts in hidden's dtype (the
    CPU path of the MoE methods). w8a8: float32 GEMMs on the FP8-rounded activations, the intermediates rounded to
    hidden's dtype where the kernels store them."""
    dtype = hidden.dtype
    act13, act2 = act_quant(w13, w8a8, dtype), act_quant(w2, w8a8, dtype)
    if act13 is ActQuant.NONE and act2 is ActQuant.NONE:
        return fused_experts_torch(hidden, dequant_experts(w13, dtype), dequant_experts(w2, dtype), topk_weights,
                                   topk_ids, expert_start)
    t, k = topk_ids.shape
    w13f, w2f = dequant_experts(w13), dequant_experts(w2)
    inter_size = w2f.shape[2]
    x = _act_rounded(hidden, w13, act13)
    out = torch.zeros(t, hidden.shape[1], dtype=torch.float32, device=hidden.device)
    ids = topk_ids.long() - expert_start
    for e in range(w13f.shape[0]):
        tok, slot = torch.nonzero(ids == e, as_tuple=True)
        if not tok.numel():
            continue
        gate_up = (x[tok] @ w13f[e].t()).to(dtype).float()
        inter = (F.silu(gate_up[:, :inter_size]) * gate_up[:, inter_size:]).to(dtype)
        y = (_act_rounded(inter, w2, act2) @ w2f[e].t()) * topk_weights[tok, slot].float()[:, None]
        out.index_add_(0, tok, y.to(dtype).float())
    return out.to(dtype)
