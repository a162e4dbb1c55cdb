"""RadixAttention's prefix cache: a radix tree from token ids to the KV slots that hold their cache.

Edges hold page-aligned runs of tokens; a node's value holds one KV slot per token of its key. The tree owns
the pages of every value in it; a running request pins its matched path with lock_ref so it is not evicted.
Requests with different extra_key (LoRA id, cache salt, ...) live in disjoint subtrees."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch

from radixlm.runtime.cache.eviction import EvictionQueue, get_eviction_strategy

if TYPE_CHECKING:
    from radixlm.runtime.cache.memory_pool import ReqToTokenPool, TokenToKVPoolAllocator

ChildKey = tuple  # (extra_key, first page of tokens as a tuple)


@dataclass
class RadixKey:
    token_ids: list[int]
    extra_key: str | None = None

    def __len__(self) -> int:
        return len(self.token_ids)

    def __getitem__(self, s: slice) -> "RadixKey":
        return RadixKey(self.token_ids[s], self.extra_key)

    def page_aligned(self, page_size: int) -> "RadixKey":
        n = len(self) // page_size * page_size
        return self if n == len(self) else self[:n]

    def child_key(self, page_size: int) -> ChildKey:
        return (self.extra_key, tuple(self.token_ids[:page_size]))

    def match(self, other: "RadixKey", page_size: int) -> int:
        """Common-prefix length, rounded down to a page."""
        if self.extra_key != other.extra_key:
            raise ValueError("cannot match keys of different extra_key namespaces")
        a, b = self.token_ids, other.token_ids
        n = min(len(a), len(b))
        if a[:n] != b[:n]:  # else the whole shorter key matches (one C-level comparison)
            n = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
        return n // page_size * page_size


_node_ids = itertools.count()


@dataclass(eq=False)
class TreeNode:
    key: RadixKey = field(default_factory=lambda: RadixKey([]))
    value: torch.Tensor | None = None  # int64 KV slots, len(value) == len(key)
    parent: "TreeNode | None" = None
    children: dict[ChildKey, "TreeNode"] = field(default_factory=dict)
    # lock_ref counts running requests whose matched path passes through (or ends at) this node.
    lock_ref: int = 0
    last_access_time: int = 0  # logical clock of the cache, strictly increasing per operation
    hit_count: int = 0
    creation_time: int = 0
    id: int = field(default_factory=lambda: next(_node_ids))
    deleted: bool = False  # evicted (stale references, e.g. in the eviction queue, must not use it)

    def is_leaf(self) -> bool:
        return not self.children


@dataclass
class MatchResult:
    values: list[torch.Tensor]  # the matched nodes' KV slots, in order (at least one tensor, maybe empty)
    last_node: TreeNode  # deepest matched node (the root when nothing matched)
    length: int  # tokens matched
    _indices: torch.Tensor | None = None

    @property
    def device_indices(self) -> torch.Tensor:
        """int64 KV slots of the matched prefix, concatenated at first use (ordering the waiting queue needs only
        `length`; on a GPU the concatenation is a device operation)."""
        if self._indices is None:
            self._indices = torch.cat(self.values)
        return self._indices


class CacheableReq(Protocol):
    """What the cache reads and writes on a scheduler request.

    req_to_token[req_pool_idx, :kv_committed_len] holds the KV slots of (origin_input_ids + output_ids)[:n];
    slots [0, cache_protected_len) are the tree's (pinned via last_node), the rest the request's own pages.
    The request must own no page beyond the one holding position kv_committed_len - 1: the cache frees
    only the pages of positions [cache_protected_len, kv_committed_len)."""

    req_pool_idx: int
    origin_input_ids: list[int]
    output_ids: list[int]
    kv_committed_len: int
    extra_key: str | None
    prefix_indices: torch.Tensor
    last_node: TreeNode
    cache_protected_len: int


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
        self.reset()

    # ------------------------------------------------------------------ basic tree operations
    def reset(self) -> None:
        """Forgets the tree. It does not free the slots: the caller clears the allocator (flush_cache)."""
        self.root_node = TreeNode(lock_ref=1)  # the root is never evicted
        self.evict_queue = EvictionQueue(self.eviction_strategy)
        self.evictable_size_ = 0
        self.protected_size_ = 0
        self.generation += 1

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
        length = 0
        now = self._tick()
        node = self.root_node
        node.last_access_time = now
        values: list[torch.Tensor] = []
        touched = None
        while len(key) > 0:
            child = node.children.get(key.child_key(self.page_size))
            if child is None:
                break
            child.last_access_time = now
            child.hit_count += 1
            touched = child
            n = child.key.match(key, self.page_size)
            length += n
            if n < len(child.key):
                node = self._split_node(child, n)
                values.append(node.value)
                break
            values.append(child.value)
            node = child
            key = key[n:]
        if touched is not None:  # the only node on the path that can be a leaf; its priority moved
            self.evict_queue.offer(touched)
        return MatchResult(values or [self._empty()], node, length)

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
        """Cuts child after n tokens; returns the new upper node (which takes child's place)."""
        parent = child.parent
        assert parent is not None and 0 < n < len(child.key)
        new = TreeNode(
            key=child.key[:n],
            value=child.value[:n],
            parent=parent,
            lock_ref=child.lock_ref,
            last_access_time=child.last_access_time,
            hit_count=child.hit_count,
            creation_time=child.creation_time,
        )
        child.key = child.key[n:]
        child.value = child.value[n:]
        child.parent = new
        new.children[child.key.child_key(self.page_size)] = child
        parent.children[new.key.child_key(self.page_size)] = new
        return new

    def insert(self, key: RadixKey, value: torch.Tensor) -> int:
        """Inserts the page-aligned part of key with its KV slots value (one per token).

        Returns how many tokens were already present; the tree keeps its own slots for those, so the
        caller frees its duplicates value[already_owned_by_caller:returned]."""
        return self._insert(key, value)[0]

    def _insert(self, key: RadixKey, value: torch.Tensor, owned: bool = False) -> tuple[int, TreeNode]:
        """insert(), also returning the node where the inserted key ends. owned: value is the caller's private copy,
        never written again, so the tree may keep a view of it instead of cloning."""
        if self.disable:
            return 0, self.root_node
        key = key.page_aligned(self.page_size)
        value = value[: len(key)]
        now = self._tick()
        node = self.root_node
        node.last_access_time = now
        present = 0
        while len(key) > 0:
            child = node.children.get(key.child_key(self.page_size))
            if child is None:
                break
            child.last_access_time = now
            n = child.key.match(key, self.page_size)
            if n < len(child.key):
                lower, child = child, self._split_node(child, n)
                self.evict_queue.offer(lower)
            present += n
            key, value = key[n:], value[n:]
            node = child
        if len(key) > 0:
            leaf = TreeNode(key=key, value=value if owned else value.clone(), parent=node, last_access_time=now,
                            creation_time=now)
            node.children[key.child_key(self.page_size)] = leaf
            self.evictable_size_ += len(key)
            node = leaf
        self.evict_queue.offer(node)
        return present, node

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
        queue = self.evict_queue
        queue.maybe_rebuild(self._nodes)
        evicted = 0
        freed: list[torch.Tensor] = []
        while evicted < num_tokens:
            node = queue.pop()
            if node is None:
                break
            freed.append(node.value)
            evicted += len(node.key)
            self._delete_leaf(node)
            self.evicted_tokens_total += len(node.key)
            queue.offer(node.parent)  # it may have become a leaf
        if freed:
            self.token_to_kv_pool_allocator.free(torch.cat(freed))  # one free: each one copies the free list
        return evicted

    def _delete_leaf(self, node: TreeNode) -> None:
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
        evictable = protected = 0
        for node in self._nodes():
            child_locks = 0
            for ck, child in node.children.items():
                assert child.parent is node, "child.parent is not its parent"
                assert ck == child.key.child_key(self.page_size), "child stored under the wrong key"
                if node is not self.root_node:
                    assert child.key.extra_key == node.key.extra_key, "extra_key namespaces mixed"
                child_locks += child.lock_ref
            if node is self.root_node:
                continue
            assert len(node.key) > 0 and len(node.key) % self.page_size == 0, "node key not page aligned"
            assert node.value is not None and len(node.value) == len(node.key), "value/key length mismatch"
            assert node.lock_ref >= child_locks, "lock_ref smaller than the locks below it"
            if node.lock_ref == 0:
                evictable += len(node.key)
            else:
                protected += len(node.key)
        assert evictable == self.evictable_size_, f"evictable {self.evictable_size_} != recount {evictable}"
        queued = self.evict_queue.queued()
        assert all(n.id in queued for n in self._nodes() if n is not self.root_node and n.is_leaf() and n.lock_ref == 0), \
            "an unlocked leaf is missing from the eviction queue"
        assert protected == self.protected_size_, f"protected {self.protected_size_} != recount {protected}"
        values = self.all_values_flatten()
        assert torch.unique(values).numel() == values.numel(), "a KV slot is held by two nodes"
        allocator = self.token_to_kv_pool_allocator
        if allocator is not None and values.numel():
            pages = values // self.page_size
            assert not bool(allocator.page_is_free[pages].any()), "the tree holds a freed page"

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
    def _committed(self, req: CacheableReq) -> tuple[list[int], torch.Tensor]:
        n = req.kv_committed_len
        token_ids = (list(req.origin_input_ids) + list(req.output_ids))[:n]
        kv_indices = self.req_to_token_pool.req_to_token[req.req_pool_idx, :n].clone()
        return token_ids, kv_indices

    def cache_finished_req(self, req: CacheableReq, is_insert: bool = True) -> None:
        """Hands every slot of a finished (is_insert) or aborted/retracted (not is_insert) request to the tree
        or back to the allocator, unpins its path and frees its req_to_token row."""
        token_ids, kv_indices = self._committed(req)
        free = self.token_to_kv_pool_allocator.free
        if is_insert and not self.disable:
            aligned = len(token_ids) // self.page_size * self.page_size
            present, _ = self._insert(RadixKey(token_ids[:aligned], req.extra_key), kv_indices[:aligned], owned=True)
            assert present >= req.cache_protected_len, "the request's locked prefix left the tree"
            # [0, cache_protected_len) already are the tree's slots; the rest up to `present` are duplicates.
            free(kv_indices[req.cache_protected_len : present])
            free(kv_indices[aligned:])
        else:
            free(kv_indices[req.cache_protected_len :])
        self.dec_lock_ref(req.last_node)
        self.req_to_token_pool.free(req.req_pool_idx)

    def cache_unfinished_req(self, req: CacheableReq) -> None:
        """After a prefill chunk: makes the committed aligned tokens shareable, then points the request at the
        tree's slots and moves its lock to the deeper node."""
        token_ids, kv_indices = self._committed(req)
        if self.disable:
            req.prefix_indices = kv_indices
            return
        aligned = len(token_ids) // self.page_size * self.page_size
        key = RadixKey(token_ids[:aligned], req.extra_key)
        present, new_last_node = self._insert(key, kv_indices[:aligned], owned=True)
        assert present >= req.cache_protected_len, "the request's locked prefix left the tree"
        start = req.cache_protected_len
        if present > start:
            # Another request cached [start, present) meanwhile: use the tree's slots, free ours.
            self.token_to_kv_pool_allocator.free(kv_indices[start:present])
            match = self.match_prefix(key)
            new_indices, new_last_node = match.device_indices, match.last_node
            assert len(new_indices) == aligned, "re-match after insert must cover the inserted key"
            self.req_to_token_pool.req_to_token[req.req_pool_idx, start:aligned] = new_indices[start:]
        else:  # the tree now holds exactly the request's own slots
            new_indices = kv_indices[:aligned]
        self.inc_lock_ref(new_last_node)
        self.dec_lock_ref(req.last_node)
        req.prefix_indices = new_indices if aligned == len(kv_indices) else torch.cat([new_indices, kv_indices[aligned:]])
        req.cache_protected_len = aligned
        req.last_node = new_last_node
