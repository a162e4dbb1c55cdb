"""The hierarchical KV cache (SGLang's HiCache): the radix tree over the device pool, a host pool and an optional
storage tier. hiradix_cache.py is the tree; host_pool.py the host tier and the copies; storage.py and storage_tier.py
the storage tier; config.py the settings."""
from radixlm.runtime.cache.hicache.config import HiCacheConfig
from radixlm.runtime.cache.hicache.hiradix_cache import HiRadixCache

__all__ = ["HiCacheConfig", "HiRadixCache"]
