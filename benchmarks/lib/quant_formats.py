"""The quantized GEMM formats as the kernel benchmarks measure them (kernels/quant_gemm.py, quant_gemv_sweep.py,
quant_moe.py): group and block sizes, a weight's bytes with its scales, the bytes floor at the H200's HBM rate, the
relative error against kernels/quant/reference.py; and for the few-row sweep, a format's weights, its call (the
default path or a forced kernel config), its reference and one candidate's checked, timed cell."""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from radixlm.runtime.kernels import quant
from radixlm.runtime.kernels.quant import reference as ref
from radixlm.runtime.kernels.quant.fp8_gemv import fp8_gemv_linear
from radixlm.runtime.kernels.quant.int4_mma import Int4MmaConfig, w4a16_mma_linear
from radixlm.runtime.kernels.quant.int4_skinny import w4a16_skinny_linear

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


def config_dict(cfg) -> dict:
    out = dataclasses.asdict(cfg)
    return {**out, "x_load": cfg.x_load.value} if isinstance(cfg, Int4MmaConfig) else out


def make_weights(fmt: str, n: int, k: int, device: str, copies: int) -> list:
    made = []
    for _ in range(copies):
        w = torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02
        if fmt == "bf16":
            made.append(w if device == "cuda" else w.float())  # (a dry run: float32 activations)
        elif fmt == "fp8_channel":
            made.append(ref.quant_fp8(w, per_channel=True))
        elif fmt == "fp8_block":
            made.append(ref.quant_fp8(w, block=BLOCK))
        else:
            made.append(ref.quant_int4(w, GROUP, dtype=torch.bfloat16))
    return made


def format_linear(fmt: str, x: torch.Tensor, weight, cfg=None) -> torch.Tensor:
    """cfg None: the format's default path (no tuned table: the sweep's process never installs one)."""
    block = BLOCK if fmt == "fp8_block" else None
    if fmt == "bf16":
        return F.linear(x, weight)
    if fmt.startswith("fp8"):
        if cfg is None:
            return quant.fp8_linear(x, *weight, block)
        return fp8_gemv_linear(x, *weight, block, None, cfg)
    if cfg is None:
        return quant.int4_linear(x, *weight, GROUP)
    if isinstance(cfg, Int4MmaConfig):
        return w4a16_mma_linear(x, *weight, GROUP, None, None, cfg)
    return w4a16_skinny_linear(x, *weight, GROUP, None, None, cfg)


def format_reference(fmt: str, x: torch.Tensor, weight) -> torch.Tensor:
    if fmt.startswith("fp8"):
        return ref.fp8_linear(x.float(), *weight, BLOCK if fmt == "fp8_block" else None)
    return ref.int4_linear(x.float(), *[t.float() if t.is_floating_point() else t for t in weight], GROUP)


def bf16_kernels(m: int):
    """The bf16 candidates at m rows: cuBLAS, and the skinny Triton kernels where they take m rows."""
    out = {"cublas": lambda x, w: F.linear(x, w)}
    if not torch.cuda.is_available():
        return out
    from radixlm.runtime.kernels.gemm import skinny_gemm, skinny_mma

    if m <= skinny_gemm.SKINNY_MAX_M:
        out["skinny"] = lambda x, w: skinny_gemm.skinny_linear(x, w)
    if skinny_mma.MMA_MIN_M <= m <= skinny_mma.MMA_MAX_M:
        out["skinny_mma"] = lambda x, w: skinny_mma.skinny_mma_linear(x, w)
    return out


def try_candidate(fmt: str, x: torch.Tensor, weights: list, cfg, timer) -> dict:
    """One candidate's cell: its error against the reference, then (when correct) its time; a config that does not
    build or launch here gets the error instead."""
    cell = {"config": config_dict(cfg)}
    try:
        cell["rel_err"] = rel_err(format_linear(fmt, x, weights[0], cfg), format_reference(fmt, x, weights[0]))
        if cell["rel_err"] > TOLERANCE:
            cell["error"] = "wrong result"
        else:
            cell["us"] = timer(lambda i: format_linear(fmt, x, weights[i], cfg), len(weights))
    except Exception as e:  # noqa: BLE001 - a config that does not build or launch here is skipped
        cell["error"] = f"{type(e).__name__}: {str(e)[:200]}"
    return cell
