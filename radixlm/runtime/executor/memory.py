"""How many tokens the KV pool holds: what the memory budget leaves once the weights (and another model on the same
device, such as a draft model) are counted, the same on every tensor-parallel rank."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch

from radixlm.runtime.args import ServerArgs
from radixlm.runtime.distributed.parallel import Parallel

logger = logging.getLogger(__name__)

# Without a memory fraction, a CPU pool takes this share of physical memory (KV only: weights are
# already resident), capped so that small test machines stay responsive.
CPU_KV_MEM_FRACTION = 0.05
CPU_MAX_TOTAL_TOKENS = 1 << 17
GPU_DEFAULT_MEM_FRACTION = 0.85


@dataclass(frozen=True)
class MemoryReserve:
    """Memory another model takes on this runner's device (a draft model's: spec.budget.draft_reserve sets it):
    bytes of its own, bytes per request-table row, and its KV bytes beside every pooled token."""

    fixed_bytes: int = 0
    bytes_per_row: int = 0
    kv_bytes_per_token: int = 0


def physical_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def kv_pool_tokens(args: ServerArgs, is_cuda: bool, parallel: Parallel, kv_bytes_per_token: int, rows: int,
                   reserve: MemoryReserve) -> int:
    """The pool's size in tokens, a whole number of pages: --max-total-tokens, else the share of memory
    --mem-fraction-static leaves (KV of this model and of the reserve's per token)."""
    per_token = kv_bytes_per_token + reserve.kv_bytes_per_token
    if args.max_total_tokens is not None:
        n = args.max_total_tokens
    elif is_cuda:
        # mem_fraction_static covers weights + KV pool; the rest stays for activations, graphs and logits.
        free, total = torch.cuda.mem_get_info()
        frac = args.mem_fraction_static or GPU_DEFAULT_MEM_FRACTION
        used = total - free + reserve.fixed_bytes + rows * reserve.bytes_per_row
        n = int((total * frac - used) // per_token)
        logger.info(
            "memory budget: %.2f GiB total x %.2f static = %.2f GiB; weights and runtime %.2f GiB; KV pool %.2f GiB "
            "(%d bytes/token); %.2f GiB left for activations and CUDA graphs", total / 2**30, frac,
            total * frac / 2**30, used / 2**30, max(n, 0) * per_token / 2**30,
            per_token, total * (1 - frac) / 2**30)
    else:
        budget = physical_memory_bytes() * (args.mem_fraction_static or CPU_KV_MEM_FRACTION)
        n = min(int(budget // per_token), CPU_MAX_TOTAL_TOKENS)
    # Every rank must hold the same pool: the ranks' schedulers make the same decisions only over the same pool.
    n = parallel.min_int(n) // args.page_size * args.page_size
    if n < args.page_size * 2:
        raise ValueError(f"not enough memory for a KV pool: {n} tokens (raise mem_fraction_static or max_total_tokens)")
    return n
