"""The batched LoRA product: each row's `x @ A[slot]^T @ B[slot]^T * scaling[slot]`, added to the base layer's
output; rows of slot -1 (the base model) get nothing. One entry point, `add_lora_delta`, for every layer and pass.

Buffers per layer (see LoraLayer): A (slots, parts * max_rank, in), B (slots, out, parts * max_rank), where B is block
diagonal over the fused parts (q|k|v, gate|up): part j's output rows read only its own rank block of A (the kernels
read only that block of B, given the parts' output sizes). Ranks below max_rank are zero-padded, so one shape serves
every adapter.

Both forms of a pass's rows group them by slot in blocks (lora/blocks.py): eager passes get exactly their blocks of
at most EAGER_BLOCK_ROWS rows (built here, one copy to the device); CUDA-graph decode a static padded table (each
block's slot and rows) sized for the graph (graph.py), refilled before each replay."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from radixlm.runtime.host_to_device import host_to_device
from radixlm.runtime.kernels.lora.config import LoraDecodeConfig
from radixlm.runtime.kernels.lora.shapes import EAGER_BLOCK_ROWS
from radixlm.runtime.lora.blocks import TableLayout, group_rows


@dataclass(frozen=True)
class GatherRows:
    """The kernels' views: the adapter rows sorted by slot, cut into blocks of at most `block_rows` rows of one slot
    (graph form: fixed shapes, unused blocks of length 0)."""

    sorted_rows: torch.Tensor  # (rows,) int32: row indices, grouped by slot
    block_starts: torch.Tensor  # (blocks,) int32: a block's first position in sorted_rows
    block_lens: torch.Tensor  # (blocks,) int32, at most block_rows; 0: unused
    block_slots: torch.Tensor  # (blocks,) int32


@dataclass(frozen=True)
class PaddedBlocks:
    """The decode kernels' views (lora/blocks.py's PaddedLayout; CUDA-graph decode): each block's slot and its rows
    at b * config.block_m, -1 padded."""

    block_slots: torch.Tensor  # (blocks,) int32, -1: unused
    block_rows: torch.Tensor  # (blocks * block_m,) int32, -1: none
    config: LoraDecodeConfig


@dataclass(frozen=True)
class LoraBatchInfo:
    """A pass's rows by slot (set by LoraManager.prepare, or the graph runner's static form; ForwardBatch.lora).

    `blocks` the Triton kernels' input (rows grouped by slot); `groups` the same rows by slot for the torch path (one
    pair of GEMMs per adapter in the pass, built only for it); `row_slots` each row's slot. `static`: the graph
    form, whose table is refilled before each replay."""

    row_slots: torch.Tensor  # (rows,) int32, -1: base model
    blocks: GatherRows
    groups: tuple[tuple[int, torch.Tensor], ...]  # (slot, its rows' indices (int64)) per slot used, base excluded
    scalings: torch.Tensor  # (slots,) float32: alpha / r (or / sqrt(r)) of the adapter in each slot
    uses_lora: bool  # some row has an adapter (the static form: always, its rows are set at replay)
    block_rows: int = EAGER_BLOCK_ROWS  # the blocks' row cap (the kernels' BLOCK_M)
    static: bool = False
    host_row_slots: tuple[int, ...] = ()  # row_slots on the host (what a replay fills the graph's table from)
    padded: PaddedBlocks | None = None  # the graph form's decode-kernel table (else `blocks`, the eager kernels')

    @staticmethod
    def build(req_slots: list[int], req_rows: list[int], scalings: torch.Tensor, device,
              groups: bool = True) -> "LoraBatchInfo":
        """req_slots: each request's slot (-1: none); req_rows: its rows in the pass (consecutive, in order).
        groups: build the torch path's row groups (each one a copy to the device)."""
        if len(req_slots) != len(req_rows):
            raise ValueError(f"{len(req_slots)} request slots for {len(req_rows)} requests")
        row_slots = np.repeat(np.asarray(req_slots, dtype=np.int32),
                              np.maximum(np.asarray(req_rows, dtype=np.int64), 0))
        grouped = group_rows(row_slots, EAGER_BLOCK_ROWS)
        order, starts = grouped[0], grouped[1]
        layout = TableLayout(len(row_slots), len(starts))
        # One copy of the whole table.
        table = host_to_device(torch.from_numpy(layout.table(row_slots, EAGER_BLOCK_ROWS, grouped)), torch.int32,
                               device)
        rows_t, sorted_rows, *block_fields = layout.fields(table, len(row_slots), len(starts))
        row_groups = []
        if groups and len(order):
            sorted_slots = row_slots[order]
            cuts = np.flatnonzero(np.diff(sorted_slots)) + 1
            row_groups = [(int(sorted_slots[part[0]]), host_to_device(torch.from_numpy(order[part]), torch.int64,
                                                                      device))
                          for part in np.split(np.arange(len(order)), cuts)]
        return LoraBatchInfo(rows_t, GatherRows(sorted_rows, *block_fields), tuple(row_groups), scalings,
                             bool(len(order)), host_row_slots=tuple(row_slots.tolist()))


    @staticmethod
    def host_only(req_slots: list[int], req_rows: list[int], scalings: torch.Tensor) -> "LoraBatchInfo":
        """Only host_row_slots (a pass that replays a CUDA graph: the graph's own table holds the device side)."""
        if len(req_slots) != len(req_rows):
            raise ValueError(f"{len(req_slots)} request slots for {len(req_rows)} requests")
        host = tuple(s for s, n in zip(req_slots, req_rows) for _ in range(n))
        empty = torch.empty(0, dtype=torch.int32)
        return LoraBatchInfo(empty, GatherRows(empty, empty, empty, empty), (), scalings,
                             any(s >= 0 for s in req_slots), host_row_slots=host)


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
    """The graph form in torch (static shapes: nothing depends on the slots' values on the host): each row's own
    slot's A and B. Memory rows * width * in: the CPU stand-in of graph decode, not a CUDA path."""
    slot = row_slots.long().clamp(min=0)
    xa = torch.bmm(a.index_select(0, slot), x.unsqueeze(-1))
    delta = torch.bmm(b.index_select(0, slot), xa).squeeze(-1)
    weight = torch.where(row_slots >= 0, scalings.index_select(0, slot), torch.zeros_like(scalings[:1]))
    return delta * weight.to(delta.dtype)[:, None]


def begin_lora_shrink(x: torch.Tensor, a: torch.Tensor, info: LoraBatchInfo | None, use_triton: bool,
                      side_stream) -> torch.Tensor | None:
    """Graph decode (the padded form, Triton on CUDA) with a side stream: the shrink launched there before the base
    GEMM, which it does not wait for (it reads only x), so its launch and latency hide behind the GEMM; its partials
    (allocated on the pass's stream) for add_lora_delta, which joins the side stream first. None otherwise."""
    if not use_triton or side_stream is None or info is None or not info.uses_lora or info.padded is None:
        return None
    from radixlm.runtime.kernels import lora as lora_kernels

    p = info.padded
    x = x if x.stride(-1) == 1 else x.contiguous()
    partials = torch.empty(lora_kernels.decode_partials(x.shape[1], a.shape[1], p.block_slots.shape[0], p.config),
                           dtype=torch.float32, device=x.device)
    side_stream.wait_stream(torch.cuda.current_stream(x.device))
    with torch.cuda.stream(side_stream):
        lora_kernels.decode_shrink(x, a, p.block_slots, p.block_rows, p.config, partials)
    return partials


def add_lora_delta(base: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                   info: LoraBatchInfo | None, use_triton: bool = False,
                   parts: tuple[int, ...] | None = None, partials: torch.Tensor | None = None,
                   side_stream=None) -> torch.Tensor:
    """base + each row's LoRA delta (base unchanged where no row uses an adapter).

    use_triton (CUDA, --lora-backend triton): two launches per layer for a batch mixing adapters and the base model,
    adding in place (graph decode: kernels/lora/decode.py over the padded table, grids fixed, every index read from
    the graph's buffers; eager passes: kernels/lora/gather.py over their exact blocks). parts: the fused parts' output sizes (B's block diagonal; None: one part). Otherwise the torch path,
    exact but one pair of GEMMs per adapter (the static form: one batched product over the rows). partials: what
    begin_lora_shrink launched on side_stream (then only the expand runs here)."""
    if info is None or not info.uses_lora:
        return base
    if use_triton:
        from radixlm.runtime.kernels import lora as lora_kernels

        out = base if base.stride(-1) == 1 else base.contiguous()
        x = x if x.stride(-1) == 1 else x.contiguous()
        if info.padded is not None:
            p = info.padded
            if partials is None:
                return lora_kernels.decode_lora_add(out, x, a, b, p.block_slots, p.block_rows, info.scalings, parts,
                                                    p.config)
            torch.cuda.current_stream(out.device).wait_stream(side_stream)  # begin_lora_shrink's shrink
            return lora_kernels.decode_expand(out, partials, b, p.block_slots, p.block_rows, info.scalings, parts,
                                              p.config, x.dtype)
        g = info.blocks
        return lora_kernels.gather_lora_add(out, x, a, b, g.sorted_rows, g.block_starts, g.block_lens,
                                            g.block_slots, info.scalings, info.block_rows, parts)
    if info.static:
        return base + lora_delta_rows_torch(x, a, b, info.row_slots, info.scalings)
    return base + lora_delta_torch(x, a, b, info)
