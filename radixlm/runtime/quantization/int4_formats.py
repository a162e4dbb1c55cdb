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

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch

from radixlm.runtime.kernels.quant import pack_int4
from radixlm.runtime.quantization.base import QuantParam
from radixlm.runtime.quantization.int4 import (
    PACK, Codes, Int4Weight, default_g_idx, expect_shape, pack_cols, to_int4, unpack_cols, unpack_int4)

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
                dtype: torch.dtype, name: str, group: int | None = None) -> Int4Weight:
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
    return to_int4(q, scales, zeros, g_idx, dtype, name, group)


def pack_awq(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"qweight": pack_cols(codes, AWQ_ORDER), "qzeros": pack_cols(zeros.round().to(torch.int64), AWQ_ORDER),
            "scales": scales.to(torch.float16)}


# --- GPTQ -----------------------------------------------------------------------------------------------------------

def gptq_to_int4(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor,
                 v1: bool, dtype: torch.dtype, name: str, group: int | None = None) -> Int4Weight:
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
    return to_int4(unpack_int4(qweight), scales, zeros, g_idx, dtype, name, group)


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
                       name: str, group: int | None = None) -> Int4Weight:
    """weight_zero_point None: symmetric (every zero at the signed code 0)."""
    n = weight_packed.shape[0]
    k = g_idx.numel()
    expect_shape(weight_packed, (n, -(-k // PACK)), f"{name}.weight_packed")
    expect_shape(weight_scale, (n, weight_scale.shape[-1]), f"{name}.weight_scale")
    scales = weight_scale.t()
    _check_groups(scales, g_idx, name)
    q = unpack_cols(weight_packed)[:, :k].t()
    if weight_zero_point is None:
        zeros = torch.full(scales.shape, float(SIGNED_OFFSET), device=scales.device)
    else:
        expect_shape(weight_zero_point, (-(-n // PACK), scales.shape[0]), f"{name}.weight_zero_point")
        zeros = unpack_cols(weight_zero_point.t())[:, :n].to(torch.float32)
    return to_int4(q, scales, zeros, g_idx, dtype, name, group)


def pack_compressed(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None,
                    g_idx: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """zeros None: symmetric, no weight_zero_point (codes centred on 8)."""
    k, n = codes.shape
    out = {"weight_packed": pack_cols(codes.t().contiguous()), "weight_scale": scales.t().contiguous(),
           "weight_shape": torch.tensor([n, k], dtype=torch.int64, device=codes.device)}
    if zeros is not None:
        out["weight_zero_point"] = pack_cols(zeros.round().to(torch.int64)).t().contiguous()
    if g_idx is not None:
        out["weight_g_idx"] = g_idx.to(torch.int32)
    return out




# --- the formats as the INT4 methods see them ----------------------------------------------------------------------

class Int4Format(ABC):
    """One checkpoint layout of a linear's INT4 weight: its tensors (QuantParams at a group size), how they read
    into the INT4 layout, and how codes pack into them (the dummy loader)."""

    g_idx_name: ClassVar[str | None] = None  # the checkpoint's per-channel group tensor, if the format has one
    shape_name: ClassVar[str | None] = None  # compressed-tensors' weight_shape
    grouped: ClassVar[frozenset[str]]  # tensors whose input dim counts groups
    scale_name: ClassVar[str] = "scales"

    act_order: bool = False
    symmetric: bool = False

    @abstractmethod
    def params(self, group: int, dtype: torch.dtype) -> list[QuantParam]: ...

    @abstractmethod
    def convert(self, t: dict[str, torch.Tensor], g_idx: torch.Tensor, dtype: torch.dtype, name: str,
                group: int | None) -> Int4Weight: ...

    @abstractmethod
    def pack(self, codes: Codes) -> dict[str, torch.Tensor]: ...


@dataclass(frozen=True)
class AWQFormat(Int4Format):
    grouped: ClassVar[frozenset[str]] = frozenset({"qzeros", "scales"})

    def params(self, group: int, dtype: torch.dtype) -> list[QuantParam]:
        return [QuantParam("qweight", torch.int32, out_dim=1, in_dim=0, out_unit=PACK, exact_dtype=True),
                QuantParam("qzeros", torch.int32, out_dim=1, in_dim=0, out_unit=PACK, in_unit=group,
                           exact_dtype=True),
                QuantParam("scales", dtype, out_dim=1, in_dim=0, in_unit=group)]

    def convert(self, t, g_idx, dtype, name, group):
        return awq_to_int4(t["qweight"], t["qzeros"], t["scales"], g_idx, dtype, name, group)

    def pack(self, codes: Codes) -> dict[str, torch.Tensor]:
        return pack_awq(codes.codes, codes.scales, codes.zeros)


@dataclass(frozen=True)
class GPTQFormat(Int4Format):
    v1: bool = True
    act_order: bool = False
    symmetric: bool = True
    g_idx_name: ClassVar[str | None] = "g_idx"
    grouped: ClassVar[frozenset[str]] = frozenset({"qzeros", "scales"})

    def params(self, group: int, dtype: torch.dtype) -> list[QuantParam]:
        return [QuantParam("qweight", torch.int32, out_dim=1, in_dim=0, in_unit=PACK, exact_dtype=True),
                QuantParam("qzeros", torch.int32, out_dim=1, in_dim=0, out_unit=PACK, in_unit=group,
                           exact_dtype=True),
                QuantParam("scales", dtype, out_dim=1, in_dim=0, in_unit=group)]

    def convert(self, t, g_idx, dtype, name, group):
        return gptq_to_int4(t["qweight"], t["qzeros"], t["scales"], g_idx, self.v1, dtype, name, group)

    def pack(self, codes: Codes) -> dict[str, torch.Tensor]:
        return pack_gptq(codes.codes, codes.scales, codes.zeros, codes.g_idx, self.v1)


@dataclass(frozen=True)
class CompressedW4A16Format(Int4Format):
    symmetric: bool = True
    act_order: bool = False
    g_idx_name: ClassVar[str | None] = "weight_g_idx"
    shape_name: ClassVar[str | None] = "weight_shape"
    scale_name: ClassVar[str] = "weight_scale"
    grouped: ClassVar[frozenset[str]] = frozenset({"weight_scale", "weight_zero_point"})

    def params(self, group: int, dtype: torch.dtype) -> list[QuantParam]:
        out = [QuantParam("weight_packed", torch.int32, out_dim=0, in_dim=1, in_unit=PACK, exact_dtype=True),
               QuantParam("weight_scale", dtype, out_dim=0, in_dim=1, in_unit=group)]
        if not self.symmetric:
            out.append(QuantParam("weight_zero_point", torch.int32, out_dim=0, in_dim=1, out_unit=PACK,
                                  in_unit=group, exact_dtype=True))
        return out

    def convert(self, t, g_idx, dtype, name, group):
        return compressed_to_int4(t["weight_packed"], t["weight_scale"], t.get("weight_zero_point"), g_idx, dtype,
                                  name, group)

    def pack(self, codes: Codes) -> dict[str, torch.Tensor]:
        return pack_compressed(codes.codes, codes.scales, None if self.symmetric else codes.zeros,
                               codes.g_idx if self.act_order else None)


__all__ = ["AWQ_ORDER", "AWQFormat", "CompressedW4A16Format", "GPTQFormat", "Int4Format", "awq_to_int4",
           "compressed_to_int4", "default_g_idx", "gptq_to_int4", "pack_awq", "pack_compressed", "pack_gptq"]
