"""A pass's adapter rows grouped by slot in blocks (the Triton kernels' input, kernels/lora/gather.py), as one host
int32 table: [row_slots | sorted_rows | block_starts | block_lens | block_slots], each field padded to a multiple of
16 bytes (Triton specializes pointers on their alignment: every view starts aligned, so no new kernel variants).

sorted_rows lists the adapter rows (slot >= 0) ordered by slot, each slot's rows in pass order; a block is up to
`block_rows` consecutive entries of one slot. Base rows (-1) are left out: their output is never touched."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ALIGN = 4  # int32 entries per 16 bytes


def aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def max_blocks(rows: int, num_slots: int, block_rows: int) -> int:
    """The most blocks `rows` rows over `num_slots` slots can need: a slot with c rows takes ceil(c / block_rows)."""
    return -(-rows // block_rows) + min(rows, num_slots)


def group_rows(row_slots: np.ndarray, block_rows: int) -> tuple[np.ndarray, ...]:
    """(sorted_rows, block_starts, block_lens, block_slots) of int32 row slots (-1: base)."""
    if block_rows < 1:
        raise ValueError(f"block_rows must be >= 1, got {block_rows}")
    adapter_rows = np.flatnonzero(row_slots >= 0)
    order = adapter_rows[np.argsort(row_slots[adapter_rows], kind="stable")]
    if not len(order):
        empty = np.zeros(0, dtype=np.int64)
        return order, empty, empty, empty
    sorted_slots = row_slots[order]
    bounds = np.flatnonzero(np.diff(sorted_slots)) + 1
    lo = np.concatenate(([0], bounds))
    hi = np.concatenate((bounds, [len(order)]))
    per = -(-(hi - lo) // block_rows)  # blocks per slot
    run = np.repeat(np.arange(len(lo)), per)
    first = np.repeat(np.cumsum(per) - per, per)  # each run's first block index
    starts = lo[run] + (np.arange(int(per.sum())) - first) * block_rows
    return order, starts, np.minimum(block_rows, hi[run] - starts), sorted_slots[lo][run]


@dataclass(frozen=True)
class TableLayout:
    """Where each field of a table for up to `rows_cap` rows and `blocks_cap` blocks starts."""

    rows_cap: int
    blocks_cap: int

    @property
    def row_field(self) -> int:
        return aligned(self.rows_cap)

    @property
    def block_field(self) -> int:
        return aligned(self.blocks_cap)

    @property
    def size(self) -> int:
        return 2 * self.row_field + 3 * self.block_field

    def fields(self, t, rows: int, blocks: int):
        """Views of table t: (row_slots, sorted_rows) of `rows` entries, (starts, lens, slots) of `blocks`."""
        r, b = self.row_field, self.block_field
        return (t[:rows], t[r : r + rows], t[2 * r : 2 * r + blocks], t[2 * r + b : 2 * r + b + blocks],
                t[2 * r + 2 * b : 2 * r + 2 * b + blocks])

    def table(self, row_slots, block_rows: int, grouped: tuple[np.ndarray, ...] | None = None) -> np.ndarray:
        """The host table of `row_slots` (-1: base): rows past them -1, unused blocks of length 0 and slot -1.
        grouped: group_rows(row_slots, block_rows) when the caller has it already."""
        slots = np.asarray(row_slots, dtype=np.int32)
        if len(slots) > self.rows_cap:
            raise ValueError(f"{len(slots)} rows exceed the LoRA table's {self.rows_cap}")
        order, starts, lens, block_slots = grouped if grouped is not None else group_rows(slots, block_rows)
        if len(starts) > self.blocks_cap:
            raise ValueError(f"the LoRA table's {self.blocks_cap} blocks are too few for {len(starts)}")
        t = np.zeros(self.size, dtype=np.int32)
        r, b = self.row_field, self.block_field
        t[:r] = -1
        t[: len(slots)] = slots
        t[r : r + len(order)] = order
        t[2 * r : 2 * r + len(starts)] = starts
        t[2 * r + b : 2 * r + b + len(lens)] = lens
        t[2 * r + 2 * b :] = -1
        t[2 * r + 2 * b : 2 * r + 2 * b + len(block_slots)] = block_slots
        return t


@dataclass(frozen=True)
class PaddedLayout:
    """The decode kernels' table (kernels/lora/decode.py), for up to `rows_cap` rows in `blocks_cap` blocks of
    `block_m`: [row_slots | block_slots | block_rows], block_rows holding each block's rows (-1 padded) at
    b * block_m. Each field starts 16-byte aligned."""

    rows_cap: int
    blocks_cap: int
    block_m: int

    def __post_init__(self) -> None:
        if self.block_m < ALIGN or self.block_m % ALIGN:
            raise ValueError(f"block_m must be a multiple of {ALIGN}, got {self.block_m}")

    @property
    def size(self) -> int:
        return aligned(self.rows_cap) + aligned(self.blocks_cap) + self.blocks_cap * self.block_m

    def fields(self, t, rows: int, blocks: int):
        """Views of table t: row_slots (rows,), block_slots (blocks,), block_rows (blocks * block_m,)."""
        r, b = aligned(self.rows_cap), aligned(self.blocks_cap)
        return t[:rows], t[r : r + blocks], t[r + b : r + b + blocks * self.block_m]

    def table(self, row_slots) -> np.ndarray:
        """The host table of `row_slots` (-1: base): rows past them -1, unused blocks slot -1 with no rows."""
        slots = np.asarray(row_slots, dtype=np.int32)
        if len(slots) > self.rows_cap:
            raise ValueError(f"{len(slots)} rows exceed the LoRA table's {self.rows_cap}")
        order, starts, lens, block_slots = group_rows(slots, self.block_m)
        if len(starts) > self.blocks_cap:
            raise ValueError(f"the LoRA table's {self.blocks_cap} blocks are too few for {len(starts)}")
        r, b = aligned(self.rows_cap), aligned(self.blocks_cap)
        t = np.full(self.size, -1, dtype=np.int32)
        t[: len(slots)] = slots
        t[r : r + len(block_slots)] = block_slots
        if len(order):
            i = np.arange(self.block_m)
            pos = starts[:, None] + i[None, :]
            filled = i[None, :] < lens[:, None]
            rows = np.where(filled, order[np.minimum(pos, len(order) - 1)], -1)
            t[r + b : r + b + len(starts) * self.block_m] = rows.reshape(-1)
        return t
