"""The batched LoRA product: each row's `x @ A[slot]^T @ B[slot]^T * scaling[slot]`, added to the base layer's
output; rows of slot -1 (the base model) get nothing. One entry point, `add_lora_delta`, for every layer and pass.

Buffers per layer (see LoraLayer): A (slots, parts * max_rank, in), B (slots, out, parts * max_rank), where B is block
diagonal over the fused parts (q|k|v, gate|up): part j's output rows read only its own rank block of A. Ranks below
max_rank are zero-padded, so one shape serves every adapter.

Two forms of a pass's rows: segments (eager passes: runs of consecutive rows of one slot, sized per pass) and the
gather form of CUDA-graph decode (graph.py: fixed-size buffers of per-row slots and of the rows grouped by slot in
blocks of at most kernels.lora.GATHER_BLOCK_ROWS, filled before each replay)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from radixlm.runtime.host_to_device import host_to_device



def _aligned(n: int) -> int:
    """n int32 entries rounded up to 16 bytes."""
    return -(-n // 4) * 4


@dataclass(frozen=True)
class GatherRows:
    """The gather form's views (fixed shapes for a graph of `rows` rows): the adapter rows sorted by slot, cut into
    blocks of at most GATHER_BLOCK_ROWS rows of one slot; unused blocks have length 0."""

    sorted_rows: torch.Tensor  # (rows,) int32: row indices, grouped by slot
    block_starts: torch.Tensor  # (blocks,) int32: a block's first position in sorted_rows
    block_lens: torch.Tensor  # (blocks,) int32, at most GATHER_BLOCK_ROWS; 0: unused
    block_slots: torch.Tensor  # (blocks,) int32


@dataclass(frozen=True)
class LoraBatchInfo:
    """A pass's rows by slot (set by LoraManager.prepare, or the graph runner's static form; ForwardBatch.lora).

    Segments are runs of consecutive rows of one slot (the Triton segment kernel's input); `groups` the same rows by
    slot (the torch path: one pair of GEMMs per adapter in the pass, built only for it); `row_slots` each row's slot;
    `gather` set only in the static form of graph decode."""

    row_slots: torch.Tensor  # (rows,) int32, -1: base model
    seg_starts: torch.Tensor  # (segments,) int32
    seg_lens: torch.Tensor  # (segments,) int32
    seg_slots: torch.Tensor  # (segments,) int32
    groups: tuple[tuple[int, torch.Tensor], ...]  # (slot, its rows' indices (int64)) per slot used, base excluded
    scalings: torch.Tensor  # (slots,) float32: alpha / r (or / sqrt(r)) of the adapter in each slot
    max_seg_len: int
    uses_lora: bool  # some row has an adapter (the static form: always, its rows are set at replay)
    host_row_slots: tuple[int, ...] = ()  # row_slots on the host (what a replay fills the gather form from)
    gather: GatherRows | None = None

    @staticmethod
    def build(req_slots: list[int], req_rows: list[int], scalings: torch.Tensor, device,
              groups: bool = True) -> "LoraBatchInfo":
        """req_slots: each request's slot (-1: none); req_rows: its rows in the pass (consecutive, in order).
        groups: build the torch path's row groups (each one a copy to the device)."""
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
        host_rows = tuple(s for s, n in zip(req_slots, req_rows) for _ in range(n))
        used = sorted(set(slots) - {-1})
        row_groups = []
        if groups and used:
            cpu_rows = torch.tensor(host_rows, dtype=torch.int32)
            row_groups = [(s, host_to_device(torch.nonzero(cpu_rows == s).flatten(), torch.int64, device))
                          for s in used]
        # One copy; every field starts 16-byte aligned (Triton specializes pointers on it: no new kernel variants).
        rows_w, segs_w = _aligned(len(host_rows)), _aligned(len(slots))
        fields = [list(host_rows) + [0] * (rows_w - len(host_rows))]
        fields += [f + [0] * (segs_w - len(f)) for f in (starts, lens, slots)]
        packed = host_to_device([v for f in fields for v in f], torch.int32, device)
        n_rows, n_segs = len(host_rows), len(slots)
        seg_starts, seg_lens, seg_slots = (packed[rows_w + i * segs_w : rows_w + i * segs_w + n_segs]
                                           for i in range(3))
        return LoraBatchInfo(packed[:n_rows], seg_starts, seg_lens, seg_slots, tuple(row_groups), scalings,
                             max(lens, default=0), bool(used), host_rows)


def lora_delta_torch(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, info: LoraBatchInfo) -> torch.Tensor:
    """The reference path (CPU, and the tests' oracle): per adapter in the pass, its rows' two GEMMs."""
    out = torch.zeros(x.shape[0], b.shape[1], dtype=x.dtype, device=x.device)
    for slot, rows in info.groups:
        xs = x.index_select(0, rows)
        delta = (xs @ a[slot].t()) @ b[slot].t()
        out.index_add_(0, rows, delta * info.scalings[slot].to(x.dtype))
    return out


def lora_delta_rows_torch(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, row_slots: torch.Tensor,
                          scalings: torch.Tensor) -> torch.Tensor:
    """The gather form in torch (static shapes: nothing depends on the slots' values on the host): each row's own
    slot's A and B. Memory rows * width * in: the CPU stand-in of graph decode, not a CUDA path."""
    slot = row_slots.long().clamp(min=0)
    xa = torch.bmm(a.index_select(0, slot), x.unsqueeze(-1))
    delta = torch.bmm(b.index_select(0, slot), xa).squeeze(-1)
    weight = torch.where(row_slots >= 0, scalings.index_select(0, slot), torch.zeros_like(scalings[:1]))
    return delta * weight.to(delta.dtype)[:, None]


def add_lora_delta(base: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                   info: LoraBatchInfo | None, use_triton: bool = False) -> torch.Tensor:
    """base + each row's LoRA delta (base unchanged where no row uses an adapter).

    use_triton (CUDA, --lora-backend triton): two launches per layer for a batch mixing adapters and the base model,
    adding in place: the segment kernels for eager passes, the gather kernels for the static form (replayable: fixed
    grids, every index read from the graph's buffers). Otherwise the torch path, exact but one pair of GEMMs per
    adapter (the gather form: one batched product over the rows)."""
    if info is None or not info.uses_lora:
        return base
    if use_triton:
        from radixlm.runtime.kernels import lora as lora_kernels

        out = base if base.stride(-1) == 1 else base.contiguous()
        x = x if x.stride(-1) == 1 else x.contiguous()
        if info.gather is not None:
            g = info.gather
            return lora_kernels.gather_lora_add(out, x, a, b, g.sorted_rows, g.block_starts, g.block_lens,
                                                g.block_slots, info.scalings)
        return lora_kernels.segment_lora_add(out, x, a, b, info.seg_starts, info.seg_lens, info.seg_slots,
                                             info.scalings, info.max_seg_len)
    if info.gather is not None:
        return base + lora_delta_rows_torch(x, a, b, info.row_slots, info.scalings)
    return base + lora_delta_torch(x, a, b, info)
