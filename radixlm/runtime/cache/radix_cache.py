"""RadixAttention's prefix cache: a radix tree from token ids to the KV slots that hold their cache.

Edges hold page-aligned runs of tokens; a node's value holds one KV slot per token of its key. The tree owns
the pages of every value in it; a running request pins its matched path with lock_ref so it is not evicted.
Requests with different extra_key (LoRA id, cache salt, ...) live in disjoint subtrees."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch

from radixlm.runtime.cache.eviction import EvictionQueue, get_eviction_strategy
from radixlm.runtime.cache.radix_checks import check_tree
from radixlm.runtime.cache.radix_lookup import KGramIndex
from radixlm.runtime.cache.radix_node import CacheLock, MatchResult, RadixKey, TreeNode

if TYPE_CHECKING:
    from radixlm.runtime.cache.layer_load import LayerLoadWaiter
    from radixlm.runtime.cache.memory_pool import ReqToTokenPool, TokenToKVPoolAllocator

class RadixCache:
    def __init__(
        self,
        req_to_token_pool: "ReqToTokenPool | None",
        token_to_kv_pool_allocator: "TokenToKVPoolAllocator | None",
        page_size: int = 1,
        disable: bool = False,
        eviction_policy: str = "lru",
    ):
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.page_size = page_size
        self.disable = disable
        self.eviction_policy = eviction_policy
        self.eviction_strategy = get_eviction_strategy(eviction_policy)
        allocator = token_to_kv_pool_allocator
        self.device = allocator.device if allocator is not None else torch.device("cpu")
        self._clock = 0
        self.evicted_tokens_total = 0  # since start (not reset by flushes): published for routers
        # Bumped by reset (a flush forgets every node at once); see match_unchanged.
        self.generation = 0
        self._empty_indices = torch.empty((0,), dtype=torch.int64, device=self.device)
        # Where each run of k cached tokens ends (radix_lookup.py); kept only once a draft source asks for it.
        self.kgram_index: KGramIndex | None = None
        self.track_draft_kv = False  # nodes keep draft_kv_len (set by a STANDALONE draft model)
        self.reset()

    def enable_kgram_index(self, k: int) -> KGramIndex:
        """The k-gram index of the cached tokens, kept from now on (one per tree: a second k is refused)."""
        if self.kgram_index is None:
            self.kgram_index = KGramIndex(k)
            for node in self._nodes():  # parents before children: older text first, as inserts would have
                if node is not self.root_node:
                    self.kgram_index.add(node)
        elif self.kgram_index.k != k:
            raise ValueError(f"the tree already keeps a {self.kgram_index.k}-gram index")
        return self.kgram_index

    # ------------------------------------------------------------------ basic tree operations
    def reset(self) -> None:
        """Forgets the tree. It does not free the slots: the caller clears the allocator (flush_cache)."""
        self.root_node = TreeNode(lock_ref=1)  # the root is never evicted
        self.evict_queue = EvictionQueue(self.eviction_strategy)
        self.evictable_size_ = 0
        self.protected_size_ = 0
        self.generation += 1
        if self.kgram_index is not None:
            self.kgram_index.clear()

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _empty(self) -> torch.Tensor:
        return self._empty_indices

    def match_prefix(self, key: RadixKey) -> MatchResult:
        """Longest cached page-aligned prefix of key. A match ending inside a node splits it.

        The caller truncates key to what may be matched: a request never matches its last prompt token
        (it must be recomputed to produce logits), so it passes at most origin_input_ids[:-1]."""
        if self.disable or len(key) < self.page_size:
            return MatchResult([self._empty()], self.root_node, 0)
        key = key.page_aligned(self.page_size)
        ids, extra, ps = key.token_ids, key.extra_key, self.page_size
        length = 0
        now = self._tick()
        node = self.root_node
        node.last_access_time = now
        values: list[torch.Tensor] = []
        touched = None
        while length < len(ids):
            child = node.children.get((extra, tuple(ids[length : length + ps])))
            if child is None:
                break
            child.last_access_time = now
            child.hit_count += 1
            touched = child
            n = child.key.match_at(ids, length, ps)
            length += n
            if n < len(child.key):
                node = self._split_node(child, n)
                values.append(node.value)
                break
            values.append(child.value)
            node = child
        if touched is not None:  # the only node on the path that can be a leaf; its priority moved
            self.evict_queue.offer(touched)
        return MatchResult(values or [self._empty()], node, length)

    def tier_stats(self) -> dict[str, int]:
        """Counters of a hierarchical cache's tiers (tokens written to and loaded from host and storage)."""
        return {}

    def match_and_load(self, key: RadixKey) -> MatchResult:
        """match_prefix for a request being admitted: a hierarchical cache also brings the KV of the match's
        host-only part back to the device. The plain tree has nothing to load."""
        return self.match_prefix(key)

    def take_layer_loads(self) -> "LayerLoadWaiter | None":
        """The per-layer completion of the KV loads issued since the last call, for the next pass to wait on layer
        by layer (a hierarchical cache's host hits); the plain tree loads nothing."""
        return None

    def prefetch_ready(self, key: RadixKey) -> bool:
        """Whether a request whose match reported a storage hit may be admitted now (a hierarchical cache's
        prefetch policy); the plain tree has no storage."""
        return True

    def match_valid(self, node: TreeNode | None) -> bool:
        """Whether a match that ended at `node` may still be locked. The plain tree evicts only after admission; a
        hierarchical one may evict while it loads an earlier request's prefix back."""
        return True

    def match_unchanged(self, last_node: TreeNode, token_ids: list[int], limit: int, extra_key: str | None,
                        matched: int, generation: int) -> bool:
        """Whether match_prefix of token_ids[:limit] would still end at last_node after `matched` tokens, as it did
        in this generation. A match only grows by a child added under its last node (inserts add leaves; a split
        keeps the lower node, and with it the match's end) and only shrinks when its last node is evicted (eviction
        takes leaves: the nodes above a live node stay)."""
        if generation != self.generation or last_node.deleted:
            return False
        if limit - matched < self.page_size:
            return True
        return (extra_key, tuple(token_ids[matched : matched + self.page_size])) not in last_node.children

    def _split_node(self, child: TreeNode, n: int) -> TreeNode:
        """Cuts child after n tokens; returns the new upper node (which takes child's place). A hierarchical cache's
        nodes split their slots on each tier they are on."""
        parent = child.parent
        assert parent is not None and 0 < n < len(child.key)
        new = TreeNode(key=child.key[:n], value=None if child.value is None else child.value[:n], parent=parent,
                       lock_ref=child.lock_ref, last_access_time=child.last_access_time, hit_count=child.hit_count,
                       creation_time=child.creation_time, draft_kv_len=min(child.draft_kv_len, n),
                       host_value=None if child.host_value is None else child.host_value[:n],
                       host_lock=child.host_lock, load_epoch=child.load_epoch)
        child.draft_kv_len = max(child.draft_kv_len - n, 0)
        child.key = child.key[n:]
        if child.value is not None:
            child.value = child.value[n:]
        if child.host_value is not None:
            child.host_value = child.host_value[n:]
        child.parent = new
        new.children[child.key.child_key(self.page_size)] = child
        parent.children[new.key.child_key(self.page_size)] = new
        if self.kgram_index is not None:
            self.kgram_index.split(new, child)
        return new

    def insert(self, key: RadixKey, value: torch.Tensor) -> int:
        """Inserts the page-aligned part of key with its KV slots value (one per token).

        Returns how many tokens were already present; the tree keeps its own slots for those, so the
        caller frees its duplicates value[already_owned_by_caller:returned]."""
        return self._insert(key, value)[0]

    def _insert(self, key: RadixKey, value: torch.Tensor, owned: bool = False,
                draft_kv_len: int = 0) -> tuple[int, TreeNode]:
        """insert(), also returning the node where the inserted key ends. owned: value is the caller's private copy,
        never written again, so the tree may keep a view of it instead of cloning. draft_kv_len: the key's first
        tokens whose draft KV `value`'s slots hold (a new leaf's draft_kv_len; nodes present keep theirs)."""
        if self.disable:
            return 0, self.root_node
        key = key.page_aligned(self.page_size)
        ids, extra, ps = key.token_ids, key.extra_key, self.page_size
        value = value[: len(key)]
        now = self._tick()
        node = self.root_node
        node.last_access_time = now
        present = depth = 0
        while depth < len(ids):
            child = node.children.get((extra, tuple(ids[depth : depth + ps])))
            if child is None:
                break
            child.last_access_time = now
            n = child.key.match_at(ids, depth, ps)
            if n < len(child.key):
                lower, child = child, self._split_node(child, n)
                self._requeue(lower)
            present += self._on_path(child, value[depth : depth + n], owned, draft_kv_len - depth)
            depth += n
            node = child
        if depth < len(ids):
            node = self._add_leaf(node, key[depth:], value[depth:], owned, now, draft_kv_len - depth)
        self.evict_queue.offer(node)
        return present, node

    def _requeue(self, lower: TreeNode) -> None:
        """A split left `lower` (a leaf, maybe) under a new node: its eviction queue entry moves."""
        self.evict_queue.offer(lower)

    def _on_path(self, node: TreeNode, value: torch.Tensor, owned: bool, draft_kv_len: int) -> int:
        """An insert passes `node`, whose tokens `value`'s slots also hold: how many of them the tree already holds
        (the caller frees its duplicates). Every one here; a hierarchical cache's host-only node adopts the slots."""
        return len(value)

    def _add_leaf(self, parent: TreeNode, key: RadixKey, value: torch.Tensor, owned: bool, now: int,
                  draft_kv_len: int) -> TreeNode:
        """A new leaf under parent holding key's KV slots (a copy of value unless owned); draft_kv_len: how many of
        its leading rows the draft model's KV also covers."""
        leaf = TreeNode(key=key, value=value if owned else value.clone(), parent=parent, last_access_time=now,
                        creation_time=now, draft_kv_len=min(max(draft_kv_len, 0), len(key)))
        parent.children[key.child_key(self.page_size)] = leaf
        self.evictable_size_ += len(key)
        if self.kgram_index is not None:
            self.kgram_index.add(leaf)
        return leaf

    # ------------------------------------------------------------------ locking and eviction
    def inc_lock_ref(self, node: TreeNode) -> int:
        """Pins node and its ancestors. Returns the change of evictable_size() (<= 0)."""
        if self.disable:
            return 0
        delta = 0
        while node is not self.root_node:
            if node.lock_ref == 0:
                self.evictable_size_ -= len(node.key)
                self.protected_size_ += len(node.key)
                delta -= len(node.key)
            node.lock_ref += 1
            node = node.parent
        return delta

    def dec_lock_ref(self, node: TreeNode) -> int:
        """Unpins node and its ancestors. Returns the change of evictable_size() (>= 0)."""
        if self.disable:
            return 0
        delta = 0
        while node is not self.root_node:
            if node.lock_ref == 1:
                self.evictable_size_ += len(node.key)
                self.protected_size_ -= len(node.key)
                delta += len(node.key)
            assert node.lock_ref > 0, "dec_lock_ref below zero"
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.evict_queue.offer(node)
            node = node.parent
        return delta

    def _nodes(self) -> list[TreeNode]:
        out, stack = [], [self.root_node]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def evict(self, num_tokens: int) -> int:
        """Frees at least num_tokens tokens (if possible) from unlocked leaves in strategy order, cascading to
        parents that become unlocked leaves. Returns the number of tokens evicted."""
        if self.disable or num_tokens <= 0:
            return 0
        evicted, freed = self._evict_from(self.evict_queue, num_tokens, self._evict_leaf)
        if freed:
            self.token_to_kv_pool_allocator.free(torch.cat(freed))  # one free: each one copies the free list
        return evicted

    def _evict_from(self, queue: EvictionQueue, num_tokens: int,
                    take: Callable[[TreeNode], torch.Tensor]) -> tuple[int, list[torch.Tensor]]:
        """Pops queue's leaves in strategy order until num_tokens are freed, each parent offered after its child (it
        may have become a leaf); take(node) takes a node off the tier and returns the slots it frees. Returns the
        tokens freed and their slots (for one free: each one copies the free list)."""
        queue.maybe_rebuild(self._nodes)
        evicted = 0
        freed: list[torch.Tensor] = []
        while evicted < num_tokens:
            node = queue.pop()
            if node is None:
                break
            freed.append(take(node))
            evicted += len(node.key)
            queue.offer(node.parent)
        return evicted, freed

    def _evict_leaf(self, node: TreeNode) -> torch.Tensor:
        self._delete_leaf(node)
        self.evicted_tokens_total += len(node.key)
        return node.value

    def _delete_leaf(self, node: TreeNode) -> None:
        if self.kgram_index is not None:
            self.kgram_index.remove(node)
        del node.parent.children[node.key.child_key(self.page_size)]
        node.deleted = True
        self.evictable_size_ -= len(node.key)

    # ------------------------------------------------------------------ sizes and debugging
    def evictable_size(self) -> int:
        return self.evictable_size_

    def protected_size(self) -> int:
        return self.protected_size_

    def total_size(self) -> int:
        """Tokens held by the tree, recounted from the nodes."""
        return sum(len(n.value) for n in self._nodes() if n is not self.root_node)

    def all_values_flatten(self) -> torch.Tensor:
        values = [n.value for n in self._nodes() if n is not self.root_node]
        return torch.cat(values) if values else self._empty()

    def check_consistency(self) -> None:
        """Recomputes sizes and structure from the tree; raises AssertionError on any mismatch."""
        check_tree(self)

    def pretty_print(self) -> str:
        lines: list[str] = []

        def walk(node: TreeNode, depth: int) -> None:
            for child in node.children.values():
                toks = child.key.token_ids
                shown = toks if len(toks) <= 12 else toks[:12] + ["..."]
                ns = f" [{child.key.extra_key}]" if child.key.extra_key is not None else ""
                lines.append(f"{'  ' * depth}{shown}{ns} len={len(toks)} lock={child.lock_ref}")
                walk(child, depth + 1)

        walk(self.root_node, 0)
        lines.append(f"#tokens: {self.total_size()} evictable={self.evictable_size_} protected={self.protected_size_}")
        text = "\n".join(lines)
        print(text)
        return text

    # ------------------------------------------------------------------ request hooks (scheduler)
    # A request's row req_to_token[row, :len(key)] holds the KV slots of `key`'s tokens; the request owns no page
    # beyond the one holding its last position: the hooks free only the pages of [protected_len, len(key)).
    def lock(self, node: TreeNode, protected_len: int) -> tuple[CacheLock, int]:
        """Pins a matched path for a request admitted with its first protected_len slots from the tree. Also returns
        the change of evictable_size() (<= 0)."""
        return CacheLock(node, protected_len), self.inc_lock_ref(node)

    def unlock(self, lock: CacheLock) -> int:
        """Undoes lock (an admission that did not happen); returns the change of evictable_size() (>= 0)."""
        return self.dec_lock_ref(lock.node)

    def _row_slots(self, row: int, n: int) -> torch.Tensor:
        return self.req_to_token_pool.req_to_token[row, :n].clone()

    def cache_finished(self, lock: CacheLock, row: int, key: RadixKey, insert: bool = True,
                       draft_kv_len: int = 0) -> None:
        """Hands every slot of a finished (insert) or aborted/retracted (not insert) request to the tree or back to
        the allocator, unpins its path and frees its req_to_token row. draft_kv_len: as _insert's."""
        kv_indices = self._row_slots(row, len(key))
        free = self.token_to_kv_pool_allocator.free
        if insert and not self.disable:
            aligned = len(key) // self.page_size * self.page_size
            present, _ = self._insert(key[:aligned], kv_indices[:aligned], owned=True, draft_kv_len=draft_kv_len)
            assert present >= lock.protected_len, "the request's locked prefix left the tree"
            # [0, protected_len) already are the tree's slots; the rest up to `present` are duplicates.
            free(kv_indices[lock.protected_len : present])
            free(kv_indices[aligned:])
        else:
            free(kv_indices[lock.protected_len :])
        self.dec_lock_ref(lock.node)
        self.req_to_token_pool.free(row)

    def cache_unfinished(self, lock: CacheLock, row: int, key: RadixKey, draft_kv_len: int = 0) -> CacheLock:
        """After a prefill chunk: makes the aligned part of `key` shareable, points the request's row at the tree's
        slots and moves its lock to the deeper node. draft_kv_len: as _insert's."""
        if self.disable:
            return lock
        kv_indices = self._row_slots(row, len(key))
        aligned = len(key) // self.page_size * self.page_size
        present, new_last_node = self._insert(key[:aligned], kv_indices[:aligned], owned=True,
                                              draft_kv_len=draft_kv_len)
        assert present >= lock.protected_len, "the request's locked prefix left the tree"
        start = lock.protected_len
        if present > start:
            # Another request cached [start, present) meanwhile: use the tree's slots, free ours.
            self.token_to_kv_pool_allocator.free(kv_indices[start:present])
            match = self.match_prefix(key[:aligned])
            new_indices, new_last_node = match.device_indices, match.last_node
            assert len(new_indices) == aligned, "re-match after insert must cover the inserted key"
            self.req_to_token_pool.req_to_token[row, start:aligned] = new_indices[start:]
        self.inc_lock_ref(new_last_node)
        self.dec_lock_ref(lock.node)
        return CacheLock(new_last_node, aligned)
