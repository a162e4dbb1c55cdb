"""HiRadixCache: the radix tree over two pools, the device's and the host's (SGLang's HiCache), and optionally a
storage tier (storage_tier.py).

A node's KV is on the device (value), on the host (host_value), or both. NOTE invariants: the nodes on the device
form a subtree under the root (a device node's parent is on the device), since the device evicts its leaves first
and a load brings a whole path back; a node with neither is not in the tree; only device nodes are locked.

- Device eviction takes device leaves (no child on the device). A leaf with a host copy stays in the tree, host-only;
  without one (write_back copies it now, where the host pool has room) it leaves the tree with the host-only nodes
  below it.
- Host copies (backups) are made when a node is cached (write_through), at its second hit (write_through_selective)
  or at its eviction from the device (write_back): its host slots are taken then, the copy is queued and issued in a
  batch (host_pool.py), at the latest when the device evicts it. Host eviction takes host-only leaves; they leave
  the tree.
- A match reports the device part (values, last_node, length) and the host-only run below it (host_hit_length);
  admission calls match_and_load, which gives that run fresh device slots and copies its KV back (host_pool.py; on
  CUDA the loads of a round are one copy, issued when the pass takes them).
- With storage, a waiting request's match starts a read of the pages past what the tiers hold; admission inserts
  what the prefetch policy lets it wait for as host-only nodes before loading. Finished requests' pages are written."""
from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import torch

from radixlm.runtime.cache.eviction import EvictionQueue
from radixlm.runtime.cache.hicache.checks import check_tiers, device_evictable, host_evictable
from radixlm.runtime.cache.hicache.config import HiCacheConfig
from radixlm.runtime.cache.hicache.host_pool import HostKVPool
from radixlm.runtime.cache.radix_cache import RadixCache
from radixlm.runtime.cache.radix_node import CacheLock, MatchResult, RadixKey, TreeNode

if TYPE_CHECKING:
    from radixlm.runtime.cache.layer_load import LayerLoadWaiter
    from radixlm.runtime.cache.kv_pool import KVPool
    from radixlm.runtime.cache.memory_pool import ReqToTokenPool, TokenToKVPoolAllocator


class HiRadixCache(RadixCache):
    def __init__(self, req_to_token_pool: "ReqToTokenPool | None", token_to_kv_pool_allocator: "TokenToKVPoolAllocator",
                 kv_pool: "KVPool", config: HiCacheConfig, page_size: int = 1, eviction_policy: str = "lru"):
        if kv_pool.page_size != page_size:
            raise ValueError(f"KV pool page size {kv_pool.page_size} != the tree's {page_size}")
        if config.storage_page_tokens % page_size:
            raise ValueError(f"storage pages of {config.storage_page_tokens} tokens are not whole KV pages")
        self.config = config
        self.host_pool = HostKVPool(config.host_tokens, kv_pool)
        self.storage = None
        if config.storage_backend is not None:
            from radixlm.runtime.cache.hicache.storage_tier import StorageTier

            self.storage = StorageTier(config, kv_pool, self.host_pool)
        self.tier_counts: Counter = Counter()
        # Loads issued in this epoch are not yet taken by a pass (take_layer_loads starts the next).
        self._load_epoch = 1
        # (host slots, device slots) of this round's loads, issued as one copy when a pass takes them (or before
        # anything frees those device slots): a layer's copies are then a few kernel launches per round, not per
        # request. On the CPU (copies synchronous, nothing launched) a load is done on return instead.
        self.defer_loads = kv_pool.device.type == "cuda"
        self._pending_loads: list[tuple[torch.Tensor, torch.Tensor]] = []
        super().__init__(req_to_token_pool, token_to_kv_pool_allocator, page_size=page_size,
                         eviction_policy=eviction_policy)

    def reset(self) -> None:
        """Forgets both tiers (the caller clears the device allocator); storage keeps its pages."""
        super().reset()
        self._pending_loads = []
        self.evict_queue = EvictionQueue(self.eviction_strategy, device_evictable)
        self.host_queue = EvictionQueue(self.eviction_strategy, host_evictable)
        self.host_pool.clear()
        if self.storage is not None:
            self.storage.clear()

    def tier_stats(self) -> dict[str, int]:
        alloc = self.host_pool.allocator
        return {**self.tier_counts, "host_pool_tokens": alloc.size, "host_available_tokens": alloc.available_size(),
                "host_pool_pinned": int(self.host_pool.pinned), "host_pool_uva": int(self.host_pool.uva),
                **self.host_pool.stats.as_dict()}

    # ------------------------------------------------------------------ matching
    def match_valid(self, node: TreeNode | None) -> bool:
        return node is None or node is self.root_node or (not node.deleted and node.value is not None)

    def match_unchanged(self, last_node: TreeNode, token_ids: list[int], limit: int, extra_key: str | None,
                        matched: int, generation: int) -> bool:
        return self.match_valid(last_node) and super().match_unchanged(last_node, token_ids, limit, extra_key,
                                                                       matched, generation)

    def match_prefix(self, key: RadixKey) -> MatchResult:
        if len(key) < self.page_size:
            return MatchResult([self._empty()], self.root_node, 0)
        self.host_pool.poll()
        key = key.page_aligned(self.page_size)
        ids, extra, ps = key.token_ids, key.extra_key, self.page_size
        now = self._tick()
        node = self.root_node
        node.last_access_time = now
        values: list[torch.Tensor] = []
        length = host = 0
        touched = None
        threshold = self.config.write_policy.hit_threshold
        while length < len(ids):
            child = node.children.get((extra, tuple(ids[length : length + ps])))
            if child is None:
                break
            if child.value is None:
                host = self._host_run(child, key, length, now)
                break
            child.last_access_time = now
            child.hit_count += 1
            touched = child
            n = child.key.match_at(ids, length, ps)
            length += n
            split = n < len(child.key)
            if split:
                child = self._split_node(child, n)
            if threshold is not None and child.host_value is None and child.hit_count >= threshold:
                self._backup(child)
            values.append(child.value)
            node = child
            if split:
                break
        if touched is not None:
            self.evict_queue.offer(touched)
        stored = self.storage is not None and self.storage.maybe_prefetch(key, length + host)
        return MatchResult(values or [self._empty()], node, length, host_hit_length=host, storage_hit=stored)

    def _host_run(self, child: TreeNode, key: RadixKey, start: int, now: int) -> int:
        """Tokens of key from `start` matched along host-only nodes from child down (no split: load_back splits)."""
        ids, extra, ps = key.token_ids, key.extra_key, self.page_size
        pos = start
        while child is not None:
            child.last_access_time = now
            self.host_queue.offer(child)
            n = child.key.match_at(ids, pos, ps)
            pos += n
            if n < len(child.key) or pos == len(ids):
                break
            child = child.children.get((extra, tuple(ids[pos : pos + ps])))
        return pos - start

    def prefetch_ready(self, key: RadixKey) -> bool:
        return self.storage is None or self.storage.ready(key.page_aligned(self.page_size))

    def match_and_load(self, key: RadixKey) -> MatchResult:
        key = key.page_aligned(self.page_size)
        if self.storage is not None:
            found = self.storage.take(key)
            if found is not None:
                self._insert_from_storage(key, *found)
        m = self.match_prefix(key)
        if m.host_hit_length == 0:
            return m
        ids, extra, ps = key.token_ids, key.extra_key, self.page_size
        nodes, node, pos, end = [], m.last_node, m.length, m.length + m.host_hit_length
        while pos < end:
            child = node.children[(extra, tuple(ids[pos : pos + ps]))]
            assert child.value is None, "the host hit starts at a device node"
            n = child.key.match_at(ids, pos, ps)
            if n < len(child.key):
                child = self._split_node(child, n)
            nodes.append(child)
            node, pos = child, pos + n
        count = pos - m.length
        self.inc_lock_ref(m.last_node)
        for x in nodes:
            x.host_lock += 1
        slots = self._device_alloc(count)
        for x in nodes:
            x.host_lock -= 1
            self.host_queue.offer(x)  # (host eviction meanwhile dropped its entry, if it had one)
        self.dec_lock_ref(m.last_node)
        if slots is None:
            return m
        self._pending_loads.append((torch.cat([x.host_value for x in nodes]), slots))
        if not self.defer_loads:
            self.issue_loads()
        offset = 0
        for x in nodes:
            x.value = slots[offset : offset + len(x.key)]
            x.draft_kv_len = 0
            x.load_epoch = self._load_epoch
            offset += len(x.key)
        self.evictable_size_ += count
        self.evict_queue.offer(nodes[-1])
        self.tier_counts["host_loaded_tokens"] += count
        return MatchResult(m.values + [x.value for x in nodes], nodes[-1], m.length + count)

    def take_layer_loads(self) -> "LayerLoadWaiter | None":
        self.issue_loads()
        self._load_epoch += 1
        return self.host_pool.take_layer_loads()

    def issue_loads(self) -> None:
        """Issues the loads queued since the last pass took them, as one copy (host_pool.load)."""
        if not self._pending_loads:
            return
        pending, self._pending_loads = self._pending_loads, []
        if len(pending) == 1:
            self.host_pool.load(*pending[0])
        else:
            self.host_pool.load(torch.cat([h for h, _ in pending]), torch.cat([d for _, d in pending]))

    def _device_alloc(self, n: int) -> torch.Tensor | None:
        alloc = self.token_to_kv_pool_allocator
        if alloc.available_size() < n:
            self.evict(n - alloc.available_size())
        return alloc.alloc(n)

    # ------------------------------------------------------------------ tree edits
    def _requeue(self, lower: TreeNode) -> None:
        self.evict_queue.offer(lower)
        self.host_queue.offer(lower)

    def _on_path(self, node: TreeNode, value: torch.Tensor, owned: bool, draft_kv_len: int) -> int:
        """A host-only node on an insert's path takes the caller's slots (they hold the same KV): it is on both tiers
        again, and only the device part counts as present."""
        if node.value is not None:
            return len(value)
        node.value = value if owned else value.clone()
        node.draft_kv_len = min(max(draft_kv_len, 0), len(value))
        self.evictable_size_ += len(value)
        return 0

    def _add_leaf(self, parent: TreeNode, key: RadixKey, value: torch.Tensor, owned: bool, now: int,
                  draft_kv_len: int) -> TreeNode:
        leaf = super()._add_leaf(parent, key, value, owned, now, draft_kv_len)
        if self.config.write_policy.hit_threshold == 1:
            self._backup(leaf)
        return leaf

    def _insert_from_storage(self, key: RadixKey, start_page: int, pages: list[torch.Tensor]) -> None:
        """Hangs pages read from storage (pages start_page.. of key) under the tree as host-only nodes, where the
        tree still holds every token before them."""
        P = self.config.storage_page_tokens
        start, end = start_page * P, (start_page + len(pages)) * P
        key = key[:end]
        node, pos, rest = self.root_node, 0, key
        while len(rest) > 0:
            child = node.children.get(rest.child_key(self.page_size))
            if child is None:
                break
            n = child.key.match(rest, self.page_size)
            if n < len(child.key):
                child = self._split_node(child, n)
            pos, rest, node = pos + n, rest[n:], child
        if pos < start or pos >= end:
            return
        slots = self._host_alloc(end - pos)
        if slots is None:
            return
        rows = torch.cat(pages)[pos - start :]
        self.host_pool.write(slots, rows)
        leaf = TreeNode(key=rest, value=None, host_value=slots, parent=node, last_access_time=self._tick(),
                        creation_time=self._clock)
        node.children[rest.child_key(self.page_size)] = leaf
        if self.kgram_index is not None:
            self.kgram_index.add(leaf)
        self.host_queue.offer(leaf)
        self.tier_counts["storage_loaded_tokens"] += end - pos

    # ------------------------------------------------------------------ copies and eviction
    def _backup(self, node: TreeNode) -> bool:
        """Gives a device node a host copy, if the host pool has (or can evict) room; whether it has one."""
        if node.host_value is not None:
            return True
        slots = self._host_alloc(len(node.key))
        if slots is None:
            return False
        self.host_pool.backup(node.value, slots)
        node.host_value = slots
        self.tier_counts["host_written_tokens"] += len(node.key)
        return True

    def _host_alloc(self, n: int) -> torch.Tensor | None:
        alloc = self.host_pool.allocator
        if alloc.available_size() < n:
            self.evict_host(n - alloc.available_size())
        return alloc.alloc(n)

    def evict(self, num_tokens: int) -> int:
        """Frees at least num_tokens device slots (if possible) from device leaves in strategy order; a leaf with a
        host copy stays as a host-only node. Returns the device tokens freed."""
        if num_tokens <= 0:
            return 0
        write_back = self.config.write_policy.hit_threshold is None
        loading = False

        def take(node: TreeNode) -> torch.Tensor:
            nonlocal loading
            loading = loading or node.load_epoch == self._load_epoch
            if write_back:
                self._backup(node)
            value, node.value, node.draft_kv_len = node.value, None, 0
            self.evictable_size_ -= len(node.key)
            self.evicted_tokens_total += len(node.key)
            if node.host_value is not None:
                self.host_queue.offer(node)
            else:
                self._delete_subtree(node)
            return value

        evicted, freed = self._evict_from(self.evict_queue, num_tokens, take)
        if freed:
            if loading:  # a load no pass has waited for yet may still write some of these slots: issued, and ordered
                self.issue_loads()
            self.host_pool.flush()  # the backups of these slots are queued on the device before anything reuses them
            if loading:
                self.host_pool.order_after_loads()
            self.token_to_kv_pool_allocator.free(torch.cat(freed))
        return evicted

    def evict_host(self, num_tokens: int) -> int:
        """Frees at least num_tokens host slots (if possible): host-only leaves leave the tree."""

        def take(node: TreeNode) -> torch.Tensor:
            self._delete_subtree(node)
            return node.host_value

        evicted, freed = self._evict_from(self.host_queue, num_tokens, take)
        if freed:
            self.host_pool.allocator.free(torch.cat(freed))
        return evicted

    def _delete_subtree(self, top: TreeNode) -> None:
        """Removes `top` (its device slots already freed) and the host-only nodes below it; frees their host copies
        (top's own host copy, if any, is the caller's to free)."""
        del top.parent.children[top.key.child_key(self.page_size)]
        stack, host = [top], []
        while stack:
            node = stack.pop()
            assert node.value is None and node.lock_ref == 0, "deleting a node still on the device"
            if self.kgram_index is not None:
                self.kgram_index.remove(node)
            node.deleted = True
            if node is not top and node.host_value is not None:
                host.append(node.host_value)
            stack.extend(node.children.values())
        if host:
            self.host_pool.allocator.free(torch.cat(host))

    # ------------------------------------------------------------------ request hooks
    def cache_finished(self, lock: CacheLock, row: int, key: RadixKey, insert: bool = True,
                       draft_kv_len: int = 0) -> None:
        if insert and self.storage is not None:
            self.issue_loads()  # storage reads the request's device rows
            aligned = len(key) // self.storage.page_tokens * self.storage.page_tokens
            if aligned:
                self.storage.write_finished(key[:aligned], self._row_slots(row, aligned))
        super().cache_finished(lock, row, key, insert=insert, draft_kv_len=draft_kv_len)

    # ------------------------------------------------------------------ sizes and checks
    def total_size(self) -> int:
        return sum(len(n.value) for n in self._nodes() if n is not self.root_node and n.value is not None)

    def host_size(self) -> int:
        return sum(len(n.host_value) for n in self._nodes() if n is not self.root_node and n.host_value is not None)

    def all_values_flatten(self) -> torch.Tensor:
        values = [n.value for n in self._nodes() if n is not self.root_node and n.value is not None]
        return torch.cat(values) if values else self._empty()

    def check_consistency(self) -> None:
        """Both tiers: device slots free + held by the tree (evictable, protected) + held by requests == the pool
        (the scheduler's accounting adds the requests'); host slots free + held by the tree == the host pool."""
        check_tiers(self)
