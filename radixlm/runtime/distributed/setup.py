"""A scheduler rank joins its peers: the process group (NCCL on GPUs, gloo on CPU, plus a gloo group for host data),
its device, and the `Parallel` its model and scheduler use."""
from __future__ import annotations

import dataclasses
import datetime
import logging
from dataclasses import dataclass

from radixlm.runtime.args import ServerArgs
from radixlm.runtime.distributed.parallel import SINGLE, Parallel
from radixlm.runtime.distributed.symm_all_reduce import build_symm_all_reduce

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RankPlacement:
    """Set by the launcher for each scheduler process it starts."""

    rank: int  # the tensor-parallel rank, over all nodes
    init_method: str  # where the ranks meet: tcp://host:port (node 0's --dist-init-addr, or a free local port)

    def local_rank(self, args: ServerArgs) -> int:
        return self.rank % (args.tp_size // args.nnodes)

    def device(self, args: ServerArgs) -> str:
        device = args.resolved_device()
        if device == "cuda":
            return f"cuda:{args.base_gpu_id + self.local_rank(args)}"
        return device


def init_distributed(args: ServerArgs, placement: RankPlacement | None) -> tuple[Parallel, str]:
    """(this rank's Parallel, its device). Blocks until all tp_size ranks have joined (or dist_timeout passes)."""
    import torch

    if args.tp_size == 1 or placement is None:
        device = args.resolved_device()
        if device == "cuda" and args.base_gpu_id:  # else the current device (GPU 0 of those visible)
            device = f"cuda:{args.base_gpu_id}"
            torch.cuda.set_device(device)
        return SINGLE, device
    import torch.distributed as dist

    device = placement.device(args)
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=args.dist_timeout)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=placement.init_method, rank=placement.rank,
                            world_size=args.tp_size, timeout=timeout,
                            device_id=torch.device(device) if cuda else None)
    group = dist.group.WORLD
    cpu_group = dist.new_group(backend="gloo", timeout=timeout) if cuda else group
    logger.info("rank %d of %d joined at %s on %s", placement.rank, args.tp_size, placement.init_method, device)
    parallel = Parallel(tp_rank=placement.rank, tp_size=args.tp_size, ep_size=args.ep_size, group=group,
                        cpu_group=cpu_group)
    if cuda and args.nnodes == 1 and not args.disable_custom_all_reduce:
        comm = build_symm_all_reduce(group, device, parallel.all_true,  # the same answer on every rank
                                     fuse_norm=not args.disable_allreduce_fusion)
        if comm is not None:
            parallel = dataclasses.replace(parallel, device_comm=comm)
            logger.info("all-reduce up to %d MiB through symmetric memory", comm.buffer.nbytes >> 20)
    return parallel, device


def shutdown_distributed() -> None:
    """Leaves the process groups. NCCL's are aborted, not destroyed: a destroy waits for the peers' destroys, and
    the peers leave at different times (rank 0 of the offline Engine waits for the others to exit first), which
    hung the Engine's shutdown on GPUs."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
    if dist.get_backend() == "nccl" and abort is not None:
        abort()
    else:
        dist.destroy_process_group()
