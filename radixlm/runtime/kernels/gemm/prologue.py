"""The element-wise step before a GEMM (an RMSNorm, with or without the residual add, or SiLU-and-mul), handed to
the GEMM as data: the skinny kernel of small decode batches fuses it into its input loads (one launch fewer, the
activations read from L2); every other path runs the step's own module first.

Under tensor parallelism x may still be a row-parallel GEMM's partial sum (`reduce` set): the sum over ranks is then
the step's first part, done with the norm in one kernel where the rank's comm can (Parallel.fused_add_rmsnorm). The sum
is a collective: Linear.matmul runs it before any GEMM, once (reduce_input), so no GEMM kernel sees it (none fuses it,
nor reruns it while timing kernels); where the comm did not take the norm too, the GEMM gets the plain step after it."""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn


class PrologueKind(enum.IntEnum):
    """Values are the skinny kernel's PRO constexpr (0 there: no prologue)."""

    RMSNORM = 1  # x -> weight * norm(x)
    ADD_RMSNORM = 2  # x, residual -> weight * norm(x + residual), and x + residual
    SILU_MUL = 3  # x = [gate | up] -> silu(gate) * up


class RankSum(Protocol):
    """The sum over tensor-parallel ranks (runtime.distributed.Parallel; kernels do not import it)."""

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor: ...

    def fused_add_rmsnorm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                          eps: float) -> tuple[torch.Tensor, torch.Tensor] | None: ...


@dataclass
class Prologue:
    """Built per call by the module that owns the step (RMSNorm.prologue, SiluAndMul.prologue)."""

    kind: PrologueKind
    module: nn.Module  # runs the step unfused: module(x), or module(x, residual) -> (out, x + residual)
    residual: torch.Tensor | None = None  # ADD_RMSNORM
    residual_out: torch.Tensor | None = None  # set by the GEMM that applied it (ADD_RMSNORM): x + residual
    reduce: RankSum | None = None  # x is this rank's partial sum over these ranks (reduce_input sums it)

    @property
    def norm_weight(self) -> torch.Tensor:
        return self.module.weight

    @property
    def eps(self) -> float:
        return self.module.variance_epsilon

    def in_features(self, x: torch.Tensor) -> int:
        """The GEMM's K for input x."""
        return x.shape[-1] // 2 if self.kind is PrologueKind.SILU_MUL else x.shape[-1]

    def fits(self, x: torch.Tensor) -> bool:
        """Whether a kernel that reads the step's inputs in place can run it on rows x of unit column stride (the
        skinny GEMM, fp8_prologue): a norm's weight contiguous in x's dtype, its residual shaped and typed as x."""
        if self.kind is PrologueKind.SILU_MUL:
            return True
        r = self.residual
        return (self.norm_weight.dtype == x.dtype and self.norm_weight.is_contiguous()
                and (r is None or (r.shape == x.shape and r.dtype == x.dtype and r.stride(1) == 1)))

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """The step unfused; returns the GEMM's input."""
        if self.reduce is not None:
            x, rest = self.reduce_input(x)
            if rest is None:
                return x
        if self.kind is PrologueKind.ADD_RMSNORM:
            out, self.residual_out = self.module(x, self.residual)
            return out
        return self.module(x)

    def reduce_input(self, x: torch.Tensor) -> tuple[torch.Tensor, "Prologue | None"]:
        """Runs the pending sum over ranks, once (reduce is cleared); returns x summed and this step, now a plain one
        (for the GEMM to fuse or run), or the step's output and None where the comm ran the norm with the sum."""
        reduce, self.reduce = self.reduce, None
        if self.kind is PrologueKind.ADD_RMSNORM:
            fused = reduce.fused_add_rmsnorm(x, self.residual, self.norm_weight, self.eps)
            if fused is not None:
                out, self.residual_out = fused
                return out, None
        return reduce.all_reduce(x), self


def apply(prologue: Prologue | None, x: torch.Tensor) -> torch.Tensor:
    return x if prologue is None else prologue.apply(x)
