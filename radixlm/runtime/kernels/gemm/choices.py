"""The layers' few-row GEMM choice memos (dispatch.linear's `choices`): shared by the layers of one kind and weight
shape, and counted by kernel for the start-up log and the benchmarks."""
from __future__ import annotations

from typing import Protocol

import torch

from radixlm.runtime.kernels.gemm.dispatch import kernel_of


class GemmHolder(Protocol):
    """A module whose GEMM keeps a choice memo (a Linear layer, the lm_head's LogitsProcessor); those with a weight
    (and a bias, or None) take tuned cuBLASLt entries (tuned_gemm.install)."""

    gemm_choices: dict


def share_gemm_choices(holders: list[tuple[str, GemmHolder]]) -> None:
    """Layers of one kind and weight shape share one few-row GEMM choice memo, which dispatch.linear then measures
    once for them all: measured per layer, an 8B model's start-up timed each choice 32 times over, and the layers'
    choices differed only where the two candidates were within the timing's noise (qkv_proj at two rows: 1/31 and
    2/30 layers on the skinny kernel in two start-ups, kernels_h100/skinny_mma_ab/probe.log)."""
    memos: dict[tuple, dict] = {}
    for name, holder in holders:
        weight: torch.Tensor | None = getattr(holder, "weight", None)
        if weight is not None:
            has_bias = getattr(holder, "bias", None) is not None
            kind = (name.rsplit(".", 1)[-1], tuple(weight.shape), weight.dtype, has_bias)
            holder.gemm_choices = memos.setdefault(kind, holder.gemm_choices)


def gemm_choice_counts(holders: list[tuple[str, GemmHolder]]) -> dict[str, dict[int, dict[str, int]]]:
    """Per GEMM (the holder's attribute name: qkv_proj, o_proj, ..., lm_head) and choice key: how many layers take
    each kernel (dispatch.GemmKernel, lower case) by dispatch.linear's measurement (empty off CUDA)."""
    counts: dict[str, dict[int, dict[str, int]]] = {}
    for name, holder in holders:
        for key, kernel in sorted(holder.gemm_choices.items()):
            by_kernel = counts.setdefault(name.rsplit(".", 1)[-1], {}).setdefault(key, {})
            kernel = kernel_of(kernel).name.lower()
            by_kernel[kernel] = by_kernel.get(kernel, 0) + 1
    return counts


def format_gemm_choices(counts: dict[str, dict[int, dict[str, int]]]) -> str:
    """gemm_choice_counts on one line: `qkv_proj 1: skinny 32, 2: cublas 30 + skinny_mma 2; o_proj ...`
    (choice key: kernel and layers; keys past 4 are the tensor-core kernel's padded row counts)."""
    return "; ".join(f"{name} " + ", ".join(f"{key}: " + " + ".join(f"{kernel} {n}" for kernel, n in kernels.items())
                                            for key, kernels in by_key.items())
                     for name, by_key in counts.items())
