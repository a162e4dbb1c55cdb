"""The hierarchical cache's invariants: which nodes each tier may evict, and the recount of both tiers."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from radixlm.runtime.cache.radix_node import TreeNode

if TYPE_CHECKING:
    from radixlm.runtime.cache.hicache.hiradix_cache import HiRadixCache


def device_evictable(n: TreeNode) -> bool:
    return (n.parent is not None and not n.deleted and n.value is not None and n.lock_ref == 0 and n.host_lock == 0
            and all(c.value is None for c in n.children.values()))


def host_evictable(n: TreeNode) -> bool:
    return (n.parent is not None and not n.deleted and n.value is None and n.host_value is not None
            and not n.children and n.host_lock == 0)


def check_tiers(tree: "HiRadixCache") -> None:
    """Recomputes both tiers' sizes and structure from the tree; raises AssertionError on any mismatch."""
    evictable = protected = 0
    host: list[torch.Tensor] = []
    nodes = tree._nodes()
    for node in nodes:
        for ck, child in node.children.items():
            assert child.parent is node and not child.deleted, "a child's parent link is broken"
            assert ck == child.key.child_key(tree.page_size), "child stored under the wrong key"
            if node is not tree.root_node:
                assert child.key.extra_key == node.key.extra_key, "extra_key namespaces mixed"
            assert child.value is None or node is tree.root_node or node.value is not None, \
                "a device node below a host-only one"
        if node is tree.root_node:
            continue
        assert len(node.key) > 0 and len(node.key) % tree.page_size == 0, "node key not page aligned"
        assert node.value is not None or node.host_value is not None, "a node with no KV in either tier"
        assert node.host_lock == 0, "a node still locked for a copy"
        if node.value is None:
            assert node.lock_ref == 0, "a host-only node is locked"
        else:
            assert len(node.value) == len(node.key), "value/key length mismatch"
            assert node.lock_ref >= sum(c.lock_ref for c in node.children.values()), "lock_ref below children's"
            if node.lock_ref == 0:
                evictable += len(node.key)
            else:
                protected += len(node.key)
        if node.host_value is not None:
            assert len(node.host_value) == len(node.key), "host_value/key length mismatch"
            host.append(node.host_value)
    assert evictable == tree.evictable_size_, f"evictable {tree.evictable_size_} != recount {evictable}"
    assert protected == tree.protected_size_, f"protected {tree.protected_size_} != recount {protected}"
    for queue, evictable_now, tier in ((tree.evict_queue, device_evictable, "device"),
                                       (tree.host_queue, host_evictable, "host")):
        queued = queue.queued()
        assert all(n.id in queued for n in nodes if evictable_now(n)), f"a {tier} leaf is missing from its queue"
    values = tree.all_values_flatten()
    assert torch.unique(values).numel() == values.numel(), "a KV slot is held by two nodes"
    if values.numel():
        assert not bool(tree.token_to_kv_pool_allocator.page_is_free[values // tree.page_size].any()), \
            "the tree holds a freed page"
    halloc = tree.host_pool.allocator
    halloc.check_no_double_free()
    host_slots = torch.cat(host) if host else torch.empty(0, dtype=torch.int64)
    assert torch.unique(host_slots).numel() == host_slots.numel(), "a host slot is held by two nodes"
    if host_slots.numel():
        assert not bool(halloc.page_is_free[host_slots // tree.page_size].any()), "the tree holds a freed host page"
    assert halloc.available_size() + host_slots.numel() == halloc.size, (
        f"host KV accounting broken: free {halloc.available_size()} + held {host_slots.numel()} != {halloc.size}")
