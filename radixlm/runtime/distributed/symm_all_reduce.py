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
# The fused kernel against the all-reduce then the norm, per call in a graph on 2 x H200 (8B shapes, `gpu_multi.py
# --parts allreduce`, benchmarks/results/multi_gpu/h200x2/arnorm_lamport): 3.7 against 8.3 us at 1 row, 9.8 against
# 21.7 at 256, so every row count the kernel's buffer holds takes it (--disable-allreduce-fusion: never).
ARNORM_BUFFER_BYTES = 8 << 20  # two slots, each of 256 rows of 4,096 bf16 from each of two ranks


@dataclass
class SymmArNorm:
    """The all-reduce, residual add and RMSNorm in one kernel (kernels/elementwise/allreduce_rmsnorm.py) over a
    symmetric buffer of its own; built with the communicator."""

    buffer: torch.Tensor  # symmetric memory: the two slots
    bufs: torch.Tensor  # every rank's buffer address, rank order (int64, on this rank's GPU)
    epochs: torch.Tensor  # this rank's per-row call counters (int32)
    rank: int
    layout: object  # allreduce_rmsnorm.ArNormLayout
    kernel: Callable  # allreduce_rmsnorm.allreduce_add_rmsnorm (bound once: the module imports Triton)

    def accepts(self, x: torch.Tensor, residual: torch.Tensor) -> bool:
        return (x.is_cuda and x.dim() == 2
                and x.dtype in (torch.bfloat16, torch.float16, torch.float32) and x.is_contiguous()
                and residual.shape == x.shape and residual.dtype == x.dtype and residual.stride(-1) == 1
                and x.shape[0] <= self.layout.max_rows(x.shape[1] * x.element_size()))

    def __call__(self, x, residual, weight, eps):
        return self.kernel(x, residual, weight, eps, self.bufs, self.epochs, self.rank, self.layout)


@dataclass
class SymmMemAllReduce:
    """Built by the rank setup after the process group (`build_symm_all_reduce`); one per rank."""

    group_name: str
    buffer: torch.Tensor  # symmetric memory, rendezvoused over the group
    world_size: int
    one_shot_max_bytes: int = ONE_SHOT_MAX_BYTES
    arnorm: SymmArNorm | None = None  # None: the norm after a sum runs on its own

    def fused_add_rmsnorm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                          eps: float) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Parallel.fused_add_rmsnorm's fused case; None where the kernel cannot take x (every rank alike)."""
        if self.arnorm is None or not self.arnorm.accepts(x, residual):
            return None
        return self.arnorm(x, residual, weight, eps)

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


def _on_every_rank(agree: Callable[[list[bool]], list[bool]], what: str, step: Callable[[], object]):
    """step's result where it gave one on every rank, else None on every rank. The steps are collective (a rank alone
    in a rendezvous or a probe waits for its peers forever), so the ranks agree after each one before the next."""
    try:
        result = step()
    except Exception as e:  # noqa: BLE001 - optional fast paths: NCCL and the unfused norm serve without them
        logger.warning("%s failed (%s: %s)", what, type(e).__name__, e)
        result = None
    return result if agree([result is not None])[0] else None


def build_symm_all_reduce(group, device: str, agree: Callable[[list[bool]], list[bool]],
                          buffer_bytes: int = BUFFER_BYTES, fuse_norm: bool = False) -> SymmMemAllReduce | None:
    """The communicator, or None on every rank where symmetric memory is unavailable or its self-check fails on any
    (NCCL serves then). agree: the position-wise AND over ranks (on host data): that every rank set up its buffer,
    that every rendezvous succeeded, then that every probe summed right. fuse_norm: with SymmArNorm (build_arnorm)."""
    import torch.distributed._symmetric_memory as symm_mem

    group_name = group.group_name

    def allocate() -> torch.Tensor:
        if group_name in getattr(symm_mem, "_group_name_to_store", {}):
            # PyTorch keeps the first registration of a group name for the life of the process: a later group of
            # the same name (a second engine in this process) would meet its peers through the first one's store.
            raise RuntimeError(f"symmetric memory was set up in this process for an earlier group named {group_name}")
        if hasattr(symm_mem, "enable_symm_mem_for_group"):
            symm_mem.enable_symm_mem_for_group(group_name)
        return symm_mem.empty(buffer_bytes, dtype=torch.uint8, device=device)

    buffer = _on_every_rank(agree, "symmetric-memory all-reduce: allocation", allocate)
    if buffer is None:
        return None

    def meet() -> SymmMemAllReduce:
        symm_mem.rendezvous(buffer, group_name)
        return SymmMemAllReduce(group_name, buffer, group.size())

    comm = _on_every_rank(agree, "symmetric-memory all-reduce: rendezvous", meet)
    if comm is None:
        return None

    def probe() -> bool | None:
        rank, world = group.rank(), group.size()
        ok = True
        for n in (4096, buffer_bytes // 2):  # a one-shot size and the largest two-shot size
            x = torch.full((n,), float(rank + 1), dtype=torch.bfloat16, device=device)
            ok &= comm.accepts(x) and bool((comm.all_reduce(x) == world * (world + 1) / 2).all())
        torch.cuda.synchronize(device)
        return True if ok else None

    if _on_every_rank(agree, "symmetric-memory all-reduce: self-check", probe) is None:
        logger.warning("symmetric-memory all-reduce unavailable or wrong on some rank: using NCCL")
        return None
    if fuse_norm:
        comm.arnorm = build_arnorm(group, device, agree)
    return comm


def build_arnorm(group, device: str, agree: Callable[[list[bool]], list[bool]],
                 buffer_bytes: int = ARNORM_BUFFER_BYTES) -> SymmArNorm | None:
    """The fused all-reduce and norm, or None on every rank where it cannot be set up or its probe fails on any
    (the unfused steps serve then; agreed step by step as build_symm_all_reduce)."""
    import torch.distributed._symmetric_memory as symm_mem

    from radixlm.runtime.kernels.elementwise.allreduce_rmsnorm import (
        EMPTY_BYTE, MAX_ROWS, ArNormLayout, allreduce_add_rmsnorm)

    layout = ArNormLayout(group.size(), buffer_bytes)

    def allocate() -> torch.Tensor:
        buffer = symm_mem.empty(buffer_bytes, dtype=torch.uint8, device=device)
        buffer.fill_(EMPTY_BYTE)  # every slot empty on every rank before any peer sends
        torch.cuda.synchronize(device)
        return buffer

    buffer = _on_every_rank(agree, "fused all-reduce + RMSNorm: allocation", allocate)
    if buffer is None:
        return None

    def meet() -> SymmArNorm:
        handle = symm_mem.rendezvous(buffer, group.group_name)
        bufs = torch.tensor(list(handle.buffer_ptrs), dtype=torch.int64, device=device)
        epochs = torch.zeros(MAX_ROWS, dtype=torch.int32, device=device)
        return SymmArNorm(buffer, bufs, epochs, group.rank(), layout, allreduce_add_rmsnorm)

    arnorm = _on_every_rank(agree, "fused all-reduce + RMSNorm: rendezvous", meet)
    if arnorm is None:
        return None

    def probe() -> bool | None:
        rank, world = group.rank(), group.size()
        ok = True
        for rows in (1, 3, 1):  # the second call of row 0 takes the other slot
            x = torch.full((rows, 4096), float(rank + 1), dtype=torch.bfloat16, device=device)
            out, res = arnorm(x, torch.ones_like(x), torch.ones(4096, dtype=torch.bfloat16, device=device), 1e-6)
            ok &= bool((res == world * (world + 1) / 2 + 1).all()) and bool(((out - 1).abs() < 1e-2).all())
        torch.cuda.synchronize(device)
        return True if ok else None

    if _on_every_rank(agree, "fused all-reduce + RMSNorm: self-check", probe) is None:
        logger.warning("fused all-reduce + RMSNorm unavailable or wrong on some rank: the norm runs on its own")
        return None
    return arnorm
