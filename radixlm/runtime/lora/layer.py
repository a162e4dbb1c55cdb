"""A linear layer's adapter slots: the stacked A and B buffers of every slot, written when an adapter is swapped in,
and the delta added to the layer's output (Linear.matmul calls `add`). Tensor parallel: a column-parallel layer
(qkv, gate_up) keeps A whole and this rank's rows of B; a row-parallel one (o, down) this rank's columns of A and B
whole, its partial delta summed over ranks with the base output's."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from radixlm.runtime.lora.config import LoraTarget
from radixlm.runtime.lora.ops import LoraBatchInfo, add_lora_delta, begin_lora_shrink


@dataclass
class LoraPassContext:
    """The pass being run: set by the ModelRunner before the model runs, read by every LoraLayer (one per runner)."""

    info: LoraBatchInfo | None = None
    use_triton: bool = False  # the Triton kernels (CUDA, --lora-backend triton); else the torch path
    side_stream: object = None  # a torch.cuda.Stream with the Triton kernels: graph decode's shrinks run on it


class LoraLayer:
    def __init__(self, linear, target: LoraTarget, num_slots: int, max_rank: int, context: LoraPassContext,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", tp_rank: int = 0):
        """dtype: the model's activations' (a quantized layer's weight is not)."""
        self.target = target
        self.max_rank = max_rank
        self.context = context
        self.tp_rank = tp_rank
        self.parts = len(target.parts)
        self.in_local = linear.in_features
        if target.row_parallel:
            self.full_in, self.out_sizes, self.out_starts = linear.full_in, [linear.out_features], [0]
            self.full_out = [linear.out_features]
        else:
            self.full_in = linear.in_features
            self.out_sizes = [s.local for s in linear.shards]
            self.out_starts = [s.start for s in linear.shards]
            self.full_out = [s.full for s in linear.shards]
            if len(linear.shards) != self.parts:
                raise ValueError(f"{target.module} has {len(linear.shards)} projections, expected {self.parts}")
        self.part_sizes = tuple(self.out_sizes)  # B's block diagonal: the kernels read each part's rank block only
        width = self.parts * max_rank
        self.a = torch.zeros(num_slots, width, self.in_local, dtype=dtype, device=device)
        self.b = torch.zeros(num_slots, sum(self.out_sizes), width, dtype=dtype, device=device)

    def check(self, part: int, a: torch.Tensor, b: torch.Tensor, what: str) -> None:
        """An adapter's (A, B) of one part against this layer's whole (unsliced) shapes."""
        r = a.shape[0]
        if a.dim() != 2 or b.dim() != 2 or tuple(a.shape) != (r, self.full_in) or tuple(b.shape) != (
                self.full_out[part], r):
            raise ValueError(f"{what}: lora_A {tuple(a.shape)} / lora_B {tuple(b.shape)} do not fit the model "
                             f"(expected ({r}, {self.full_in}) / ({self.full_out[part]}, {r}))")
        if r > self.max_rank:
            raise ValueError(f"{what}: rank {r} is above --max-lora-rank {self.max_rank}")

    def pack(self, parts: list[tuple[torch.Tensor, torch.Tensor] | None]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """A slot's contents on the host for an adapter's (A, B) per part (None: the adapter leaves that part alone):
        this rank's slices, zero-padded to max_rank, B block diagonal; None when it leaves every part alone."""
        if all(ab is None for ab in parts):
            return None
        a_host = torch.zeros(self.a.shape[1:], dtype=self.a.dtype)
        b_host = torch.zeros(self.b.shape[1:], dtype=self.b.dtype)
        row = 0
        for j, ab in enumerate(parts):
            lo = j * self.max_rank
            if ab is not None:
                a, b = ab
                r = a.shape[0]
                if self.target.row_parallel:
                    a = a[:, self.tp_rank * self.in_local : (self.tp_rank + 1) * self.in_local]
                else:
                    b = b[self.out_starts[j] : self.out_starts[j] + self.out_sizes[j]]
                a_host[lo : lo + r].copy_(a)
                b_host[row : row + self.out_sizes[j], lo : lo + r].copy_(b)
            row += self.out_sizes[j]
        return a_host, b_host

    def load(self, slot: int, packed: tuple[torch.Tensor, torch.Tensor] | None) -> None:
        """Slot `slot` takes a pack's contents (None: zeros); from pinned memory the copies do not wait."""
        if packed is None:
            self.a[slot].zero_()
            self.b[slot].zero_()
            return
        self.a[slot].copy_(packed[0], non_blocking=True)
        self.b[slot].copy_(packed[1], non_blocking=True)

    def write(self, slot: int, parts: list[tuple[torch.Tensor, torch.Tensor] | None]) -> None:
        """Slot `slot` takes an adapter's (A, B) per part (None: the adapter leaves that part alone)."""
        self.load(slot, self.pack(parts))

    @property
    def active(self) -> bool:
        """Whether the pass being run (or captured) has adapter rows: else the layer runs as the base model's."""
        info = self.context.info
        return info is not None and info.uses_lora

    def begin(self, x: torch.Tensor) -> torch.Tensor | None:
        """Before the base GEMM (x its input): graph decode's shrink, launched beside the GEMM (ops.py)."""
        ctx = self.context
        return begin_lora_shrink(x, self.a, ctx.info, ctx.use_triton, ctx.side_stream)

    def add(self, out: torch.Tensor, x: torch.Tensor, partials: torch.Tensor | None = None) -> torch.Tensor:
        """out + the rows' deltas; partials: begin's (its shrink done on the side stream)."""
        ctx = self.context
        return add_lora_delta(out, x, self.a, self.b, ctx.info, ctx.use_triton, self.part_sizes, partials,
                              ctx.side_stream)
