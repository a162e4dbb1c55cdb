"""Decode requests grouped by a shared cached prefix, so that attention reads each group's prefix KV once
(ModelWorkerBatch.shared_prefixes; kernels/attention/shared_prefix.py).

Invariant: the requests of a group have identical req_to_token slots over [0, prefix_len); prefix_len >= min_len;
a group has >= 2 requests; a request is in one group at most. Why it holds: a group is the requests whose last
match ended at the same radix node (req.last_node, the same object, alive while they run) with the same length
(req.prefix_len). Planner._admit_rows wrote the match's slots (the node's path) into [0, prefix_len) of their rows,
and nothing rewrites that span while they run: cache_unfinished rewrites a row only from its locked length on, the
locked path is never evicted, and a node split keeps the deeper part as the same object at the same depth. A
request that computed the prefix itself (a sibling admitted with the first) holds the same slots once they are
cached but is not grouped with those that matched them: missed sharing, never a wrong group."""
from __future__ import annotations

from typing import TYPE_CHECKING

from radixlm.runtime.kernels.attention import SHARED_PREFIX_MIN_LEN

# A decode pass that a CUDA graph could replay runs eagerly with its groups when it has at least EAGER_MIN_ROWS rows
# and they spare at least EAGER_MIN_SHARED_READS positions of KV reads. An eager pass of an 8B model costs the host
# 15-25 ms: a smaller pass replayed ends sooner even when it reads every request's prefix (64 requests over a
# 2048-token prefix: 17 GB, ~6 ms on an H100); a larger one keeps the device busy while the host enqueues it.
EAGER_MIN_ROWS = 512
EAGER_MIN_SHARED_READS = 1 << 15

if TYPE_CHECKING:
    from radixlm.runtime.scheduler.req import Req


def min_prefix_len(takes_shared_prefixes: bool) -> int:
    """Planner.shared_prefix_min_len: the decode kernels' threshold, or 0 (no groups) where the attention backend
    reads no shared prefixes (ModelRunner.takes_shared_prefixes)."""
    return SHARED_PREFIX_MIN_LEN if takes_shared_prefixes else 0


def shared_prefix_groups(reqs: list["Req"], min_len: int) -> list[tuple[int, list[int]]] | None:
    """(prefix_len, indices into reqs) per group of the invariant's, or None when there is none."""
    by_match: dict[tuple[int, int], list[int]] = {}
    for i, r in enumerate(reqs):
        if r.prefix_len >= min_len and r.last_node is not None:
            by_match.setdefault((id(r.last_node), r.prefix_len), []).append(i)
    groups = [(key[1], rows) for key, rows in by_match.items() if len(rows) > 1]
    return groups or None


def eager_pays(groups: list[tuple[int, list[int]]]) -> bool:
    """Whether the groups spare enough KV reads (each group's prefix read once) for a large replayable pass to run
    eagerly with them rather than replay a graph that reads every request's prefix."""
    return sum(prefix_len * (len(rows) - 1) for prefix_len, rows in groups) >= EAGER_MIN_SHARED_READS


def decode_groups(reqs: list["Req"], min_len: int, replayable: bool) -> list[tuple[int, list[int]]] | None:
    """The groups a decode pass carries (a pass with groups runs eagerly): all of them when no graph could replay
    it; else only for a pass of EAGER_MIN_ROWS or more whose groups eager_pays (smaller ones are not even scanned)."""
    if replayable and len(reqs) < EAGER_MIN_ROWS:
        return None
    groups = shared_prefix_groups(reqs, min_len)
    return groups if groups is not None and (not replayable or eager_pays(groups)) else None
