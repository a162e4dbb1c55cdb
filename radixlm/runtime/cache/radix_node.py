"""The radix tree's data: keys (token ids in an extra_key namespace), nodes, match results, and the lock a request
holds on a matched path."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

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

    def match_at(self, ids: list[int], start: int, page_size: int) -> int:
        """match() against the tokens ids[start:] of a key in this key's extra_key namespace, without copying them
        (a walk down the tree compares each node's tokens once, not the rest of the key at every node)."""
        a = self.token_ids
        n = min(len(a), len(ids) - start)
        if (a if n == len(a) else a[:n]) != ids[start : start + n]:
            n = next(i for i in range(n) if a[i] != ids[start + i])
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
    # NOTE invariant (STANDALONE, RadixCache.track_draft_kv): the draft model's pool holds the draft KV of this
    # node's first draft_kv_len tokens at their slots; the rest were written while its passes were skipped.
    draft_kv_len: int = 0
    # Hierarchical cache (cache/hicache/): the node's slots in the host pool, or None. A node with value None and a
    # host_value is host-only (its KV left the device); host_lock > 0 while its KV is being copied between tiers.
    host_value: torch.Tensor | None = None
    host_lock: int = 0
    # The host pool's load epoch in which the node's device slots were loaded (HiRadixCache: a load a pass has not
    # yet waited for may still be writing them); 0 if never.
    load_epoch: int = 0

    def is_leaf(self) -> bool:
        return not self.children


def path_to(node: TreeNode) -> list[TreeNode]:
    """The nodes from below the root down to `node`."""
    path = []
    while node.parent is not None:
        path.append(node)
        node = node.parent
    return path[::-1]


def draft_kv_prefix(node: TreeNode) -> int:
    """Tokens of the path to `node` from its start whose draft KV is valid (up to its first node lacking some)."""
    n = 0
    for step in path_to(node):
        n += step.draft_kv_len
        if step.draft_kv_len < len(step.key):
            break
    return n


def mark_draft_kv(node: TreeNode, n: int) -> None:
    """The draft KV of the path's first n tokens was written (a request caught up over the tree's slots)."""
    start = 0
    for step in path_to(node):
        if start >= n:
            break
        step.draft_kv_len = max(step.draft_kv_len, min(n - start, len(step.key)))
        start += len(step.key)


@dataclass
class MatchResult:
    values: list[torch.Tensor]  # the matched nodes' KV slots, in order (at least one tensor, maybe empty)
    last_node: TreeNode  # deepest matched node (the root when nothing matched)
    length: int  # tokens matched
    _indices: torch.Tensor | None = None
    # Hierarchical cache: tokens matched past `length` whose KV is only in the host pool (load_back brings them).
    host_hit_length: int = 0
    storage_hit: bool = False  # and storage is reading pages past the match (admission takes them)

    @property
    def device_indices(self) -> torch.Tensor:
        """int64 KV slots of the matched prefix, concatenated at first use (ordering the waiting queue needs only
        `length`; on a GPU the concatenation is a device operation)."""
        if self._indices is None:
            self._indices = torch.cat(self.values)
        return self._indices


@dataclass(frozen=True)
class CacheLock:
    """What one request holds in the tree: handed out by RadixCache.lock and cache_unfinished, given back to
    cache_finished. The pinned path ends at `node`; slots [0, protected_len) of the request's req_to_token row are
    the tree's, the rest are the request's own pages."""

    node: TreeNode
    protected_len: int
