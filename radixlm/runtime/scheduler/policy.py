"""Waiting-queue order: cache-aware (lpm, dfs-weight) and cache-agnostic (fcfs, lof, random) policies."""
from __future__ import annotations

import random
from collections import defaultdict

from radixlm.runtime.args import SchedulePolicyName
from radixlm.runtime.cache.radix_cache import RadixCache
from radixlm.runtime.cache.radix_node import TreeNode
from radixlm.runtime.scheduler.priority import PriorityRule
from radixlm.runtime.scheduler.req import Req

CACHE_AWARE = (SchedulePolicyName.LPM, SchedulePolicyName.DFS_WEIGHT)
# Above this many waiting requests LPM degrades to FCFS for the round, to bound the sorting cost.
LPM_FALLBACK_QUEUE_LEN = 128
# In-batch prefix caching: a request whose cached prefix is this short is checked against the other
# waiting requests; if it shares at least DEPRIORITIZE tokens with an earlier one it waits a round, so
# only one of the siblings computes the shared prefix and the rest hit the cache it leaves.
IN_BATCH_CHECK_THRESHOLD = 32
IN_BATCH_DEPRIORITIZE_THRESHOLD = 32

# Where a request's uncached tokens start, under its extra key, and the first DEPRIORITIZE of them: two requests with
# the same head would compute the same KV for those tokens.
PrefillHead = tuple[str | None, int, tuple[int, ...]]


def uncached_head(req: Req, start: int) -> PrefillHead | None:
    """The head of req's tokens from `start` (the end of its cached prefix); None when fewer than DEPRIORITIZE of
    them can be matched."""
    n = IN_BATCH_DEPRIORITIZE_THRESHOLD
    if req.max_prefix_len() - start < n:
        return None
    return req.extra_key, start, tuple(req.fill_ids[start : start + n])


class SchedulePolicy:
    def __init__(self, policy: SchedulePolicyName, tree_cache: RadixCache, disabled_cache: bool, seed: int = 0,
                 priority: PriorityRule | None = None):
        """priority: with priority scheduling on, the queue is ordered by rank first (the policy's order within)."""
        self.policy = SchedulePolicyName(policy)
        self.priority = priority if priority is not None and priority.enabled else None
        self.tree_cache = tree_cache
        self.disabled_cache = disabled_cache
        self.rng = random.Random(seed)
        # Set by calc_priority: requests that wait this round for a sibling to cache their shared prefix.
        self.deprioritized: set[Req] = set()

    def active_policy(self, queue_len: int) -> SchedulePolicyName:
        if self.policy in CACHE_AWARE and self.disabled_cache:
            return SchedulePolicyName.FCFS
        if self.policy is SchedulePolicyName.LPM and queue_len > LPM_FALLBACK_QUEUE_LEN:
            return SchedulePolicyName.FCFS
        return self.policy

    def calc_priority(self, waiting: list[Req], round_id: int) -> SchedulePolicyName:
        """Sorts `waiting` in place; returns the policy applied this round."""
        policy = self.active_policy(len(waiting))
        self.deprioritized = set()
        if policy in CACHE_AWARE:
            for req in waiting:
                req.init_next_round_input(self.tree_cache, round_id)
        if policy is SchedulePolicyName.LPM:
            self.deprioritized = self._in_batch_deprioritized(waiting)
            waiting.sort(key=lambda r: float("inf") if r in self.deprioritized else -r.prefix_len)
        elif policy is SchedulePolicyName.DFS_WEIGHT:
            waiting[:] = self._dfs_weight_order(waiting)
        elif policy is SchedulePolicyName.LOF:
            waiting.sort(key=lambda r: -r.sampling_params.max_new_tokens)
        elif policy is SchedulePolicyName.RANDOM:
            self.rng.shuffle(waiting)
        # fcfs: arrival order (retracted requests are re-queued at the front).
        if self.priority is not None:
            self.priority.order(waiting, self.deprioritized)
        return policy

    def _in_batch_deprioritized(self, waiting: list[Req]) -> set[Req]:
        # Two keys share at least DEPRIORITIZE tokens exactly when their first DEPRIORITIZE tokens (and extra keys)
        # are equal, so the set of those heads answers what a radix tree of the checked requests would, at a cost
        # per request that does not grow with its prompt.
        n = IN_BATCH_DEPRIORITIZE_THRESHOLD
        heads: set[tuple[str | None, tuple[int, ...]]] = set()
        out: set[Req] = set()
        for req in waiting:
            if req.prefix_len > IN_BATCH_CHECK_THRESHOLD or req.max_prefix_len() < n:
                continue
            head = (req.extra_key, tuple(req.fill_ids[:n]))
            if head in heads:
                out.add(req)
            else:
                heads.add(head)
        return out

    def _dfs_weight_order(self, waiting: list[Req]) -> list[Req]:
        """DFS over the radix tree, heavier subtrees (more waiting requests) first."""
        at_node: dict = defaultdict(list)
        for req in waiting:
            at_node[req.last_node].append(req)
        weight: dict = defaultdict(int)
        for node, reqs in at_node.items():
            while node is not None:
                weight[node] += len(reqs)
                node = node.parent
        # Post-order: a node's heavier child subtrees first, then the requests that end at the node.
        order: list[Req] = []
        stack: list[tuple[TreeNode, bool]] = [(self.tree_cache.root_node, False)]
        while stack:
            node, expanded = stack.pop()
            if expanded:
                order.extend(at_node.get(node, ()))
                continue
            stack.append((node, True))
            children = [c for c in node.children.values() if weight.get(c, 0) > 0]
            children.sort(key=lambda c: weight[c])  # the heaviest is popped first
            stack.extend((c, False) for c in children)
        return order
