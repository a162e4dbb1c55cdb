"""The router's approximate radix tree: one character-level trie over request text shared by all workers
("tenants"); each node records which tenants are believed to hold that prefix and when each last used it.

NOTE invariants (checked by `check_invariants`, exercised by the property tests):
- ownership is prefix-closed: a tenant that owns a node owns every ancestor of it;
- `char_count[t]` == sum of len(node.text) over the nodes t owns;
- every non-root node has non-empty text, is keyed in its parent by its first character, and has >= 1 owner.
The tree is touched from one asyncio thread only, so it needs no locks.
"""
from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field


@dataclass(eq=False)
class Node:
    text: str
    parent: Node | None
    children: dict[str, Node] = field(default_factory=dict)
    # tenant -> logical access time (a counter, not wall clock: monotonic and deterministic)
    last_access: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class MatchResult:
    matched_chars: int  # characters of the input covered by the deepest node some allowed tenant owns
    input_chars: int
    tenants: tuple[str, ...]  # the allowed owners of that deepest node, most recently used first

    @property
    def match_rate(self) -> float:
        return self.matched_chars / self.input_chars if self.input_chars else 0.0


def _common_prefix_len(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class ApproxRadixTree:
    def __init__(self) -> None:
        self.root = Node(text="", parent=None)
        self.char_count: dict[str, int] = {}
        self._clock = itertools.count(1)

    # ---- tenants -------------------------------------------------------------------------------
    def add_tenant(self, tenant: str) -> None:
        """Registers a worker with an empty tree (so it can be counted before any request lands on it)."""
        self.root.last_access.setdefault(tenant, next(self._clock))
        self.char_count.setdefault(tenant, 0)

    def tenants(self) -> list[str]:
        return list(self.char_count)

    def _split(self, node: Node, at: int) -> Node:
        """Cuts node.text at `at` (0 < at < len): a new parent takes the head and keeps all owners."""
        head = Node(text=node.text[:at], parent=node.parent, last_access=dict(node.last_access))
        assert node.parent is not None
        node.parent.children[head.text[0]] = head
        node.text = node.text[at:]
        node.parent = head
        head.children[node.text[0]] = node
        return head

    def _own(self, node: Node, tenant: str, now: int) -> None:
        if tenant not in node.last_access:
            self.char_count[tenant] = self.char_count.get(tenant, 0) + len(node.text)
        node.last_access[tenant] = now

    # ---- insert / match --------------------------------------------------------------------------
    def insert(self, text: str, tenant: str) -> None:
        """Records that `tenant` now holds `text` (and so every prefix of it)."""
        now = next(self._clock)
        node = self.root
        self._own(node, tenant, now)
        pos = 0
        while pos < len(text):
            child = node.children.get(text[pos])
            if child is None:
                leaf = Node(text=text[pos:], parent=node)
                node.children[leaf.text[0]] = leaf
                self._own(leaf, tenant, now)
                return
            n = _common_prefix_len(child.text, text[pos:])
            if n < len(child.text):
                child = self._split(child, n)
            self._own(child, tenant, now)
            node = child
            pos += n

    def prefix_match(self, text: str, allowed: set[str] | None = None) -> MatchResult:
        """Longest prefix of `text` that some allowed tenant holds. A partial match inside a node counts its
        matched characters (the worker holds that node's whole text, so it holds the shorter prefix too)."""
        def ok(n: Node) -> bool:
            return any(allowed is None or t in allowed for t in n.last_access)

        node, pos, best = self.root, 0, self.root
        while pos < len(text):
            child = node.children.get(text[pos])
            if child is None or not ok(child):
                break
            n = _common_prefix_len(child.text, text[pos:])
            pos += n
            best = child
            if n < len(child.text):
                break
            node = child
        owners = [t for t in best.last_access if allowed is None or t in allowed]
        owners.sort(key=lambda t: -best.last_access[t])
        return MatchResult(pos if best is not self.root else 0, len(text), tuple(owners))

    def match_tenant(self, text: str, tenant: str) -> int:
        """Characters of `text` the tree believes `tenant` holds."""
        return self.prefix_match(text, {tenant}).matched_chars if tenant in self.char_count else 0

    # ---- removal -----------------------------------------------------------------------------------
    def _disown(self, node: Node, tenant: str) -> None:
        if node.last_access.pop(tenant, None) is not None:
            self.char_count[tenant] -= len(node.text)
        if node is not self.root and not node.last_access:
            assert node.parent is not None and not node.children, "an ownerless node has ownerless children"
            del node.parent.children[node.text[0]]

    def _disown_subtree(self, top: Node, tenant: str) -> None:
        stack, order = [top], []
        while stack:
            n = stack.pop()
            if tenant in n.last_access:
                order.append(n)
                stack.extend(n.children.values())
        for n in reversed(order):  # children before parents, so emptied nodes are leaves when removed
            self._disown(n, tenant)

    def remove_tenant(self, tenant: str) -> None:
        """Forgets a worker entirely (removed from the router)."""
        if tenant in self.char_count:
            self._disown_subtree(self.root, tenant)
            del self.char_count[tenant]

    def clear_tenant(self, tenant: str) -> None:
        """Forgets what a worker holds but keeps it registered (its cache was flushed, or it restarted)."""
        if tenant in self.char_count:
            self.remove_tenant(tenant)
            self.add_tenant(tenant)

    def remove_prefix(self, text: str, tenant: str) -> int:
        """Makes `tenant` stop holding `text` and every string extending it, keeping what it holds of
        text[:-1] (cache feedback: the worker evicted the KV from that point on). Returns chars dropped."""
        if tenant not in self.char_count or not text:
            return 0
        keep = len(text) - 1
        node, pos = self.root, 0
        while True:
            child = node.children.get(text[pos])
            if child is None or tenant not in child.last_access:
                return 0
            n = _common_prefix_len(child.text, text[pos:])
            if pos + len(child.text) <= keep:  # child ends before the cut: it must match whole to go on
                if n < len(child.text):
                    return 0
                node, pos = child, pos + n
                continue
            if pos + n < len(text):
                return 0  # the tenant does not hold `text`
            if keep > pos:
                self._split(child, keep - pos)  # `child` is now the tail that starts at the cut
            before = self.char_count[tenant]
            self._disown_subtree(child, tenant)
            return before - self.char_count[tenant]

    # ---- eviction ------------------------------------------------------------------------------------
    def evict_tenant_by_size(self, max_chars: int) -> dict[str, int]:
        """Trims each tenant to `max_chars` characters (see `evict_tenant`). Returns chars evicted per tenant
        that was over budget."""
        return {t: self.evict_tenant(t, max_chars) for t, used in list(self.char_count.items()) if used > max_chars}

    def evict_tenant(self, tenant: str, max_chars: int) -> int:
        """Trims one tenant to `max_chars` characters by peeling its least recently used leaves (a node that
        becomes a leaf for that tenant joins the heap, so eviction unwinds bottom-up). Returns chars evicted."""
        start = self.char_count.get(tenant, 0)
        if start <= max_chars:
            return 0
        heap: list[tuple[int, int, Node]] = []
        tie = itertools.count()
        stack = [self.root]
        while stack:
            n = stack.pop()
            owned_kids = [c for c in n.children.values() if tenant in c.last_access]
            if not owned_kids and n is not self.root:
                heapq.heappush(heap, (n.last_access[tenant], next(tie), n))
            stack.extend(owned_kids)
        while heap and self.char_count[tenant] > max_chars:
            _, _, n = heapq.heappop(heap)
            parent = n.parent
            self._disown(n, tenant)
            if (parent is not None and parent is not self.root
                    and not any(tenant in c.last_access for c in parent.children.values())):
                heapq.heappush(heap, (parent.last_access[tenant], next(tie), parent))
        return start - self.char_count[tenant]

    # ---- checks --------------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        counts: dict[str, int] = {t: 0 for t in self.char_count}
        stack = [self.root]
        while stack:
            n = stack.pop()
            for t in n.last_access:
                assert t in counts, f"node owned by unknown tenant {t!r}"
                counts[t] += len(n.text)
                if n.parent is not None:
                    assert t in n.parent.last_access, "ownership must be prefix-closed"
            if n is not self.root:
                assert n.text and n.last_access, "non-root nodes have text and owners"
                assert n.parent is not None and n.parent.children.get(n.text[0]) is n
            for key, c in n.children.items():
                assert c.text[0] == key and c.parent is n
                stack.append(c)
        assert counts == self.char_count, f"char counts drifted: {counts} != {self.char_count}"
