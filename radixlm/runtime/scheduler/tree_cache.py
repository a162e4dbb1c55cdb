"""The scheduler's prefix cache: the radix tree over the runner's KV pool, with a host tier (and storage) under
--enable-hierarchical-cache, or a disabled one when nothing may be shared."""
from __future__ import annotations

import logging

from radixlm.runtime.args import ServerArgs
from radixlm.runtime.cache.radix_cache import RadixCache

logger = logging.getLogger(__name__)


def build_tree_cache(args: ServerArgs, runner) -> RadixCache:
    """runner: the ModelRunner whose request table, allocator and KV pool the tree indexes."""
    # An encoder's rows attend both ways: a prompt's first rows depend on the rest, so nothing is shared.
    no_sharing = args.disable_radix_cache or not runner.is_causal
    if args.enable_hierarchical_cache and not no_sharing:
        return hierarchical_cache(args, runner)
    return RadixCache(runner.req_to_token_pool, runner.token_to_kv_pool_allocator, page_size=args.page_size,
                      disable=no_sharing, eviction_policy=args.radix_eviction_policy)


def hierarchical_cache(args: ServerArgs, runner) -> RadixCache:
    """The radix tree over the device pool, a host pool and, if asked, storage (docs/hicache.md)."""
    from radixlm.runtime.cache.hicache import HiCacheConfig, HiRadixCache

    pool = runner.token_to_kv_pool
    parallel = runner.parallel
    # Storage keys name the model and this rank's slice of the KV: pages are reused only by the same.
    layout = pool.layout
    rows = "x".join(map(str, (layout.num_layers, *layout.row_shape)))  # MLA's: layers x 1 x (rank + rope)
    namespace = f"{args.model_path}|{args.load_format}|{pool.dtype}|{rows}|tp{parallel.tp_rank}/{parallel.tp_size}"
    config = HiCacheConfig.from_args(args, pool, namespace)
    cache = HiRadixCache(runner.req_to_token_pool, runner.token_to_kv_pool_allocator, pool, config,
                         page_size=args.page_size, eviction_policy=args.radix_eviction_policy)
    logger.info("hierarchical cache: host pool of %d tokens (%.2f GiB), %s%s", config.host_tokens,
                cache.host_pool.mem_bytes() / 2**30, config.write_policy.value,
                f", storage in {config.storage_dir}" if config.storage_dir is not None else "")
    return cache
