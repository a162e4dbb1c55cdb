"""RMSNorm with the fused residual-add form used by every decoder layer (one Triton kernel on CUDA)."""
from __future__ import annotations

import torch
from torch import nn

from radixlm.runtime.distributed.parallel import Parallel
from radixlm.runtime.kernels.gemm import Prologue, PrologueKind


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        # Filled by the loader (or set to ones by the dummy loader); never read uninitialised.
        self.weight = nn.Parameter(torch.empty(hidden_size), requires_grad=False)
        self.variance_epsilon = eps

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        # Same op order as Hugging Face: normalise in float32, cast back, then scale in the input dtype.
        orig_dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(orig_dtype)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if x.is_cuda and x.dim() == 2:
            from radixlm.runtime.kernels.elementwise import rmsnorm

            return rmsnorm(x, self.weight, self.variance_epsilon, residual)
        if residual is None:
            return self._norm(x)
        # The sum is taken in the activation dtype (as HF does), so bf16 runs round like the reference.
        x = x + residual
        return self._norm(x), x

    def prologue(self, residual: torch.Tensor | None = None, reduce: Parallel | None = None) -> Prologue:
        """This norm (of x + residual, with a residual) as the step before a GEMM (the GEMM sets residual_out).
        reduce: x is a row-parallel partial sum over these ranks (summed first: Prologue.reduce)."""
        return Prologue(PrologueKind.RMSNORM if residual is None else PrologueKind.ADD_RMSNORM, self, residual,
                        reduce=reduce)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.variance_epsilon}"
