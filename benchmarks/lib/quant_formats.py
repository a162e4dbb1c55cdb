"""The quantized GEMM formats as the kernel benchmarks measure them (kernels/quant_gemm.py, quant_gemv_sweep.py,
quant_moe.py): group and block sizes, a weight's bytes with its scales, the bytes floor at the H200's HBM rate, and
the relative error against kernels/quant/reference.py."""
from __future__ import annotations

import torch

HBM_TB_S = 4.8  # the H200's HBM3e, by the datasheet
GROUP = 128  # W4A16's group
BLOCK = (128, 128)  # FP8 block scales
TOLERANCE = 2e-2  # max |error| / max |reference| of a correct kernel


def weight_bytes(fmt: str, n: int, k: int) -> int:
    """An (n, k) weight's bytes in `fmt` (bf16, fp8_channel*, fp8_block*, w4a16*: a forced variant's suffix aside)."""
    fmt = fmt.removesuffix("_mma").removesuffix("_gemv").removesuffix("_w8a8")
    if fmt == "bf16":
        return 2 * n * k
    if fmt.startswith("fp8_channel"):
        return n * k + 4 * n
    if fmt == "fp8_block":
        return n * k + 4 * -(-n // BLOCK[0]) * -(-k // BLOCK[1])
    return n * k // 2 + 2 * 2 * (k // GROUP) * n  # packed INT4 + bf16 scales and zeros


def floor_us(fmt: str, n: int, k: int, m: int) -> float:
    """The weight with its scales and m rows of bf16 input and output, read once at HBM_TB_S."""
    return (weight_bytes(fmt, n, k) + 2 * m * (k + n)) / (HBM_TB_S * 1e12) * 1e6


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()
