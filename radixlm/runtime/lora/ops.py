"""The batched LoRA product: each row's `x @ A[slot]^T @ B[slot]^T * scaling[slot]`, added to the base layer's
output; rows of slot -1 (the base model) get nothing. One entry point, `add_lora_delta`, for every layer and pass.

Buffers per layer (see LoraLayer): A (slots, parts * max_rank, in), B (slots, out, parts * max_rank), where B is block
diagonal over the fused parts (q|k|v, gate|up): part j's output rows read only its own rank block of A. Ranks below
max_rank are zero-padded, so one shape serves every adapter."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LoraBatchInfo:
    """A pass's rows by slot, on the device (set by LoraManager.prepare; carried in ForwardBatch.lora).

    Segments are runs of consecutive rows of one slot (the Triton segment kernel's input for prefill); `groups` the
    same rows by slot (the torch path: one pair of GEMMs per adapter in the pass); `row_slots` each row's slot (the
    gather kernel's input for decode)."""

    row_slots: torch.Tensor  # (rows,) int32, -1: base model
    seg_starts: torch.Tensor  # (segments,) int32
    seg_lens: torch.Tensor  # (segments,) int32
    seg_slots: torch.Tensor  # (segments,) int32
    groups: tuple[tuple[int, torch.Tensor], ...]  # (slot, its rows' indices (int64)) per slot used, base excluded
    scalings: torch.Tensor  # (slots,) float32: alpha / r (or / sqrt(r)) of the adapter in each slot
    max_seg_len: int

    @property
    def uses_lora(self) -> bool:
        return bool(self.groups)

    @staticmethod
    def build(req_slots: list[int], req_rows: list[int], scalings: torch.Tensor, device) -> "LoraBatchInfo":
        """req_slots: each request's slot (-1: none); req_rows: its rows in the pass (consecutive, in order)."""
        if len(req_slots) != len(req_rows):
            raise ValueError(f"{len(req_slots)} request slots for {len(req_rows)} requests")
        starts, lens, slots = [], [], []
        row = 0
        for s, n in zip(req_slots, req_rows):
            if n <= 0:
                continue
            if slots and slots[-1] == s and starts[-1] + lens[-1] == row:
                lens[-1] += n
            else:
                starts.append(row)
                lens.append(n)
                slots.append(s)
            row += n
        row_slots = torch.tensor([s for s, n in zip(req_slots, req_rows) for _ in range(n)], dtype=torch.int32)
        groups = []
        for s in sorted(set(slots) - {-1}):
            groups.append((s, torch.nonzero(row_slots == s).flatten().to(device)))
        as_dev = lambda v: torch.tensor(v, dtype=torch.int32, device=device)
        return LoraBatchInfo(row_slots.to(device), as_dev(starts), as_dev(lens), as_dev(slots), tuple(groups),
                             scalings, max(lens, default=0))


def lora_delta_torch(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, info: LoraBatchInfo) -> torch.Tensor:
    """The reference path (CPU, and the tests' oracle): per adapter in the pass, its rows' two GEMMs."""
    out = torch.zeros(x.shape[0], b.shape[1], dtype=x.dtype, device=x.device)
    for slot, rows in info.groups:
        xs = x.index_select(0, rows)
        delta = (xs @ a[slot].t()) @ b[slot].t()
        out.index_add_(0, rows, delta * info.scalings[slot].to(x.dtype))
    return out


def add_lora_delta(base: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                   info: LoraBatchInfo | None, use_triton: bool = False) -> torch.Tensor:
    """base + each row's LoRA delta (base unchanged where no row uses an adapter).

    use_triton (CUDA, --lora-backend triton): the segment kernels (kernels/lora), two launches per layer for a batch
    mixing adapters and the base model, adding in place. Not yet replayable in a CUDA graph (the segment count varies
    per pass): LoRA passes run eagerly. Otherwise the torch path, exact but one pair of GEMMs per adapter."""
    if info is None or not info.uses_lora:
        return base
    if use_triton:
        from radixlm.runtime.kernels import lora as lora_kernels

        out = base if base.stride(-1) == 1 else base.contiguous()
        return lora_kernels.segment_lora_add(out, x if x.stride(-1) == 1 else x.contiguous(), a, b, info.seg_starts,
                                             info.seg_lens, info.seg_slots, info.scalings, info.max_seg_len)
    return base + lora_delta_torch(x, a, b, info)
