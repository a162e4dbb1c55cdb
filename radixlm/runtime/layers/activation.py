"""Gated activations."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.runtime.kernels.gemm import Prologue, PrologueKind


class SiluAndMul(nn.Module):
    """x = [gate | up] along the last dim; returns silu(gate) * up."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda and x.dim() == 2:
            from radixlm.runtime.kernels.elementwise import silu_and_mul

            return silu_and_mul(x)
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:]

    def prologue(self) -> Prologue:
        """This activation as the step before a GEMM (the down projection's)."""
        return Prologue(PrologueKind.SILU_MUL, self)
