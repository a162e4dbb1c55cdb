"""The quantized experts the grouped MoE kernels (quant_moe.py) take, as views of a MoE method's loaded tensors, and
the choices that depend on them alone: whether the kernels run them (grouped_supported) and each launch's activation
handling (uses_w8a8, act_quant). Layouts: kernels/quant/reference.py's per expert, the expert dim first."""
from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from radixlm.runtime.kernels.quant.fp8_gemm import block_shape_ok, fp8_supported
from radixlm.runtime.kernels.quant.int4_gemm import int4_block_k
from radixlm.runtime.kernels.quant.reference import FP8_DTYPE, INT4_PACK

# Mean (token, expert) pairs per local expert above which FP8 experts quantize their activations (w8a8).
# On the H200 (benchmarks/results/kernels/h200/quant_moe_h200.json, Qwen3-30B-A3B's layer: 128 experts, top 8) w8a8
# was the faster from 8 tokens (0.5 pairs an expert: 95.8 us against weight-only's 104.7; 184 against 214 at 64
# tokens, 206 against 298 at 256) and weight-only at 1 token (0.06 pairs an expert: 40.4 against 42.6).
W8A8_MIN_PAIRS_PER_EXPERT = 0.25


class ActQuant(enum.IntEnum):
    NONE = 0  # weight-only
    TOKEN = 1  # FP8 per row, or the static input scale
    GROUP = 2  # FP8 per row group of the weight blocks' K size


@dataclass(frozen=True)
class ScaledExperts:
    """8-bit experts: weight (E, N, K) float8_e4m3fn or int8; scale float32 (E,), (E, N) or (E, ceil(N / bn),
    ceil(K / bk)) with block = (bn, bk); input_scale: a static activation scale (one value) or None."""

    weight: torch.Tensor
    scale: torch.Tensor
    block: tuple[int, int] | None = None
    input_scale: torch.Tensor | None = None

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(self.weight.shape)

    @property
    def fp8(self) -> bool:
        return self.weight.dtype == FP8_DTYPE

    def check(self, what: str) -> None:
        e, n, k = self.weight.shape
        if self.weight.dtype not in (FP8_DTYPE, torch.int8) or self.weight.stride(2) != 1:
            raise ValueError(f"{what}: 8-bit experts take a K-contiguous float8_e4m3fn or int8 weight, got "
                             f"{self.weight.dtype} strides {self.weight.stride()}")
        if self.block is not None:
            want = (e, -(-n // self.block[0]), -(-k // self.block[1]))
            if not (self.fp8 and block_shape_ok(self.block)):
                raise ValueError(f"{what}: block scales {self.block} need FP8 weights and a power-of-two K block >= 16")
        else:
            want = (e, n) if self.scale.dim() == 2 else (e,)
        if tuple(self.scale.shape) != want:
            raise ValueError(f"{what}: scale {tuple(self.scale.shape)}, expected {want}")
        if self.input_scale is not None and (self.input_scale.numel() != 1 or self.block is not None):
            raise ValueError(f"{what}: a static input scale is one value, and block weights take none")


@dataclass(frozen=True)
class Int4Experts:
    """INT4 experts: qweight (E, K // 8, N) int32, scales and zeros (E, K // group_size, N) in the activations'
    dtype, perm (E, K) or None."""

    qweight: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    group_size: int
    perm: torch.Tensor | None = None

    @property
    def shape(self) -> tuple[int, int, int]:
        e, kp, n = self.qweight.shape
        return e, n, kp * INT4_PACK

    def check(self, what: str) -> None:
        e, n, k = self.shape
        groups = -(-k // self.group_size) if self.group_size > 0 else 0
        if self.qweight.dtype != torch.int32 or self.group_size <= 0 or self.qweight.stride(2) != 1:
            raise ValueError(f"{what}: INT4 experts take an N-contiguous int32 qweight (E, K // 8, N) and a positive "
                             f"group size, got {self.qweight.dtype}, group size {self.group_size}")
        for name, t in (("scales", self.scales), ("zeros", self.zeros)):
            if tuple(t.shape) != (e, groups, n) or t.stride(2) != 1:
                raise ValueError(f"{what}: {name} {tuple(t.shape)}, expected ({e}, {groups}, {n}) N-contiguous")
        if self.perm is not None and (tuple(self.perm.shape) != (e, k) or self.perm.stride(1) != 1):
            raise ValueError(f"{what}: perm {tuple(self.perm.shape)}, expected ({e}, {k})")
        if int4_block_k(k, self.group_size) is None:
            raise ValueError(f"{what}: no K tile divides the group size {self.group_size}")


QuantExperts = ScaledExperts | Int4Experts


def grouped_supported(w13: QuantExperts, w2: QuantExperts, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether these experts run the grouped kernels for activations of dtype on device (else: dequantize them)."""
    if device.type != "cuda" or dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return False
    for w in (w13, w2):
        if isinstance(w, ScaledExperts):
            if w.fp8 and not fp8_supported(device):
                return False  # FP8 conversions and dots need compute capability 8.9
            if w.block is not None and not block_shape_ok(w.block):
                return False
        elif int4_block_k(w.shape[2], w.group_size) is None:
            return False
    return True


def uses_w8a8(num_pairs: int, n_local: int) -> bool:
    """Whether FP8 experts quantize the activations of a launch of num_pairs pairs (the module's docstring)."""
    return num_pairs / max(n_local, 1) > W8A8_MIN_PAIRS_PER_EXPERT


def act_quant(w: QuantExperts, w8a8: bool, dtype: torch.dtype) -> ActQuant:
    """The activation mode of one launch: w8a8 applies to FP8 experts in 16-bit activations only."""
    if not (w8a8 and isinstance(w, ScaledExperts) and w.fp8) or dtype == torch.float32:
        return ActQuant.NONE
    return ActQuant.GROUP if w.block is not None else ActQuant.TOKEN
