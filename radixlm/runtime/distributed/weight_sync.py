"""The process group a trainer broadcasts new weights over (SGLang's /init_weights_update_group): the trainer is rank
0, this server's tensor-parallel rank r joins as rank_offset + r. It is a group of its own, beside the server's
tensor-parallel one: a TCPStore at master_address:master_port (the trainer's rank 0 hosts it), a PrefixStore named
after the group, and a gloo (CPU tensors) or NCCL (CUDA tensors) backend over them, made without torch's default
group so that neither side's other groups are touched.

A trainer joins with `join_weights_update_group(..., rank=0)` and sends each tensor with `group.broadcast(t)`, in the
order of the names it gives /update_weights_from_distributed."""
from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch

BACKENDS = ("gloo", "nccl")
DEFAULT_TIMEOUT_S = 300.0


def parse_dtype(name: str) -> torch.dtype:
    """"bfloat16" or "torch.bfloat16" -> torch.bfloat16; a ValueError names anything else."""
    attr = name.removeprefix("torch.")
    dtype = getattr(torch, attr, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r} (e.g. bfloat16, float16, float32)")
    return dtype


@dataclass(frozen=True)
class GroupSpec:
    """Where and how a member joins; every bound checked (ValueError) before any connection is tried."""

    master_address: str
    master_port: int
    rank: int
    world_size: int
    group_name: str = "weight_update_group"
    backend: str = "nccl"
    timeout_s: float = DEFAULT_TIMEOUT_S

    def __post_init__(self) -> None:
        if not self.master_address:
            raise ValueError("master_address must not be empty")
        if not 0 < self.master_port < 65536:
            raise ValueError(f"master_port must be in [1, 65535], got {self.master_port}")
        if self.world_size < 2:
            raise ValueError(f"world_size must be >= 2 (the trainer and at least one rank), got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is outside the group's world_size {self.world_size}")
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r}; choose from {BACKENDS}")
        if not self.group_name:
            raise ValueError("group_name must not be empty")
        if self.timeout_s <= 0:
            raise ValueError("timeout_s must be > 0")


class WeightsUpdateGroup:
    """One member's handle on the group: broadcast from rank 0 (the trainer) to every member."""

    def __init__(self, spec: GroupSpec) -> None:
        import torch.distributed as dist

        self.spec = spec
        timeout = datetime.timedelta(seconds=spec.timeout_s)
        store = dist.TCPStore(spec.master_address, spec.master_port, spec.world_size, is_master=spec.rank == 0,
                              timeout=timeout)
        self._store = dist.PrefixStore(f"{spec.group_name}/", store)
        if spec.backend == "gloo":
            self._pg = dist.ProcessGroupGloo(self._store, spec.rank, spec.world_size, timeout)
        else:
            self._pg = dist.ProcessGroupNCCL(self._store, spec.rank, spec.world_size)
        gloo = spec.backend == "gloo"
        self.device = torch.device("cpu") if gloo else torch.device("cuda", torch.cuda.current_device())

    def broadcast(self, tensor: torch.Tensor) -> torch.Tensor:
        """Rank 0's tensor into `tensor` on every member (in place; rank 0 sends it)."""
        if tensor.device != self.device:
            raise ValueError(f"the {self.spec.backend} group broadcasts tensors on {self.device}, got {tensor.device}")
        if not tensor.is_contiguous():
            raise ValueError("a broadcast tensor must be contiguous (it is received in place)")
        self._pg.broadcast(tensor, 0).wait()
        return tensor

    def receive(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """The next tensor rank 0 broadcasts (a member other than rank 0)."""
        return self.broadcast(torch.empty(shape, dtype=dtype, device=self.device))

    def destroy(self) -> None:
        self._pg = None
        self._store = None


def join_weights_update_group(master_address: str, master_port: int, rank: int, world_size: int,
                              group_name: str = "weight_update_group", backend: str = "nccl",
                              timeout_s: float = DEFAULT_TIMEOUT_S) -> WeightsUpdateGroup:
    """Joins (rank 0: creates) the group; blocks until all world_size members have joined."""
    return WeightsUpdateGroup(GroupSpec(master_address, master_port, rank, world_size, group_name, backend, timeout_s))
