"""Read-only lookups in the radix tree for draft sources (scheduler/drafts/radix.py): what the tree holds after a
request's tokens. Nothing here copies the tree, takes or releases a lock, or touches what eviction reads
(last_access_time, hit_count, the eviction queue): a lookup reads keys and children and returns token ids, never a
node to hold on to. Every lookup runs on the scheduler's thread, between tree operations, so it never sees a node
half evicted; a node evicted since it was remembered has `deleted` set and is not read.

Two lookups:

- `follow` (the request's whole sequence): walks down from the deepest node known to lie on the request's path
  (a PathCursor the caller keeps per request) along its new tokens. When the tree holds the whole sequence --
  an earlier request with the same prompt answered, a fork branch, a retried agent step -- the continuation is
  what followed exactly this context. A step costs one child lookup per node entered and a comparison of the
  tokens appended since the last step (the cursor remembers how far the child it is inside agrees).
- `KGramIndex` (the latest k tokens, anywhere): for every cached position, the k tokens ending there (within one
  extra_key namespace) -> where they end in the tree, the latest inserted occurrence winning. It finds text that
  earlier requests produced in another context (a quoted answer, the same question under another system prompt).
  Maintained by the tree only when a source asked for it (enable_kgram_index): a new leaf adds its positions,
  an evicted node removes its own, a flush clears it. Splits cost nothing: an entry names the node that held the
  position when it was indexed and how many of that node's tokens follow it; a split keeps the old node as the
  lower part (the end of its key does not move), so an entry whose position moved into the new upper node is
  found by walking up parents while the count reaches past the node's key (`_resolve`). An evicted node keeps its
  parent pointer, so entries naming it still resolve to live ancestors (they are removed with those ancestors).
  One entry per k-gram: when its latest occurrence is evicted, the k-gram is forgotten until it is inserted
  again, even where an older occurrence survives (under LRU the latest text rarely goes first; a multi-entry
  index would cost memory for every repetition). Memory: at most one dict entry per cached token (about 150
  bytes in CPython), only with a RADIX source on.

Continuations go down the most recently used child (read, not updated), at most MAX_FANOUT children looked at per
node; a draft costs O(draft length + nodes entered x fan-out)."""
from __future__ import annotations

from dataclasses import dataclass
from itertools import repeat
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixlm.runtime.cache.radix_cache import RadixCache
    from radixlm.runtime.cache.radix_node import TreeNode

# A continuation (or a partial page) choosing among more children than this stops there: no choice is evidence.
MAX_FANOUT = 16

Entry = tuple["TreeNode", int]  # (node that held the position when indexed, tokens of it after the k-gram)


def tokens_after(node: "TreeNode", offset: int, n: int) -> list[int]:
    """Up to n tokens the tree holds after position `offset` of node's key: the rest of its key, then down the most
    recently used child (a node with more than MAX_FANOUT children ends the continuation)."""
    out = node.key.token_ids[offset : offset + n]
    while len(out) < n and node.children and len(node.children) <= MAX_FANOUT:
        node = max(node.children.values(), key=_recency)
        out += node.key.token_ids[: n - len(out)]
    return out


def _recency(node: "TreeNode") -> tuple[int, int]:
    return node.last_access_time, node.id


# ---------------------------------------------------------------------------------------------- the whole sequence
@dataclass
class PathCursor:
    """How far a request's sequence is known to lie in the tree: `node` (not evicted) ends at position `depth` of the
    sequence, and the next `agreed` tokens agree with the first tokens of `child` (key length `child_len` when it
    was compared: a split shortens it and changes its parent, either of which invalidates what is known of it);
    `left`: the sequence leaves the tree inside `child` (it stays left while `child` is unchanged: tokens on a
    path never change, and a new branch with the same first page would split `child`)."""

    node: "TreeNode"
    depth: int
    generation: int
    child: "TreeNode | None" = None
    child_len: int = 0
    agreed: int = 0
    left: bool = False

    def valid(self, tree: "RadixCache") -> bool:
        return self.generation == tree.generation and not self.node.deleted


def start_cursor(tree: "RadixCache") -> PathCursor:
    return PathCursor(tree.root_node, 0, tree.generation)


def follow(tree: "RadixCache", cur: PathCursor, token_ids: list[int], extra_key: str | None
           ) -> tuple["TreeNode", int] | None:
    """Where token_ids (which extend the ones `cur` was made for) end in the tree, as (node, offset): the tree's
    continuation is node.key[offset:] and below; None when token_ids leave the tree. Advances `cur`."""
    ps, n = tree.page_size, len(token_ids)
    while True:
        node, depth = cur.node, cur.depth
        if depth == n:
            return node, len(node.key)
        rest = n - depth
        child = cur.child
        if child is None or child.deleted or child.parent is not node or len(child.key) != cur.child_len:
            if rest < ps:  # the sequence ends inside the child's first page: no child is keyed by it
                child = _partial_child(node, token_ids[depth:], extra_key)
                cur.child = None  # (another child may match once more tokens come)
                return None if child is None else (child, rest)
            child = node.children.get((extra_key, tuple(token_ids[depth : depth + ps])))
            if child is None:
                cur.child = None
                return None
            cur.child, cur.child_len, cur.agreed, cur.left = child, len(child.key), 0, False
        elif cur.left:
            return None
        key = child.key.token_ids
        m = min(len(key), rest)
        a = cur.agreed
        if a < m:
            if key[a:m] != token_ids[depth + a : depth + m]:
                cur.left = True
                return None
            cur.agreed = m
        if m < len(key):
            return child, m
        cur.node, cur.depth, cur.child = child, depth + m, None


def _partial_child(node: "TreeNode", rest: list[int], extra_key: str | None) -> "TreeNode | None":
    """The child whose key starts with `rest`, shorter than a page (keys are page-aligned, children keyed by their
    first page): the most recently used of those that do."""
    if len(node.children) > MAX_FANOUT:
        return None
    k = len(rest)
    found = [c for c in node.children.values() if c.key.extra_key == extra_key and c.key.token_ids[:k] == rest]
    return max(found, key=_recency) if found else None


# ---------------------------------------------------------------------------------------------- the latest k tokens
class KGramIndex:
    """(extra_key, the k tokens ending at a cached position) -> where they end in the tree (see the module
    docstring). Kept by RadixCache: add(leaf) when a leaf is inserted, remove(node) before a node is evicted,
    clear() on a flush."""

    def __init__(self, k: int):
        self.k = k
        self._maps: dict[str | None, dict[tuple[int, ...], Entry]] = {}

    def __len__(self) -> int:
        return sum(len(m) for m in self._maps.values())

    def clear(self) -> None:
        self._maps.clear()

    def add(self, leaf: "TreeNode") -> None:
        grams, first = self._grams(leaf)
        if first >= 0:
            m = self._maps.setdefault(leaf.key.extra_key, {})
            m.update(zip(grams, zip(repeat(leaf), range(first, -1, -1))))

    def remove(self, node: "TreeNode") -> None:
        """Before node is evicted (its parent chain still in place): drops the entries that resolve into it."""
        m = self._maps.get(node.key.extra_key)
        if m is None:
            return
        grams, first = self._grams(node)
        for gram in grams if first >= 0 else ():
            entry = m.get(gram)
            if entry is not None and self._resolve(entry)[0] is node:
                del m[gram]
        if not m:
            del self._maps[node.key.extra_key]

    def find(self, extra_key: str | None, token_ids: list[int]) -> tuple["TreeNode", int] | None:
        """Where the latest cached occurrence of token_ids[-k:] ends, as (node, offset): its continuation is
        node.key[offset:] and below."""
        m = self._maps.get(extra_key)
        if m is None or len(token_ids) < self.k:
            return None
        gram = tuple(token_ids[-self.k :])
        entry = m.get(gram)
        if entry is None:
            return None
        node, after = self._resolve(entry)
        if node.deleted:  # not reached while remove runs before every eviction; never read a freed node
            del m[gram]
            return None
        return node, len(node.key) - after

    @staticmethod
    def _resolve(entry: Entry) -> Entry:
        """The node holding the entry's position now: splits since it was indexed moved it into upper nodes."""
        node, after = entry
        while after >= len(node.key) and node.parent is not None:
            after -= len(node.key)
            node = node.parent
        return node, after

    def _grams(self, node: "TreeNode"):
        """The k-grams ending inside node's key (their first tokens may lie in ancestors), in order, and how many of
        node's tokens follow the first of them (the next ones: one fewer each, down to 0); -1 when none."""
        k = self.k
        key = node.key.token_ids
        ctx: list[int] = []
        need, p = k - 1, node.parent
        while need > 0 and p is not None and p.parent is not None:
            toks = p.key.token_ids
            part = toks[-need:] if need < len(toks) else toks
            ctx = part + ctx
            need -= len(part)
            p = p.parent
        seq = ctx + key if ctx else key
        count = len(seq) - k + 1
        if count <= 0:
            return iter(()), -1
        return zip(*(seq[i : i + count] for i in range(k))), count - 1
