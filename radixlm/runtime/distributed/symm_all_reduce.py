"""All-reduce of small tensors through symmetric memory: the ranks of one host read each other's buffers over NVLink.

NCCL's all-reduce pays its protocol latency 65 times a decode step of an 8B model at TP=2. Here each rank copies its
input into its own symmetric buffer, the ranks meet at a barrier held in the same memory, and then either each sums
every rank's whole buffer (one-shot: PyTorch's `one_shot_all_reduce_copy_out`, one kernel) or each sums its 1/world
share and the shares are gathered (two-shot: `two_shot_all_reduce_out`, less traffic for larger tensors). Both are
capturable in CUDA graphs. Measured on 2 x H200 (benchmarks/multi_gpu/gpu_multi.py --parts allreduce, inside CUDA
graphs, microseconds):

    size      NCCL   one-shot   two-shot
    8 KiB      8.0      6.7       10.1
    1 MiB     15.8     14.8       15.7
    2 MiB     28.8     21.4       19.2
    8 MiB     49.7     62.4       40.9

so one-shot up to ONE_SHOT_MAX_BYTES, two-shot up to the buffer's size, NCCL above. Multicast (NVLink SHARP) is never
used: it is off on the machines we run on."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import torch

logger = logging.getLogger(__name__)

ALIGN_BYTES = 16  # the kernels move 16-byte vectors
ONE_SHOT_MAX_BYTES = 1 << 20
BUFFER_BYTES = 8 << 20


@dataclass
class SymmMemAllReduce:
    """Built by the rank setup after the process group (`build_symm_all_reduce`); one per rank."""

    group_name: str
    buffer: torch.Tensor  # symmetric memory, rendezvoused over the group
    world_size: int
    one_shot_max_bytes: int = ONE_SHOT_MAX_BYTES

    def accepts(self, x: torch.Tensor) -> bool:
        if not (x.is_cuda and x.is_contiguous() and x.dtype in (torch.bfloat16, torch.float16, torch.float32)):
            return False
        if x.nbytes <= self.one_shot_max_bytes:
            return x.nbytes % ALIGN_BYTES == 0
        return x.nbytes <= self.buffer.nbytes and x.nbytes % (ALIGN_BYTES * self.world_size) == 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum over ranks of x, as a new tensor (x is left as it was)."""
        slot = self.buffer.view(x.dtype)[: x.numel()].view_as(x)  # starts at the allocation's base
        out = torch.empty_like(x)
        if x.nbytes <= self.one_shot_max_bytes:
            return torch.ops.symm_mem.one_shot_all_reduce_copy_out(slot, x, "sum", self.group_name, out)
        slot.copy_(x)
        return torch.ops.symm_mem.two_shot_all_reduce_out(slot, "sum", self.group_name, out)


def build_symm_all_reduce(group, device: str, agree: Callable[[list[bool]], list[bool]],
                          buffer_bytes: int = BUFFER_BYTES) -> SymmMemAllReduce | None:
    """The communicator, or None on every rank where symmetric memory is unavailable or its self-check fails on any.
    agree: the position-wise AND over ranks (on host data). The rendezvous and the probes are collective (a rank
    alone in one waits for its peers forever), so the ranks agree before each: that every rank set up its buffer,
    that every rendezvous succeeded, then that every probe summed right."""
    import torch.distributed._symmetric_memory as symm_mem

    group_name = group.group_name
    buffer = None
    try:
        if group_name in getattr(symm_mem, "_group_name_to_store", {}):
            # PyTorch keeps the first registration of a group name for the life of the process: a later group of
            # the same name (a second engine in this process) would meet its peers through the first one's store.
            raise RuntimeError(f"symmetric memory was set up in this process for an earlier group named {group_name}")
        if hasattr(symm_mem, "enable_symm_mem_for_group"):
            symm_mem.enable_symm_mem_for_group(group_name)
        buffer = symm_mem.empty(buffer_bytes, dtype=torch.uint8, device=device)
    except Exception as e:  # noqa: BLE001 - an optional fast path: NCCL serves without it
        logger.warning("symmetric-memory all-reduce unavailable (%s: %s): using NCCL", type(e).__name__, e)
    if not agree([buffer is not None])[0]:
        return None
    comm = None
    try:
        symm_mem.rendezvous(buffer, group_name)
        comm = SymmMemAllReduce(group_name, buffer, group.size())
    except Exception as e:  # noqa: BLE001 - as above
        logger.warning("symmetric-memory rendezvous failed (%s: %s): using NCCL", type(e).__name__, e)
    if not agree([comm is not None])[0]:
        return None
    ok = True
    try:
        rank, world = group.rank(), group.size()
        for n in (4096, buffer_bytes // 2):  # a one-shot size and the largest two-shot size
            probe = torch.full((n,), float(rank + 1), dtype=torch.bfloat16, device=device)
            ok &= comm.accepts(probe) and bool((comm.all_reduce(probe) == world * (world + 1) / 2).all())
        torch.cuda.synchronize(device)
    except Exception as e:  # noqa: BLE001 - as above
        logger.warning("symmetric-memory all-reduce failed its self-check (%s: %s)", type(e).__name__, e)
        ok = False
    if not agree([ok])[0]:
        logger.warning("symmetric-memory all-reduce gave a wrong sum on some rank: using NCCL")
        return None
    return comm
