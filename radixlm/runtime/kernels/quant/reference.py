"""The quantized formats' arithmetic in torch: what a quantized weight means (dequantize), how a float weight becomes
one (quantize: online FP8, the dummy loader, test checkpoints), and the GEMMs as dequantize-then-matmul. The CPU path
of every quantized layer runs these; the CUDA kernels are checked against them.

Layouts (radixlm's own; every checkpoint format is converted to one of them at load):
  FP8     weight (N, K) float8_e4m3fn; scale float32: one value (per tensor), (N,) (per output channel) or
          (ceil(N / bn), ceil(K / bk)) for blocks of bn x bk (`block`); w = weight * scale.
  INT4    qweight (K // 8, N) int32, eight consecutive input channels per int32, channel k in bits 4 * (k % 8)
          (GPTQ's packing); scales and zeros (K // group_size, N) in the model's dtype; w[n, k] =
          (q[k, n] - zeros[k // group_size, n]) * scales[k // group_size, n], zeros integers in [0, 15] (every
          format's; the CUDA kernels rely on it). Act-order checkpoints are stored with
          their input channels sorted by group; `perm` (K,) gathers the input's channels into that order.
  INT8    weight (N, K) int8, symmetric; scale float32 (N,) per output channel; w = weight * scale (W8A8-INT8:
          activations quantized per token on the GPU path)."""
from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8_DTYPE).max
INT4_PACK = 8


def _expand_block_scale(scale: torch.Tensor, n: int, k: int, block: tuple[int, int]) -> torch.Tensor:
    bn, bk = block
    return scale.repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]


def fp8_scale_shape(n: int, k: int, block: tuple[int, int] | None, per_channel: bool) -> tuple[int, ...]:
    if block is not None:
        return (-(-n // block[0]), -(-k // block[1]))
    return (n,) if per_channel else ()


def dequant_fp8(weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] | None = None,
                dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(N, K) float weight of an FP8 one (any of the three scale shapes)."""
    w = weight.to(torch.float32)
    n, k = w.shape
    s = scale.to(torch.float32)
    if block is not None:
        s = _expand_block_scale(s, n, k, block)
    elif s.numel() > 1:
        s = s.reshape(n, 1)
    return (w * s).to(dtype)


def quant_fp8(w: torch.Tensor, block: tuple[int, int] | None = None,
              per_channel: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight, scale) with each scale the absolute maximum of its part / FP8_MAX (round to nearest)."""
    w = w.to(torch.float32)
    n, k = w.shape
    if block is not None:
        bn, bk = block
        padded = F.pad(w.abs(), (0, -k % bk, 0, -n % bn))
        amax = padded.reshape(padded.shape[0] // bn, bn, padded.shape[1] // bk, bk).amax(dim=(1, 3))
        scale = amax.clamp(min=1e-12) / FP8_MAX
        full = _expand_block_scale(scale, n, k, block)
    elif per_channel:
        scale = w.abs().amax(dim=1).clamp(min=1e-12) / FP8_MAX
        full = scale[:, None]
    else:
        scale = w.abs().amax().clamp(min=1e-12) / FP8_MAX
        full = scale
    q = (w / full).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] | None = None,
               bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ dequant(weight).T + bias in x's dtype (activations are not quantized on this path). What the CPU path
    computes, and the CUDA path's weight-only kernel (kernels/quant/fp8_w8a16.py, where it is chosen: up to
    fp8_gemm.W8A16_DEFAULT_MAX_ROWS rows, none by default; a static input scale is not used there), which sums in
    float32 and rounds once (here the dequantized weight is rounded to x's dtype first)."""
    return F.linear(x, dequant_fp8(weight, scale, block, x.dtype), bias)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """(K, N) integers in [0, 15] -> (K // 8, N) int32."""
    k, n = q.shape
    if k % INT4_PACK:
        raise ValueError(f"an INT4 weight's input size {k} is not a multiple of {INT4_PACK}")
    q = q.to(torch.int64).reshape(k // INT4_PACK, INT4_PACK, n)
    shifts = torch.arange(0, 32, 4, dtype=torch.int64, device=q.device).reshape(1, INT4_PACK, 1)
    packed = (q << shifts).sum(dim=1)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def unpack_int4(qweight: torch.Tensor) -> torch.Tensor:
    """(K // 8, N) int32 -> (K, N) uint8 in [0, 15]."""
    kp, n = qweight.shape
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=qweight.device).reshape(1, INT4_PACK, 1)
    return ((qweight.unsqueeze(1) >> shifts) & 0xF).reshape(kp * INT4_PACK, n).to(torch.uint8)


def dequant_int4(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int,
                 dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(N, K) float weight of an INT4 one: (q - z) * s in float32, rounded once to dtype. The CPU path runs it at
    every forward: it unpacks the transposed words' bytes (two channels each) straight into the (N, K) layout, 3-8x
    faster on a CPU than shifting every nibble out of the (K // 8, N) words and transposing the result."""
    kp, n = qweight.shape
    k = kp * INT4_PACK
    q = torch.empty(n, k // 2, 2, dtype=torch.float32, device=qweight.device)
    if sys.byteorder == "little":  # byte i of a row holds channels 2i (low nibble) and 2i + 1
        b = qweight.t().contiguous().view(torch.uint8)
        q[..., 0] = b & 0xF
        q[..., 1] = b >> 4
    else:
        q.view(n, k).copy_(unpack_int4(qweight).t())
    q = q.view(n, k)
    s, z = scales.to(torch.float32).t(), zeros.to(torch.float32).t()
    if k % group_size == 0:
        q.view(n, k // group_size, group_size).sub_(z.unsqueeze(-1)).mul_(s.unsqueeze(-1))
    else:
        q.sub_(z.repeat_interleave(group_size, 1)[:, :k]).mul_(s.repeat_interleave(group_size, 1)[:, :k])
    return q.to(dtype)


def quant_int4(w: torch.Tensor, group_size: int, symmetric: bool = False,
               dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Round-to-nearest INT4 of an (N, K) weight: (qweight, scales, zeros); symmetric puts every zero at 8."""
    w = w.to(torch.float32)
    n, k = w.shape
    if k % group_size:
        raise ValueError(f"input size {k} is not a multiple of the group size {group_size}")
    g = w.t().reshape(k // group_size, group_size, n)
    if symmetric:
        scales = (g.abs().amax(dim=1) / 7.5).clamp(min=1e-8)  # (q - 8) * s spans [-8 s, 7 s]
        zeros = torch.full_like(scales, 8.0)
    else:
        lo, hi = g.amin(dim=1), g.amax(dim=1)
        scales = ((hi - lo) / 15).clamp(min=1e-8)
        zeros = (-lo / scales).round().clamp(0, 15)
    q = (g / scales[:, None] + zeros[:, None]).round().clamp(0, 15).reshape(k, n)
    return pack_int4(q), scales.to(dtype), zeros.to(dtype)


def int4_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int,
                perm: torch.Tensor | None = None, bias: torch.Tensor | None = None) -> torch.Tensor:
    if perm is not None:
        x = x.index_select(-1, perm)
    return F.linear(x, dequant_int4(qweight, scales, zeros, group_size, x.dtype), bias)


# Activations (the CUDA paths' first step; SGLang's per-token and per-token-group FP8 quantization): each row (or each
# group of `group` consecutive channels of a row) gets scale = max(amax, ACT_EPS) / FP8_MAX; a static scale is given.
ACT_EPS = 1e-10


def quant_fp8_act(x: torch.Tensor, group: int | None = None,
                  static_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scale) of an (M, K) activation: scale (M, 1) per token, (M, ceil(K / group)) per token group, or the static
    scalar as given."""
    x = x.to(torch.float32)
    m, k = x.shape
    if static_scale is not None:
        if group is not None:
            raise ValueError("a static activation scale is per tensor: no group")
        s = static_scale.to(torch.float32).reshape(())
        return (x / s).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), s
    g = k if group is None else group
    padded = F.pad(x, (0, -k % g))
    amax = padded.abs().reshape(m, -1, g).amax(dim=2)
    scale = amax.clamp(min=ACT_EPS) / FP8_MAX
    full = scale.repeat_interleave(g, 1)[:, :k]
    return (x / full).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale


def dequant_fp8_act(q: torch.Tensor, scale: torch.Tensor, group: int | None = None) -> torch.Tensor:
    k = q.shape[1]
    s = scale.to(torch.float32)
    if s.dim() == 2 and group is not None:
        s = s.repeat_interleave(group, 1)[:, :k]
    return q.to(torch.float32) * s


def fp8_linear_w8a8(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                    block: tuple[int, int] | None = None, bias: torch.Tensor | None = None,
                    input_scale: torch.Tensor | None = None) -> torch.Tensor:
    """What the CUDA FP8 GEMMs compute (the W8A8 paths: fp8_gemm.py, torch._scaled_mm) where the weight-only kernel
    does not run, in
    float32, returned in x's dtype: the activations quantized (per token group of block[1] channels with block
    weights, else per token, or with the static input_scale), then multiplied by the dequantized weight. The
    weight-only kernel computes fp8_linear's arithmetic."""
    lead, k = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, k)
    group = block[1] if block is not None else None
    q, s = quant_fp8_act(x2, group, input_scale)
    xd = dequant_fp8_act(q, s, group)
    y = xd @ dequant_fp8(weight, scale, block).t()
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(x.dtype).reshape(*lead, weight.shape[0])


INT8_MAX = 127


def dequant_int8(weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(N, K) float weight of a per-channel INT8 one."""
    return (weight.to(torch.float32) * scale.to(torch.float32).reshape(-1, 1)).to(dtype)


def quant_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-channel INT8 (round half to even): (weight, scale) with scale = absmax / 127."""
    w = w.to(torch.float32)
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / INT8_MAX
    q = torch.round(w / scale[:, None]).clamp(-INT8_MAX - 1, INT8_MAX).to(torch.int8)
    return q, scale


def int8_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ dequant(weight).T + bias in x's dtype (activations are not quantized on this path)."""
    return F.linear(x, dequant_int8(weight, scale, x.dtype), bias)
