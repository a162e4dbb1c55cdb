"""Eviction orders for the radix cache: the leaf with the smallest priority tuple is evicted first."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from radixlm.runtime.cache.radix_cache import TreeNode

EvictionStrategy = Callable[["TreeNode"], tuple]


def lru_priority(node: "TreeNode") -> tuple:
    return (node.last_access_time, node.id)


def lfu_priority(node: "TreeNode") -> tuple:
    # Ties on frequency fall back to recency.
    return (node.hit_count, node.last_access_time, node.id)


def fifo_priority(node: "TreeNode") -> tuple:
    return (node.creation_time, node.id)


EVICTION_STRATEGIES: dict[str, EvictionStrategy] = {
    "lru": lru_priority,
    "lfu": lfu_priority,
    "fifo": fifo_priority,
}


def get_eviction_strategy(name: str) -> EvictionStrategy:
    try:
        return EVICTION_STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown eviction policy {name!r}; choose from {sorted(EVICTION_STRATEGIES)}") from None
