"""Batch-invariant GEMM (--enable-deterministic-inference): a row's output is a function of that row alone, not of
how many rows the GEMM has or what they hold, so a request's logits do not change with the batch around it.

Every other GEMM path chooses by the row count M (cuBLAS's heuristics, the few-row Triton kernels, split-K, tuned
cuBLASLt entries, oneDNN's blocking), and each choice sums K in its own order. Here:
- CUDA: one Triton kernel (batch_invariant_mm.py) with one tile configuration per weight shape for every M (a tuned
  table's entry or a default, never chosen by M), no split-K: each output element is one tile's walk over K in
  BLOCK_K steps, the same walk whatever M is.
- CPU: the rows go through torch's GEMM (oneDNN-packed where the layer has a packed weight) in blocks of exactly
  CPU_ROW_BLOCK rows, the last block padded with zeros, so that every call has one shape and takes one path.
  (Measured on x86 with MKL/oneDNN, float32 and bfloat16: a row's result differs between M = 1 and M >= 2 at K =
  2048 unpadded, and is identical at every M and every position in the block padded.)
The bias is added after the GEMM, element-wise, on both devices."""
from __future__ import annotations

import torch
import torch.nn.functional as F

CPU_ROW_BLOCK = 16


class BatchInvariantMemo(dict):
    """The GEMM choice memo of a layer in deterministic mode (dispatch.linear's `choices`): it names no kernel and
    takes none, and dispatch.linear sends the GEMM here."""

    def __setitem__(self, key, value) -> None:
        raise TypeError("a batch-invariant layer's GEMM takes no per-row-count choice")


def cpu_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               packed: torch.Tensor | None) -> torch.Tensor:
    from radixlm.runtime.kernels.gemm import cpu_gemm

    lead, k = x.shape[:-1], x.shape[-1]
    rows = x.reshape(-1, k)
    m = rows.shape[0]
    pad = -m % CPU_ROW_BLOCK
    if pad or not rows.is_contiguous():
        rows = torch.cat([rows, rows.new_zeros(pad, k)])
    out = torch.cat([cpu_gemm.linear(rows[i : i + CPU_ROW_BLOCK], weight, None, packed)
                     for i in range(0, rows.shape[0], CPU_ROW_BLOCK)]) if rows.shape[0] else \
        F.linear(rows, weight)
    out = out[:m]
    if bias is not None:
        out = out + bias
    return out.reshape(*lead, out.shape[-1])


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
           packed: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T (+ bias), each row's result independent of the others."""
    if not x.is_cuda:
        return cpu_linear(x, weight, bias, packed)
    from radixlm.runtime.kernels.gemm.batch_invariant_mm import matmul

    lead, k = x.shape[:-1], x.shape[-1]
    out = matmul(x.reshape(-1, k), weight, bias)
    return out.reshape(*lead, out.shape[-1])
