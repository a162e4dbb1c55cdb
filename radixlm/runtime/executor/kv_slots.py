"""The KV slots a ModelRunner runs over: the request table, the KV pool and its allocator. A runner sizes its own from
the memory budget, or shares another runner's table and allocator (a draft model's, an EAGLE head's)."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixlm.runtime.args import ServerArgs
from radixlm.runtime.cache.kv_pool import KVLayout, KVPool
from radixlm.runtime.cache.kv_quant import KVScales
from radixlm.runtime.cache.memory_pool import ReqToTokenPool, TokenToKVPoolAllocator, make_kv_pool
from radixlm.runtime.distributed.parallel import Parallel
from radixlm.runtime.executor.logits import LogitsProcessor
from radixlm.runtime.executor.memory import MemoryReserve, kv_pool_tokens
from radixlm.runtime.layers.radix_attention import RadixAttention
from radixlm.runtime.model_loader.config import ModelConfig

if TYPE_CHECKING:
    from radixlm.runtime.executor.model_runner import ModelRunner

logger = logging.getLogger(__name__)

@dataclass(frozen=True)
class SharedSlots:
    """A runner over another runner's slots (a draft model's, an EAGLE head's): the other's request table, allocator
    and pool size, with a KV pool of its own of that size plus `extra_slots`. Its owner builds its kernels and graphs:
    it has no tuned GEMMs, media, warm-up or graphs of its own."""

    target: "ModelRunner"
    extra_slots: int = 0
    model: torch.nn.Module | None = None  # built by the owner; None: loaded from the runner's model_config
    logits_processor: LogitsProcessor | None = None  # None: over the model's lm_head


def kv_layout(cfg: ModelConfig, dtype: torch.dtype, num_kv_heads: int) -> KVLayout:
    """What the pool stores per token per layer: the model's K and V heads of this rank, or MLA's latent."""
    if cfg.mla is not None:
        return KVLayout.mla(cfg.num_layers, dtype, cfg.mla.kv_lora_rank, cfg.mla.qk_rope_head_dim)
    return KVLayout.mha(cfg.num_layers, dtype, num_kv_heads, cfg.head_dim)


def build_kv_pool(layout: KVLayout, size: int, page_size: int, model: torch.nn.Module, device: str) -> KVPool:
    """The KV pool in the layout's dtype, with each layer's scales (its RadixAttention's: the checkpoint's)."""
    # Triton converts float8 e4m3 (its fp8e4nv) on compute capability 8.9 and later only.
    if (torch.device(device).type == "cuda" and layout.dtype is torch.float8_e4m3fn
            and torch.cuda.get_device_capability(device) < (8, 9)):
        raise ValueError(f"--kv-cache-dtype fp8_e4m3 needs a GPU of compute capability 8.9 or later (this one: "
                         f"{torch.cuda.get_device_capability(device)}); use fp8_e5m2 or auto")
    by_layer = {m.layer_id: KVScales(m.k_scale, m.v_scale) for m in model.modules() if isinstance(m, RadixAttention)}
    scales = [by_layer.get(i, KVScales()) for i in range(layout.num_layers)]
    return make_kv_pool(layout, size, page_size, device, scales)


@dataclass(frozen=True)
class KVSlots:
    req_to_token_pool: ReqToTokenPool
    token_to_kv_pool: KVPool
    allocator: TokenToKVPoolAllocator
    max_total_num_tokens: int
    max_running_requests: int

    @classmethod
    def own(cls, args: ServerArgs, layout: KVLayout, model: torch.nn.Module, context_len: int, device: str,
            parallel: Parallel, reserve: MemoryReserve) -> "KVSlots":
        """Slots of the runner's own, as many as the memory budget allows after `reserve`."""
        is_cuda = torch.device(device).type == "cuda"
        # The request table comes first so that the KV pool's budget sees its memory.
        max_running = args.max_running_requests or (4096 if is_cuda else 256)
        table = ReqToTokenPool(max_running + 1, context_len + 4, device)
        tokens = kv_pool_tokens(args, is_cuda, parallel, layout.bytes_per_token, table.size, reserve)
        max_running_requests = args.max_running_requests or max(1, min(tokens // 2, max_running))
        pool = build_kv_pool(layout, tokens, args.page_size, model, device)
        # On CUDA the allocator's double-free check would read device memory back on every free (a sync).
        allocator = TokenToKVPoolAllocator(tokens, args.page_size, device,
                                           debug=not is_cuda or args.enable_integrity_check)
        logger.info("KV pool: %d tokens (%.1f MiB, %s), max running requests %d", tokens, pool.mem_bytes() / 2**20,
                    str(pool.dtype).removeprefix("torch."), max_running_requests)
        return cls(table, pool, allocator, tokens, max_running_requests)

    @classmethod
    def shared(cls, shared: SharedSlots, layout: KVLayout, model: torch.nn.Module, page_size: int,
               device: str) -> "KVSlots":
        """The target's table and allocator, with a pool of this runner's layout over the target's slots and
        `shared.extra_slots` more."""
        target = shared.target
        pool = build_kv_pool(layout, target.max_total_num_tokens + shared.extra_slots, page_size, model, device)
        return cls(target.req_to_token_pool, pool, target.token_to_kv_pool_allocator, target.max_total_num_tokens,
                   target.max_running_requests)
