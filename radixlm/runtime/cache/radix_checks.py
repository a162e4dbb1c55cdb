"""The plain radix tree's invariants, recounted from its nodes (RadixCache.check_consistency; a hierarchical tree's
are hicache/checks.py's)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from radixlm.runtime.cache.radix_cache import RadixCache


def check_tree(tree: "RadixCache") -> None:
    """Recomputes sizes and structure from the tree; raises AssertionError on any mismatch."""
    evictable = protected = 0
    for node in tree._nodes():
        child_locks = 0
        for ck, child in node.children.items():
            assert child.parent is node, "child.parent is not its parent"
            assert ck == child.key.child_key(tree.page_size), "child stored under the wrong key"
            if node is not tree.root_node:
                assert child.key.extra_key == node.key.extra_key, "extra_key namespaces mixed"
            child_locks += child.lock_ref
        if node is tree.root_node:
            continue
        assert len(node.key) > 0 and len(node.key) % tree.page_size == 0, "node key not page aligned"
        assert node.value is not None and len(node.value) == len(node.key), "value/key length mismatch"
        assert 0 <= node.draft_kv_len <= len(node.key), "draft KV marked past the node's tokens"
        assert node.lock_ref >= child_locks, "lock_ref smaller than the locks below it"
        if node.lock_ref == 0:
            evictable += len(node.key)
        else:
            protected += len(node.key)
    assert evictable == tree.evictable_size_, f"evictable {tree.evictable_size_} != recount {evictable}"
    queued = tree.evict_queue.queued()
    assert all(n.id in queued for n in tree._nodes() if n is not tree.root_node and n.is_leaf() and n.lock_ref == 0), \
        "an unlocked leaf is missing from the eviction queue"
    assert protected == tree.protected_size_, f"protected {tree.protected_size_} != recount {protected}"
    values = tree.all_values_flatten()
    assert torch.unique(values).numel() == values.numel(), "a KV slot is held by two nodes"
    allocator = tree.token_to_kv_pool_allocator
    if allocator is not None and values.numel():
        pages = values // tree.page_size
        assert not bool(allocator.page_is_free[pages].any()), "the tree holds a freed page"
