"""The hierarchical cache's settings, resolved once from ServerArgs and the device pool."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from radixlm.runtime.args import HiCachePrefetchPolicy, HiCacheStorageBackend, HiCacheWritePolicy, ServerArgs
from radixlm.runtime.cache.kv_pool import KVPool

# Tokens per storage page (rounded up to a whole number of KV pages), SGLang's usual --page-size with storage.
STORAGE_PAGE_TOKENS = 64
# The timeout prefetch policy waits this long, plus PREFETCH_TIMEOUT_PER_KTOKEN per thousand tokens asked.
PREFETCH_TIMEOUT_BASE_S = 1.0
PREFETCH_TIMEOUT_PER_KTOKEN_S = 0.25
# The host pool may take at most this share of the machine's memory.
MAX_HOST_MEM_SHARE = 0.8


@dataclass(frozen=True)
class HiCacheConfig:
    host_tokens: int
    write_policy: HiCacheWritePolicy = HiCacheWritePolicy.WRITE_THROUGH
    storage_backend: HiCacheStorageBackend | None = None
    storage_dir: Path | None = None
    prefetch_policy: HiCachePrefetchPolicy = HiCachePrefetchPolicy.BEST_EFFORT
    namespace: str = ""  # the model's identity in storage keys
    storage_page_tokens: int = STORAGE_PAGE_TOKENS

    def __post_init__(self) -> None:
        if self.host_tokens <= 0:
            raise ValueError(f"host KV pool of {self.host_tokens} tokens")
        if self.storage_page_tokens <= 0:
            raise ValueError(f"storage pages of {self.storage_page_tokens} tokens")

    def prefetch_timeout(self, tokens: int) -> float:
        return PREFETCH_TIMEOUT_BASE_S + PREFETCH_TIMEOUT_PER_KTOKEN_S * tokens / 1000

    @staticmethod
    def from_args(args: ServerArgs, device_pool: KVPool, namespace: str) -> "HiCacheConfig":
        from radixlm.runtime.cache.hicache.storage import default_storage_dir
        from radixlm.runtime.executor.memory import physical_memory_bytes

        ps = device_pool.page_size
        per_token = device_pool.layout.bytes_per_token
        if args.hicache_size > 0:
            tokens = int(args.hicache_size * 1e9 // per_token)
        else:
            tokens = int(device_pool.size * args.hicache_ratio)
        tokens = tokens // ps * ps
        if tokens < device_pool.size:
            raise ValueError(f"hierarchical cache: the host pool ({tokens} tokens) must hold at least the device pool "
                             f"({device_pool.size} tokens): raise --hicache-size or --hicache-ratio")
        limit = physical_memory_bytes() * MAX_HOST_MEM_SHARE
        if tokens * per_token > limit:
            raise ValueError(f"hierarchical cache: a host pool of {tokens * per_token / 2**30:.1f} GiB exceeds "
                             f"{MAX_HOST_MEM_SHARE:.0%} of this machine's memory: lower --hicache-size or "
                             f"--hicache-ratio")
        storage = args.hicache_storage_backend
        return HiCacheConfig(
            host_tokens=tokens, write_policy=args.hicache_write_policy, storage_backend=storage,
            storage_dir=default_storage_dir() if storage is not None else None,
            prefetch_policy=args.hicache_storage_prefetch_policy, namespace=namespace,
            storage_page_tokens=-(-STORAGE_PAGE_TOKENS // ps) * ps,
        )
