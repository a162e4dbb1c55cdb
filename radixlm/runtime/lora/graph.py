"""The static LoRA input of CUDA-graph decode under --enable-lora: one int32 table (lora/blocks.py's PaddedLayout)
holding each row's slot and the rows grouped by slot in padded blocks of `config.block_m`, captured once as every
graph's LoRA input and refilled on the host before each replay, so that a replay serves any mix of adapters and base
rows. Padded rows are base rows.

Grouping by slot lets the kernels (kernels/lora/decode.py) read each adapter's A and B once per block of rows rather
than once per row (32 adapters of rank 16 on Llama-3.1-8B: 84 MiB each, read per row it would be GiBs a step)."""
from __future__ import annotations

import torch

from radixlm.runtime.kernels.lora.config import LoraDecodeConfig
from radixlm.runtime.lora.blocks import PaddedLayout, max_blocks
from radixlm.runtime.lora.ops import GatherRows, LoraBatchInfo, PaddedBlocks


def num_blocks(rows: int, num_slots: int, block_m: int) -> int:
    """The blocks a graph of `rows` rows reserves: the most its rows over `num_slots` slots can need."""
    return max_blocks(rows, num_slots, block_m)


class LoraGraphInputs:
    """The table of the largest graph; a graph of `rows` rows reads the first entries of each field."""

    def __init__(self, max_rows: int, num_slots: int, scalings: torch.Tensor, device,
                 config: LoraDecodeConfig | None = None):
        self.max_rows = max_rows
        self.num_slots = num_slots
        self.config = config or LoraDecodeConfig()
        self.scalings = scalings  # the LoraManager's: written in place when an adapter is swapped in
        self.layout = PaddedLayout(max_rows, num_blocks(max_rows, num_slots, self.config.block_m), self.config.block_m)
        self.table = torch.from_numpy(self.layout.table([])).to(device)
        self._infos: dict[int, LoraBatchInfo] = {}

    def info(self, rows: int) -> LoraBatchInfo:
        """The static form for a graph of `rows` rows (views of the table, the same on every call)."""
        if rows not in self._infos:
            blocks = num_blocks(rows, self.num_slots, self.config.block_m)
            row_slots, block_slots, block_rows = self.layout.fields(self.table, rows, blocks)
            empty = block_slots[:0]
            self._infos[rows] = LoraBatchInfo(
                row_slots, GatherRows(empty, empty, empty, empty), (), self.scalings, True,
                block_rows=self.config.block_m, static=True,
                padded=PaddedBlocks(block_slots, block_rows, self.config))
        return self._infos[rows]

    def fill(self, row_slots) -> None:
        """Before a replay: the pass's rows' slots (padding rows -1 included or left out)."""
        host = torch.from_numpy(self.layout.table(row_slots))
        if self.table.is_cuda:
            self.table.copy_(host.pin_memory(), non_blocking=True)  # the caching host allocator keeps it alive
        else:
            self.table.copy_(host)
