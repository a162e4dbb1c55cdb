"""Read-only lookups in the radix tree for draft sources (spec/sources/radix.py): what the tree holds after a
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
  A lookup is one dict lookup and a check of the k tokens (keys are hashes). Maintained by the tree only when a
  source asked for it (enable_kgram_index): a new leaf adds its positions, a split moves the positions of the new
  upper node to it, an evicted node removes its own, a flush clears it; so every entry names the node that holds
  its position. Keys and values are ints (hash of the k tokens; node id << 32 | tokens of the node after them),
  which the garbage collector does not track: a full collection does not walk the index (tuples per cached token
  made a full collection take ~90 ms per million cached tokens, ints ~8 ms). One entry per k-gram: when its
  latest occurrence is evicted, the k-gram is forgotten until it is inserted again, even where an older
  occurrence survives (under LRU the latest text rarely goes first; a multi-entry index would cost memory for
  every repetition). Costs: at most one dict entry per cached token (~100 bytes); ~0.4 us of host time per token
  inserted, split (the upper part) or evicted.

Continuations go down the most recently used child (read, not updated), at most MAX_FANOUT children looked at per
node; a draft costs O(draft length + nodes entered x fan-out)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixlm.runtime.cache.radix_cache import RadixCache
    from radixlm.runtime.cache.radix_node import TreeNode

# A continuation (or a partial page) choosing among more children than this stops there: no choice is evidence.
MAX_FANOUT = 16

_LOW = (1 << 32) - 1  # an entry: node id << 32 | how many of the node's tokens follow the k-gram


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
    """hash(k tokens ending at a cached position) -> where they end in the tree, per extra_key namespace (see the
    module docstring). Kept by RadixCache: add(leaf) when a leaf is inserted, split(upper, lower) when a node is
    cut, remove(node) before a node is evicted, clear() on a flush."""

    def __init__(self, k: int):
        self.k = k
        self._maps: dict[str | None, dict[int, int]] = {}
        self._nodes: dict[int, "TreeNode"] = {}  # id -> node, for the nodes entries may name

    def __len__(self) -> int:
        return sum(len(m) for m in self._maps.values())

    def clear(self) -> None:
        self._maps.clear()
        self._nodes.clear()

    def add(self, leaf: "TreeNode") -> None:
        keys, first = self._keys(leaf)
        if first >= 0:
            base = leaf.id << 32
            self._maps.setdefault(leaf.key.extra_key, {}).update(zip(keys, range(base + first, base - 1, -1)))
        self._nodes[leaf.id] = leaf

    def split(self, upper: "TreeNode", lower: "TreeNode") -> None:
        """`lower` (the node that was cut, now its end) lost its first tokens to the new `upper`: entries of those
        positions now name `upper`."""
        self._nodes[upper.id] = upper
        m = self._maps.get(upper.key.extra_key)
        if m is None:
            return
        keys, first = self._keys(upper)
        if first < 0:
            return
        old, new, get = (lower.id << 32) + len(lower.key), upper.id << 32, m.get
        for key, after in zip(keys, range(first, -1, -1)):
            if get(key) == old + after:
                m[key] = new + after

    def remove(self, node: "TreeNode") -> None:
        """Before node is evicted: drops the entries that name it."""
        self._nodes.pop(node.id, None)
        m = self._maps.get(node.key.extra_key)
        if m is None:
            return
        keys, first = self._keys(node)
        if first >= 0:
            base, get = node.id << 32, m.get
            for key, after in zip(keys, range(first, -1, -1)):
                if get(key) == base + after:
                    del m[key]
        if not m:
            del self._maps[node.key.extra_key]

    def find(self, extra_key: str | None, token_ids: list[int]) -> tuple["TreeNode", int] | None:
        """Where the latest cached occurrence of token_ids[-k:] ends, as (node, offset): its continuation is
        node.key[offset:] and below."""
        k = self.k
        m = self._maps.get(extra_key)
        if m is None or len(token_ids) < k:
            return None
        gram = token_ids[-k:]
        entry = m.get(hash(tuple(gram)))
        if entry is None:
            return None
        node = self._nodes.get(entry >> 32)
        if node is None or node.deleted:  # not reached while remove runs before every eviction
            return None
        offset = len(node.key) - (entry & _LOW)
        if _tokens_before(node, offset, k) != gram:
            return None  # another k-gram with the same hash
        return node, offset

    def entries(self):
        """(extra_key, key, node, offset) of every entry (for checks)."""
        for ns, m in self._maps.items():
            for key, entry in m.items():
                node = self._nodes.get(entry >> 32)
                yield ns, key, node, None if node is None else len(node.key) - (entry & _LOW)

    def _keys(self, node: "TreeNode"):
        """Hashes of the k-grams ending inside node's key (their first tokens may lie in ancestors), in order, and
        how many of node's tokens follow the first of them (the next ones: one fewer each, down to 0); -1 when
        none."""
        k = self.k
        key = node.key.token_ids
        ctx = _tokens_before(node, 0, k - 1) if k > 1 else []
        seq = ctx + key if ctx else key
        count = len(seq) - k + 1
        if count <= 0:
            return iter(()), -1
        return map(hash, zip(*(seq[i : i + count] for i in range(k)))), count - 1


def _tokens_before(node: "TreeNode", offset: int, n: int) -> list[int]:
    """The (up to) n tokens on node's path that end at position `offset` of its key."""
    toks = node.key.token_ids
    out = toks[max(offset - n, 0) : offset]
    p = node.parent
    while len(out) < n and p is not None and p.parent is not None:
        toks = p.key.token_ids
        need = n - len(out)
        out = (toks[-need:] if need < len(toks) else toks) + out
        p = p.parent
    return out
