"""The three INT4 checkpoint layouts, both ways: `*_to_int4` reads a checkpoint's tensors into radixlm's layout
(quantization/int4.py), `pack_*` writes them from codes, scales and zero points (the dummy loader and the tests'
checkpoints). Codes are unsigned (K, N) integers in [0, 15]; scales and zeros (G, N); g_idx (K,) the group of each
input channel.

Sources of each layout (read, not copied):
  AWQ GEMM   AutoAWQ awq/modules/linear/gemm.py (WQLinear_GEMM.from_linear) and awq/utils/packing_utils.py
             (dequantize_gemm): qweight (K, N // 8) and qzeros (G, N // 8) packed along N, code j of a word is
             column 8 c + AWQ_ORDER[j]; scales (G, N) float16; w = (q - z) * s.
  GPTQ       GPTQModel nn_modules/qlinear (dequantize_weight) and utils/model.py (convert_gptq_v1_to_v2_format_module):
             qweight (K // 8, N) packed along K (radixlm's own packing), qzeros (G, N // 8) packed along N in order,
             scales (G, N), g_idx (K,); w[:, k] = (q - z[g_idx[k]]) * s[g_idx[k]]. The v1 checkpoint format stores
             the packed word of (z - 1) computed as qzeros_v2 - 0x11111111 on the whole int32 (borrows included),
             so reading adds 0x11111111 back on the whole word.
  compressed-tensors pack-quantized (compressed_tensors.compressors.pack_quantized: pack_to_int32 /
             unpack_from_int32, 0.20): weight_packed (N, K // 8) packed along K of the signed code + 8,
             weight_scale (N, G), weight_zero_point (N // 8, G) packed along N (dim 0) when asymmetric, weight_shape
             [N, K], weight_g_idx (K,) for group act-order; w = (q_signed - zp_signed) * s."""
from __future__ import annotations

import torch

from radixlm.runtime.kernels.quant import pack_int4
from radixlm.runtime.quantization.int4 import (
    PACK, Int4Weight, default_g_idx, expect_shape, pack_cols, to_int4, unpack_cols, unpack_int4)

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # code j of a packed AWQ word is column 8 c + AWQ_ORDER[j]
GPTQ_V1_OFFSET = 0x11111111
SIGNED_OFFSET = 8  # compressed-tensors stores signed 4-bit codes + 8


def _wrap_int32(x: torch.Tensor) -> torch.Tensor:
    x = x.to(torch.int64) & 0xFFFFFFFF
    return torch.where(x >= 2**31, x - 2**32, x).to(torch.int32)


def _check_groups(scales: torch.Tensor, g_idx: torch.Tensor, name: str) -> None:
    if g_idx.numel() and int(g_idx.max()) >= scales.shape[0]:
        raise ValueError(f"{name}: its {scales.shape[0]} groups of scales do not cover group {int(g_idx.max())} "
                         f"(a wrong group size or an inconsistent checkpoint)")


# --- AWQ (GEMM) -----------------------------------------------------------------------------------------------------

def awq_to_int4(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor,
                dtype: torch.dtype, name: str) -> Int4Weight:
    """g_idx: the group of each of this rank's input channels (default_g_idx for a whole checkpoint tensor)."""
    k = qweight.shape[0]
    n = qweight.shape[1] * PACK
    expect_shape(scales, (scales.shape[0], n), f"{name}.scales")
    expect_shape(qzeros, (scales.shape[0], n // PACK), f"{name}.qzeros")
    _check_groups(scales, g_idx, name)
    q = unpack_cols(qweight, AWQ_ORDER)
    zeros = unpack_cols(qzeros, AWQ_ORDER).to(torch.float32)
    if k != g_idx.numel():
        raise ValueError(f"{name}.qweight has {k} input channels, expected {g_idx.numel()}")
    return to_int4(q, scales, zeros, g_idx, dtype, name)


def pack_awq(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"qweight": pack_cols(codes, AWQ_ORDER), "qzeros": pack_cols(zeros.round().to(torch.int64), AWQ_ORDER),
            "scales": scales.to(torch.float16)}


# --- GPTQ -----------------------------------------------------------------------------------------------------------

def gptq_to_int4(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor,
                 v1: bool, dtype: torch.dtype, name: str) -> Int4Weight:
    k = qweight.shape[0] * PACK
    n = qweight.shape[1]
    expect_shape(scales, (scales.shape[0], n), f"{name}.scales")
    expect_shape(qzeros, (scales.shape[0], -(-n // PACK)), f"{name}.qzeros")
    _check_groups(scales, g_idx, name)
    if k != g_idx.numel():
        raise ValueError(f"{name}.qweight has {k} input channels, expected {g_idx.numel()}")
    if v1:
        qzeros = _wrap_int32(qzeros.to(torch.int64) + GPTQ_V1_OFFSET)
    zeros = unpack_cols(qzeros)[:, :n].to(torch.float32)
    return to_int4(unpack_int4(qweight), scales, zeros, g_idx, dtype, name)


def pack_gptq(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, g_idx: torch.Tensor | None,
              v1: bool) -> dict[str, torch.Tensor]:
    qzeros = pack_cols(zeros.round().to(torch.int64))
    if v1:
        qzeros = _wrap_int32(qzeros.to(torch.int64) - GPTQ_V1_OFFSET)
    out = {"qweight": pack_int4(codes), "qzeros": qzeros, "scales": scales.to(torch.float16)}
    if g_idx is not None:
        out["g_idx"] = g_idx.to(torch.int32)
    return out


# --- compressed-tensors W4A16 pack-quantized -----------------------------------------------------------------------

def compressed_to_int4(weight_packed: torch.Tensor, weight_scale: torch.Tensor,
                       weight_zero_point: torch.Tensor | None, g_idx: torch.Tensor, dtype: torch.dtype,
                       name: str) -> Int4Weight:
    """weight_zero_point None: symmetric (every zero at the signed code 0)."""
    n = weight_packed.shape[0]
    k = g_idx.numel()
    expect_shape(weight_packed, (n, -(-k // PACK)), f"{name}.weight_packed")
    expect_shape(weight_scale, (n, weight_scale.shape[-1]), f"{name}.weight_scale")
    scales = weight_scale.t()
    _check_groups(scales, g_idx, name)
    q = unpack_cols(weight_packed)[:, :k].t()
    if weight_zero_point is None:
        zeros = torch.full(scales.shape, float(SIGNED_OFFSET))
    else:
        expect_shape(weight_zero_point, (-(-n // PACK), scales.shape[0]), f"{name}.weight_zero_point")
        zeros = unpack_cols(weight_zero_point.t())[:, :n].to(torch.float32)
    return to_int4(q, scales, zeros, g_idx, dtype, name)


def pack_compressed(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None,
                    g_idx: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """zeros None: symmetric, no weight_zero_point (codes centred on 8)."""
    k, n = codes.shape
    out = {"weight_packed": pack_cols(codes.t().contiguous()), "weight_scale": scales.t().contiguous(),
           "weight_shape": torch.tensor([n, k], dtype=torch.int64)}
    if zeros is not None:
        out["weight_zero_point"] = pack_cols(zeros.round().to(torch.int64)).t().contiguous()
    if g_idx is not None:
        out["weight_g_idx"] = g_idx.to(torch.int32)
    return out


__all__ = ["AWQ_ORDER", "awq_to_int4", "compressed_to_int4", "default_g_idx", "gptq_to_int4", "pack_awq",
           "pack_compressed", "pack_gptq"]
