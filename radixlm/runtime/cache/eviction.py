"""Eviction orders for the radix cache: the leaf with the smallest priority tuple is evicted first."""
from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from radixlm.runtime.cache.radix_node import TreeNode

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


class EvictionQueue:
    """The tree's unlocked leaves in eviction order, kept incrementally so that an eviction does not walk the tree.

    The tree offers a node whenever it may have become an unlocked leaf or its priority moved (priorities only
    grow); entries whose node is gone, locked, no longer a leaf or re-prioritised since are stale and skipped when
    popped. When stale entries pile up the heap is rebuilt from the tree."""

    def __init__(self, strategy: EvictionStrategy, evictable: Callable[["TreeNode"], bool] | None = None):
        self.strategy = strategy
        self.heap: list[tuple[tuple, int, "TreeNode"]] = []
        self._rebuilt_size = 0
        # Which nodes this queue may evict (a hierarchical cache keeps one queue per tier).
        self._evictable = evictable or self._unlocked_leaf

    @staticmethod
    def _unlocked_leaf(node: "TreeNode") -> bool:
        return node.parent is not None and not node.deleted and not node.children and node.lock_ref == 0

    def offer(self, node: "TreeNode") -> None:
        if self._evictable(node):
            heapq.heappush(self.heap, (self.strategy(node), node.id, node))

    def pop(self) -> "TreeNode | None":
        while self.heap:
            prio, _, node = heapq.heappop(self.heap)
            if self._evictable(node) and prio == self.strategy(node):
                return node
        return None

    def maybe_rebuild(self, nodes: Callable[[], list["TreeNode"]]) -> None:
        if len(self.heap) > 2 * self._rebuilt_size + 1024:
            self.heap = [(self.strategy(n), n.id, n) for n in nodes() if self._evictable(n)]
            heapq.heapify(self.heap)
            self._rebuilt_size = len(self.heap)

    def queued(self) -> set[int]:
        """Ids of the nodes with a current entry (for consistency checks)."""
        return {n.id for prio, _, n in self.heap if self._evictable(n) and prio == self.strategy(n)}
