"""The tensor- and expert-parallel layout of one rank, and the collectives its layers call.

One object per scheduler process, built by the launcher's rank setup and passed to the model's constructor: layers
read `tp_rank`/`tp_size` to take their shard and call `all_reduce` / `all_gather` where a sharded result must be
combined. With `tp_size == 1` every collective is the identity, so single-GPU code pays nothing."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


HEADER_BYTES = 512  # broadcast_object's first collective: a small object (an abort, a flush) rides in it


def divide(total: int, parts: int, what: str) -> int:
    if total % parts:
        raise ValueError(f"{what} ({total}) is not divisible by the tensor-parallel size {parts}")
    return total // parts


@dataclass(frozen=True)
class Parallel:
    """Set by the rank setup (`radixlm.runtime.distributed.setup`); read-only afterwards."""

    tp_rank: int = 0
    tp_size: int = 1
    # Expert parallelism reuses the tensor-parallel ranks: with ep_size == tp_size each rank holds whole experts
    # (num_experts / ep_size of them); with ep_size == 1 every rank holds a slice of every expert.
    ep_size: int = 1
    group: object | None = field(default=None, repr=False)  # torch.distributed group of the TP ranks
    cpu_group: object | None = field(default=None, repr=False)  # a gloo group of the same ranks, for host data
    # Small GPU tensors' all-reduce over NVLink (symm_all_reduce.SymmMemAllReduce); None: NCCL for all.
    device_comm: object | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.ep_size not in (1, self.tp_size):
            raise ValueError(f"--ep-size must be 1 or equal to --tp-size ({self.tp_size}); got {self.ep_size}")

    @property
    def ep_rank(self) -> int:
        return self.tp_rank if self.ep_size > 1 else 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum over ranks of x: x itself, summed in place, or a new tensor."""
        if self.tp_size == 1:
            return x
        if self.device_comm is not None and self.device_comm.accepts(x):
            return self.device_comm.all_reduce(x)
        import torch.distributed as dist

        dist.all_reduce(x, group=self.group)
        return x

    def fused_add_rmsnorm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                          eps: float) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(weight * norm(s + residual), s + residual) with s the sum over ranks of x, in one kernel; None where the
        device comm cannot (the caller then all-reduces and runs the norm itself)."""
        if self.tp_size == 1 or self.device_comm is None:
            return None
        fused = getattr(self.device_comm, "fused_add_rmsnorm", None)
        return None if fused is None else fused(x, residual, weight, eps)

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """The ranks' x concatenated along dim, rank order."""
        if self.tp_size == 1:
            return x
        import torch.distributed as dist

        parts = [torch.empty_like(x) for _ in range(self.tp_size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=dim)

    def broadcast_object(self, obj: object) -> object:
        """Rank 0's obj on every rank (picklable host data: the scheduler's inputs), in one collective of
        HEADER_BYTES when pickled it fits there (None, the event loop's usual turn, is the empty header), else a
        second one with its bytes (torch's broadcast_object_list took about twice as long for a small object, on
        two gloo ranks of one host)."""
        if self.tp_size == 1:
            return obj
        import pickle

        import torch.distributed as dist

        src = self.tp_rank == 0
        header = torch.zeros(HEADER_BYTES, dtype=torch.uint8)
        if src:
            payload = pickle.dumps(obj) if obj is not None else b""
            header[:8] = torch.frombuffer(bytearray(len(payload).to_bytes(8, "little")), dtype=torch.uint8)
            if 0 < len(payload) <= HEADER_BYTES - 8:
                header[8 : 8 + len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        dist.broadcast(header, src=0, group=self.cpu_group)
        n = int.from_bytes(header[:8].numpy().tobytes(), "little")
        if n == 0:
            return None
        if n <= HEADER_BYTES - 8:
            return obj if src else pickle.loads(header[8 : 8 + n].numpy().tobytes())
        buf = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if src else torch.empty(n, dtype=torch.uint8)
        dist.broadcast(buf, src=0, group=self.cpu_group)
        return obj if src else pickle.loads(buf.numpy().tobytes())

    def all_true(self, flags: list[bool]) -> list[bool]:
        """Position-wise AND of every rank's flags (same length on all ranks): what all ranks agree is done."""
        if self.tp_size == 1 or not flags:
            return flags
        import torch.distributed as dist

        t = torch.tensor(flags, dtype=torch.int32)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.cpu_group)
        return [bool(v) for v in t.tolist()]

    def min_int(self, value: int) -> int:
        """The smallest of the ranks' values (e.g. the KV pool size every rank can hold)."""
        if self.tp_size == 1:
            return value
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.cpu_group)
        return int(t.item())


SINGLE = Parallel()  # the layout of a one-rank server
