"""Routings and float experts for the grouped quantized kernels' tests (interpreted and CUDA); the formats are
quant_moe_ref.quantize_experts'."""
from __future__ import annotations

import torch

from radixlm.runtime.kernels.moe import select_experts


def routed_problem(t: int, e: int, k: int, h: int, i: int, dtype: torch.dtype, num_experts: int | None = None,
                   seed: int = 0, device: str = "cpu"):
    """hidden (t, h), float experts w13 (e, 2i, h) and w2 (e, h, i), and a top-k routing over num_experts."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g)
    w13 = torch.randn(e, 2 * i, h, generator=g) * h**-0.5
    w2 = torch.randn(e, h, i, generator=g) * i**-0.5
    weights, ids = select_experts(torch.randn(t, num_experts or e, generator=g), k, renormalize=True)
    return x.to(device, dtype), w13.to(device), w2.to(device), weights.to(device), ids.to(device)


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    scale = want.float().abs().max().item() or 1.0
    return (got.float() - want.float()).abs().max().item() / scale
