"""All-reduce of small tensors through symmetric memory: the ranks of one host read each other's buffers over NVLink.

NCCL's all-reduce of a decode step's few KiB costs its launch and protocol latency, 65 times a step for an 8B model at
TP=2. Here each rank copies its input into its own symmetric buffer, the ranks meet at a barrier held in the same
memory, and each sums every rank's buffer (PyTorch's `one_shot_all_reduce_copy_out`: one kernel, capturable in CUDA
graphs). Above `one_shot_max_bytes` the one-shot read of every peer's whole tensor loses to NCCL's ring, so larger
tensors go to NCCL. Multicast (NVLink SHARP) is never used: it is off on the machines we run on."""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

logger = logging.getLogger(__name__)

ALIGN_BYTES = 16  # the kernel moves 16-byte vectors
# Measured on 2 x H100 (benchmarks/gpu_allreduce.py): below this one-shot beats NCCL's all-reduce inside CUDA graphs.
ONE_SHOT_MAX_BYTES = 512 << 10


@dataclass
class SymmMemAllReduce:
    """Built by the rank setup after the process group (`build_symm_all_reduce`); one per rank."""

    group_name: str
    buffer: torch.Tensor  # symmetric memory, rendezvoused over the group
    one_shot_max_bytes: int

    def accepts(self, x: torch.Tensor) -> bool:
        return (x.is_cuda and x.is_contiguous() and x.nbytes <= self.one_shot_max_bytes
                and x.nbytes % ALIGN_BYTES == 0 and x.dtype in (torch.bfloat16, torch.float16, torch.float32))

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum over ranks of x, as a new tensor (x is left as it was)."""
        slot = self.buffer.view(x.dtype)[: x.numel()].view_as(x)  # starts at the allocation's base
        out = torch.empty_like(x)
        return torch.ops.symm_mem.one_shot_all_reduce_copy_out(slot, x, "sum", self.group_name, out)


def build_symm_all_reduce(group, device: str, one_shot_max_bytes: int) -> SymmMemAllReduce | None:
    """The communicator, or None where symmetric memory is unavailable or its self-check fails on this rank (the
    caller makes the ranks agree before using it: every rank must take the same path for every tensor)."""
    try:
        import torch.distributed._symmetric_memory as symm_mem

        group_name = group.group_name
        if hasattr(symm_mem, "enable_symm_mem_for_group"):
            symm_mem.enable_symm_mem_for_group(group_name)
        buffer = symm_mem.empty(one_shot_max_bytes, dtype=torch.uint8, device=device)
        symm_mem.rendezvous(buffer, group_name)
        comm = SymmMemAllReduce(group_name, buffer, one_shot_max_bytes)
        rank, world = group.rank(), group.size()
        probe = torch.full((4096,), float(rank + 1), dtype=torch.bfloat16, device=device)
        got = comm.all_reduce(probe)
        torch.cuda.synchronize(device)
        if not bool((got == world * (world + 1) / 2).all()):
            logger.warning("symmetric-memory all-reduce gave a wrong sum: using NCCL")
            return None
        return comm
    except Exception as e:  # noqa: BLE001 - an optional fast path: NCCL serves without it
        logger.warning("symmetric-memory all-reduce unavailable (%s: %s): using NCCL", type(e).__name__, e)
        return None
