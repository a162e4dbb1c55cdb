"""INT4 weight-only checkpoints (AWQ, GPTQ, compressed-tensors W4A16) -> radixlm's INT4 layout
(kernels/quant/reference.py: qweight (K // 8, N) packed along K, scales/zeros (K // g, N), optional perm).

Every format reduces to the same intermediate: the unsigned codes q (K, N) in [0, 15], per-group scales and zero
points (G, N) and the group of each input channel (`g_idx`, (K,)), with w[n, k] = (q[k, n] - z[g_idx[k], n]) *
s[g_idx[k], n]. `to_int4` turns that into the layout: channels sorted by group (the perm, when that is not the
identity), and the groups of the sorted channels made uniform. A rank of a row-parallel layer whose channels do not
cover whole groups (act-order, or a group wider than the rank's share) gets the greatest group size that divides
every run of one group (down to 1: exact, at the price of more scales)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from radixlm.runtime.kernels.quant import dequant_int4, pack_int4, quant_int4, unpack_int4

PACK = 8  # INT4 codes per int32
IDENTITY_ORDER = (0, 1, 2, 3, 4, 5, 6, 7)


@dataclass(frozen=True)
class Int4Weight:
    """One linear's weight in radixlm's INT4 layout (the arguments of kernels.quant.int4_linear)."""

    qweight: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    group_size: int
    perm: torch.Tensor | None

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The (N, K) float weight, input channels in the checkpoint's order."""
        w = dequant_int4(self.qweight, self.scales, self.zeros, self.group_size, dtype)
        if self.perm is None:
            return w
        out = torch.empty_like(w)
        out[:, self.perm] = w
        return out


def unpack_cols(packed: torch.Tensor, order: tuple[int, ...] = IDENTITY_ORDER) -> torch.Tensor:
    """(R, C) int32 packed along the second dim -> (R, 8 C) uint8 codes; code j of word c is column
    8 c + order[j] (GPTQ's qzeros: the identity; AWQ: its interleaved order)."""
    r, c = packed.shape
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=packed.device)
    nibbles = ((packed.to(torch.int32).unsqueeze(-1) >> shifts) & 0xF).to(torch.uint8)  # (R, C, 8): nibble j
    out = torch.empty_like(nibbles)
    out[:, :, list(order)] = nibbles
    return out.reshape(r, c * PACK)


def pack_cols(codes: torch.Tensor, order: tuple[int, ...] = IDENTITY_ORDER) -> torch.Tensor:
    """Inverse of unpack_cols: (R, 8 C) integers in [0, 15] -> (R, C) int32."""
    r, n = codes.shape
    if n % PACK:
        raise ValueError(f"{n} columns cannot be packed eight to an int32")
    c = codes.to(torch.int64).reshape(r, n // PACK, PACK)[:, :, list(order)]  # nibble j = column order[j]
    shifts = torch.arange(0, 32, 4, dtype=torch.int64, device=codes.device)
    packed = (c << shifts).sum(dim=-1)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def default_g_idx(k: int, group_size: int, start: int = 0, device=None) -> torch.Tensor:
    return torch.arange(start, start + k, device=device, dtype=torch.int64) // group_size


def uniform_group(g_idx: torch.Tensor) -> int:
    """The greatest group size of uniform groups over the channels sorted by g_idx (it divides every group's count
    of channels)."""
    runs = torch.unique(g_idx, return_counts=True)[1]
    return math.gcd(*runs.tolist())


def to_int4(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, g_idx: torch.Tensor,
            dtype: torch.dtype, what: str, group: int | None = None) -> Int4Weight:
    """q (K, N) codes, scales and zeros (G, N), g_idx (K,) group of each channel -> the layout (see the module).
    group: the layout's group size (default uniform_group(g_idx); experts stacked together share one)."""
    k, n = q.shape
    if k % PACK:
        raise ValueError(f"{what}: input size {k} is not a multiple of {PACK}")
    if tuple(g_idx.shape) != (k,):
        raise ValueError(f"{what}: g_idx has shape {tuple(g_idx.shape)}, expected ({k},)")
    if scales.shape != zeros.shape or scales.dim() != 2 or scales.shape[1] != n:
        raise ValueError(f"{what}: scales {tuple(scales.shape)} and zeros {tuple(zeros.shape)} must both be "
                         f"(groups, {n})")
    g_idx = g_idx.to(torch.int64)
    if k and (int(g_idx.min()) < 0 or int(g_idx.max()) >= scales.shape[0]):
        raise ValueError(f"{what}: g_idx names groups {int(g_idx.min())}..{int(g_idx.max())}, "
                         f"the checkpoint has {scales.shape[0]}")
    perm = torch.argsort(g_idx, stable=True)
    sorted_groups = g_idx[perm]
    if group is None:
        group = uniform_group(g_idx)
    elif uniform_group(g_idx) % group:
        raise ValueError(f"{what}: group size {group} does not divide the runs of its groups")
    first = sorted_groups[::group]  # the group of each uniform block of the sorted channels
    identity = bool((perm == torch.arange(k, device=perm.device)).all())
    q_sorted = q if identity else q[perm]
    return Int4Weight(pack_int4(q_sorted), scales[first].to(dtype).contiguous(), zeros[first].to(dtype).contiguous(),
                      group, None if identity else perm.contiguous())


@dataclass(frozen=True)
class Codes:
    """A quantized weight before any checkpoint packing: codes (K, N) in [0, 15], scales and zeros (G, N), g_idx
    (K,) the group of each input channel; w[n, k] = (codes[k, n] - zeros[g, n]) * scales[g, n], g = g_idx[k]."""

    codes: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    g_idx: torch.Tensor

    def dequantize(self) -> torch.Tensor:
        g = self.g_idx.long()
        return ((self.codes.float() - self.zeros.float()[g]) * self.scales.float()[g]).t().contiguous()


def quantize_codes(w: torch.Tensor, group_size: int, symmetric: bool, act_order: torch.Tensor | None = None,
                   scale_dtype: torch.dtype = torch.float16) -> Codes:
    """Round-to-nearest codes of an (N, K) float weight (kernels.quant.quant_int4). act_order: a permutation of the
    input channels quantized in that order (GPTQ's desc_act: g_idx[act_order[i]] = i // group_size). Scales are
    stored in scale_dtype (a checkpoint's float16); `dequantize` uses the scales stored."""
    n, k = w.shape
    dev = w.device
    order = act_order.to(dev) if act_order is not None else torch.arange(k, device=dev)
    qweight, scales, zeros = quant_int4(w[:, order], group_size, symmetric)
    scales = scales.to(scale_dtype)
    codes = torch.empty(k, n, dtype=torch.uint8, device=dev)
    codes[order] = unpack_int4(qweight)
    g_idx = torch.empty(k, dtype=torch.int64, device=dev)
    g_idx[order] = torch.arange(k, device=dev) // group_size
    return Codes(codes, scales, zeros, g_idx)


def check_bits(bits: int, what: str) -> None:
    if bits != 4:
        raise ValueError(f"{what}: {bits}-bit weights are not supported; radixlm loads 4-bit INT4 checkpoints only")


def expect_shape(t: torch.Tensor, shape: tuple[int, ...], name: str) -> None:
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(shape)} (a wrong group size or an "
                         f"inconsistent checkpoint)")


__all__ = ["Codes", "Int4Weight", "check_bits", "default_g_idx", "expect_shape", "pack_cols", "quantize_codes",
           "to_int4", "uniform_group", "unpack_cols", "unpack_int4"]
