"""The gather form's static buffers for CUDA-graph decode under --enable-lora: one int32 table holding each row's slot
and the rows grouped by slot in blocks (ops.GatherRows), captured once as every graph's LoRA input and refilled on the
host before each replay, so that a replay serves any mix of adapters and base rows. Padded rows are base rows.

Grouping by slot lets the kernels read each adapter's A and B once per block of up to GATHER_BLOCK_ROWS rows rather
than once per row (32 adapters of rank 16 on Llama-3.1-8B: 84 MiB each, read per row it would be GiBs a step)."""
from __future__ import annotations

import numpy as np
import torch

from radixlm.runtime.kernels.lora.shapes import GATHER_BLOCK_ROWS
from radixlm.runtime.lora.ops import GatherRows, LoraBatchInfo

ALIGN = 4  # int32 entries per 16 bytes: every view starts 16-byte aligned (what Triton specializes pointers on)


def num_blocks(rows: int, num_slots: int) -> int:
    """The most blocks `rows` rows over `num_slots` slots can need: a slot with c rows takes ceil(c / block)."""
    return -(-rows // GATHER_BLOCK_ROWS) + min(rows, num_slots)


def _round(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def gather_table(row_slots, rows_cap: int, blocks_cap: int) -> np.ndarray:
    """The host table for `row_slots` (-1: base) in LoraGraphInputs' layout: [row_slots | sorted_rows | block_starts |
    block_lens | block_slots], each field padded (rows: -1, blocks: length 0, slot -1)."""
    slots = np.asarray(row_slots, dtype=np.int32)
    n = len(slots)
    if n > rows_cap:
        raise ValueError(f"{n} rows exceed the LoRA graph table's {rows_cap}")
    r, b = _round(rows_cap), _round(blocks_cap)
    table = np.zeros(2 * r + 3 * b, dtype=np.int32)
    table[:r] = -1
    table[:n] = slots
    adapter_rows = np.flatnonzero(slots >= 0)
    order = adapter_rows[np.argsort(slots[adapter_rows], kind="stable")]
    table[r : r + len(order)] = order
    starts, lens, block_slots = table[2 * r : 2 * r + b], table[2 * r + b : 2 * r + 2 * b], table[2 * r + 2 * b :]
    block_slots[:] = -1
    sorted_slots = slots[order]
    bounds = np.flatnonzero(np.diff(sorted_slots)) + 1
    k = 0
    for lo, hi in zip(np.concatenate(([0], bounds)), np.concatenate((bounds, [len(order)]))):
        for start in range(lo, hi, GATHER_BLOCK_ROWS):
            if k >= blocks_cap:
                raise ValueError(f"the LoRA graph table's {blocks_cap} blocks are too few")
            starts[k], lens[k], block_slots[k] = start, min(GATHER_BLOCK_ROWS, hi - start), sorted_slots[lo]
            k += 1
    return table


class LoraGraphInputs:
    """The table of the largest graph; a graph of `rows` rows reads the first entries of each field."""

    def __init__(self, max_rows: int, num_slots: int, scalings: torch.Tensor, device):
        self.max_rows = max_rows
        self.num_slots = num_slots
        self.scalings = scalings  # the LoraManager's: written in place when an adapter is swapped in
        self.blocks_cap = num_blocks(max_rows, num_slots)
        self.table = torch.from_numpy(gather_table([], max_rows, self.blocks_cap)).to(device)
        self._infos: dict[int, LoraBatchInfo] = {}

    def info(self, rows: int) -> LoraBatchInfo:
        """The static form for a graph of `rows` rows (views of the table, the same on every call)."""
        if rows not in self._infos:
            r, b, nb = _round(self.max_rows), _round(self.blocks_cap), num_blocks(rows, self.num_slots)
            t = self.table
            gather = GatherRows(t[r : r + rows], t[2 * r : 2 * r + nb], t[2 * r + b : 2 * r + b + nb],
                                t[2 * r + 2 * b : 2 * r + 2 * b + nb])
            empty = t[:0]
            self._infos[rows] = LoraBatchInfo(t[:rows], empty, empty, empty, (), self.scalings, 0, True,
                                              gather=gather)
        return self._infos[rows]

    def fill(self, row_slots) -> None:
        """Before a replay: the pass's rows' slots (padding rows -1 included or left out)."""
        host = torch.from_numpy(gather_table(row_slots, self.max_rows, self.blocks_cap))
        if self.table.is_cuda:
            self.table.copy_(host.pin_memory(), non_blocking=True)  # the caching host allocator keeps it alive
        else:
            self.table.copy_(host)
