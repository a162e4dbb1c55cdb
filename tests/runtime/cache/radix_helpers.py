"""A tiny stand-in for the scheduler: admits fake requests, prefills/decodes them through the pools and the
radix cache, and checks exact slot accounting."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from radixlm.runtime.cache.memory_pool import ReqToTokenPool, TokenToKVPoolAllocator
from radixlm.runtime.cache.radix_cache import CacheLock, RadixCache, RadixKey, TreeNode


@dataclass
class FakeReq:
    origin_input_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    extra_key: str | None = None
    req_pool_idx: int = -1
    kv_committed_len: int = 0
    lock: CacheLock | None = None

    @property
    def cache_protected_len(self) -> int:
        return self.lock.protected_len

    @property
    def last_node(self) -> TreeNode:
        return self.lock.node

    def key(self) -> RadixKey:
        return RadixKey((self.origin_input_ids + self.output_ids)[: self.kv_committed_len], self.extra_key)


class Sim:
    def __init__(self, size: int = 64, page_size: int = 1, disable: bool = False, policy: str = "lru"):
        self.size = size
        self.page_size = page_size
        self.req_pool = ReqToTokenPool(8, 256, "cpu")
        self.alloc = TokenToKVPoolAllocator(size, page_size, "cpu")
        self.cache = RadixCache(self.req_pool, self.alloc, page_size=page_size, disable=disable,
                                eviction_policy=policy)
        self.live: list[FakeReq] = []

    def admit(self, req: FakeReq) -> FakeReq:
        req.req_pool_idx = self.req_pool.alloc()
        m = self.cache.match_prefix(RadixKey(req.origin_input_ids[:-1], req.extra_key))
        req.lock, _ = self.cache.lock(m.last_node, len(m.device_indices))
        self.req_pool.req_to_token[req.req_pool_idx, : req.cache_protected_len] = m.device_indices
        req.kv_committed_len = req.cache_protected_len
        self.live.append(req)
        return req

    def extend(self, req: FakeReq, new_len: int) -> torch.Tensor:
        """Computes KV for positions [kv_committed_len, new_len) (prefill chunk or decode step)."""
        start = req.kv_committed_len
        row = self.req_pool.req_to_token[req.req_pool_idx]
        last = int(row[start - 1]) if start > 0 else -1
        slots = self.alloc.alloc_extend([start], [new_len], [last])
        assert slots is not None, "fake scheduler ran out of KV"
        row[start:new_len] = slots
        req.kv_committed_len = new_len
        return slots

    def prefill(self, req: FakeReq) -> None:
        self.extend(req, len(req.origin_input_ids))

    def decode(self, req: FakeReq, token: int) -> None:
        # The previously sampled token gets its KV now; the new sample has none yet.
        if req.output_ids:
            self.extend(req, req.kv_committed_len + 1)
        req.output_ids.append(token)

    def slots(self, req: FakeReq) -> torch.Tensor:
        """The request's KV slots, as its req_to_token row lists them."""
        return self.req_pool.req_to_token[req.req_pool_idx, : req.kv_committed_len]

    def cache_unfinished(self, req: FakeReq) -> None:
        req.lock = self.cache.cache_unfinished(req.lock, req.req_pool_idx, req.key())

    def finish(self, req: FakeReq, is_insert: bool = True) -> None:
        self.cache.cache_finished(req.lock, req.req_pool_idx, req.key(), insert=is_insert)
        self.live.remove(req)

    def owned_tokens(self) -> int:
        total = 0
        for r in self.live:
            own = self.req_pool.req_to_token[r.req_pool_idx, r.cache_protected_len : r.kv_committed_len]
            total += torch.unique(own // self.page_size).numel() * self.page_size
        return total

    def check(self) -> None:
        c = self.cache
        c.check_consistency()
        self.alloc.check_no_double_free()
        assert c.evictable_size() + c.protected_size() == c.total_size()
        assert self.alloc.available_size() + c.total_size() + self.owned_tokens() == self.size
