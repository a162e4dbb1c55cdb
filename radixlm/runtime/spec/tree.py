"""Tree drafts (EAGLE with --speculative-eagle-topk K > 1): a draft is its tokens plus a parent array, nodes in
order of depth so that parents[i] < i (-1: a child of the root, the request's newest token). Any prefix of the nodes
is a tree, and the nodes up to a depth are a prefix. The verification pass gives the root one row and each node one
row at position (root's position + depth), attending to the request's KV before the tree and to its own ancestors
only (TreeMask); the longest path whose every token is the target's choice at its parent (argmax, or a draw for a
sampled request: walk) is accepted, and the accepted nodes' KV is moved into the positions they now hold
(compaction, no recomputation)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from radixlm.runtime.executor.forward_batch import TreeMask

__all__ = ["TreeMask"]  # the attention backends' input, made by the planner from a draft's parents


def depths(parents: list[int]) -> list[int]:
    """Depth of each node (a child of the root has depth 1)."""
    out: list[int] = []
    for p in parents:
        out.append(1 if p < 0 else out[p] + 1)
    return out


def nodes_within(parents: list[int], max_depth: int) -> int:
    """How many leading nodes have depth <= max_depth (nodes are in order of depth)."""
    return sum(1 for d in depths(parents) if d <= max_depth)


def verify_mask(parents: list[int], rows_before: int) -> torch.Tensor:
    """(rows_before + n, rows_before + n) bool: the pass's rows of one request, its `rows_before` rows before the
    tree (the root last) causal among themselves, each node seeing them, its ancestors and itself."""
    n, total = len(parents), rows_before + len(parents)
    mask = torch.ones(total, total, dtype=torch.bool).tril()
    mask[rows_before:, rows_before:] = False
    for i, p in enumerate(parents):
        row = rows_before + i
        mask[row, rows_before + i] = True
        if p >= 0:
            mask[row, rows_before : rows_before + n] |= mask[rows_before + p, rows_before : rows_before + n]
    return mask


def path_rows(path: list[int]) -> list[int]:
    """The verification rows (0: the root) whose logits chose each token of an accepted path and the token after
    it: the root's, then each accepted node's."""
    return [0] + [1 + node for node in path]


def row_tokens(tokens: list[int], parents: list[int], row: int) -> list[int]:
    """The draft tokens before verification row `row` (0: the root, none; 1 + i: node i's path, node i included)."""
    out, at = [], row - 1
    while at >= 0:
        out.append(tokens[at])
        at = parents[at]
    return out[::-1]


def walk(parents: list[int], tokens: list[int], choose: Callable[[int], int]) -> tuple[list[int], int]:
    """(accepted path, the token after it): from the root, the target chooses a token at the current node's row
    (choose(0): at the root, choose(1 + i): at node i) and the walk moves to the child holding it, while one does.
    Greedy: the argmax. Sampled: a draw from the row's distribution -- the multi-candidate rule (SpecInfer) for
    point-mass drafts, since trying distinct candidates one by one, each kept with its probability left after the
    rejected ones, picks exactly as one draw does; each token is distributed as without the draft."""
    path: list[int] = []
    at = -1
    while True:
        want = choose(0 if at < 0 else 1 + at)
        nxt = next((i for i, (p, t) in enumerate(zip(parents, tokens)) if p == at and t == want), None)
        if nxt is None:
            return path, want
        path.append(nxt)
        at = nxt


@dataclass
class TreeBuild:
    """The nodes of one request's draft tree while it grows (EAGLE's top-K expansion): every candidate kept, each
    with its cumulative log-probability, added after its parent; `select` keeps the best."""

    tokens: list[int]
    parents: list[int]
    scores: list[float]

    def select(self, n: int) -> tuple[list[int], list[int]]:
        """The n best nodes by cumulative log-probability (a child never beats its parent: its score is the parent's
        plus a log-probability <= 0; ties go to the earlier node, a parent before its children), reordered by depth
        then score, parents renumbered."""
        order = sorted(range(len(self.tokens)), key=lambda i: (-self.scores[i], i))[:n]
        chosen = set(order)
        depth = depths(self.parents)  # children are added after their parents
        keep = sorted((i for i in order if self._closed(i, chosen)), key=lambda i: (depth[i], -self.scores[i], i))
        index = {old: new for new, old in enumerate(keep)}
        return [self.tokens[i] for i in keep], [index[self.parents[i]] if self.parents[i] >= 0 else -1 for i in keep]

    def _closed(self, i: int, chosen: set[int]) -> bool:
        p = self.parents[i]
        while p >= 0:
            if p not in chosen:
                return False
            p = self.parents[p]
        return True

