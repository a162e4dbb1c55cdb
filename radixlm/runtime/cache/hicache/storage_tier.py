"""What the hierarchical cache asks of its storage tier: which pages a prefix has there (a read started when a
request waits, taken at its admission by the prefetch policy), and writing a finished request's pages."""
from __future__ import annotations

import concurrent.futures
import time
from collections import OrderedDict
from dataclasses import dataclass

import torch

from radixlm.runtime.args import HiCachePrefetchPolicy
from radixlm.runtime.cache.hicache.config import HiCacheConfig
from radixlm.runtime.cache.hicache.host_pool import HostKVPool
from radixlm.runtime.cache.hicache.storage import FileStorage, PageLayout, StorageIO, page_hashes
from radixlm.runtime.cache.kv_pool import KVPool
from radixlm.runtime.cache.radix_node import RadixKey

# Prefetches remembered for waiting requests (the oldest is forgotten beyond this: a request aborted while waiting).
MAX_PREFETCHES = 4096
# A prefix storage did not have is looked up again at most this often (a waiting request is matched every round).
RECHECK_S = 1.0


@dataclass
class Prefetch:
    start_page: int  # the first page asked for
    future: concurrent.futures.Future  # -> the pages found, in order
    deadline: float  # the timeout policy admits the request without the pages after this (time.monotonic)


class StorageTier:
    def __init__(self, config: HiCacheConfig, device_pool: KVPool, host_pool: HostKVPool):
        self.config = config
        self.page_tokens = config.storage_page_tokens
        layout = PageLayout(self.page_tokens, host_pool.num_buffers, *device_pool.layout.row_shape, device_pool.dtype)
        self.io = StorageIO(FileStorage(config.storage_dir, layout))
        self.device_pool = device_pool
        self.host_pool = host_pool
        self._prefetches: OrderedDict[tuple, Prefetch] = OrderedDict()
        self._missed: OrderedDict[tuple, float] = OrderedDict()  # key -> when storage lacked its next page

    def _keys(self, key: RadixKey) -> list[str]:
        return page_hashes(self.config.namespace, key.extra_key, key.token_ids, self.page_tokens)

    @staticmethod
    def _id(key: RadixKey) -> tuple:
        return key.extra_key, len(key), hash(tuple(key.token_ids))

    def maybe_prefetch(self, key: RadixKey, cached: int) -> bool:
        """Starts reading the pages of `key` past the `cached` tokens that the device and host tiers hold; whether
        a read for `key` is under way."""
        P = self.page_tokens
        if len(key) - cached < P:
            return False
        kid = self._id(key)
        if kid in self._prefetches:
            return True
        now = time.monotonic()
        if now - self._missed.get(kid, -RECHECK_S) < RECHECK_S:
            return False
        start = cached // P
        keys = self._keys(key)[start:]
        if not keys or not self.io.storage.exists(keys[0]):
            self._missed[kid] = now
            self._missed.move_to_end(kid)
            while len(self._missed) > MAX_PREFETCHES:
                self._missed.popitem(last=False)
            return False
        self._missed.pop(kid, None)
        deadline = time.monotonic() + self.config.prefetch_timeout(len(key) - cached)
        self._prefetches[self._id(key)] = Prefetch(start, self.io.prefetch(keys), deadline)
        while len(self._prefetches) > MAX_PREFETCHES:
            self._prefetches.popitem(last=False)
        return True

    def ready(self, key: RadixKey) -> bool:
        """Whether the prefetch policy lets a request waiting for `key`'s pages be admitted now: best_effort at
        once, wait_complete once they are read, timeout once they are read or its deadline passed."""
        p = self._prefetches.get(self._id(key))
        policy = self.config.prefetch_policy
        if p is None or policy is HiCachePrefetchPolicy.BEST_EFFORT or p.future.done():
            return True
        return policy is HiCachePrefetchPolicy.TIMEOUT and time.monotonic() >= p.deadline

    def take(self, key: RadixKey) -> tuple[int, list[torch.Tensor]] | None:
        """At admission: (first page, pages) read for `key` by now (a read still running is dropped)."""
        p = self._prefetches.pop(self._id(key), None)
        if p is None or not p.future.done():
            return None
        pages = p.future.result()
        return (p.start_page, pages) if pages else None

    def write_finished(self, key: RadixKey, slots: torch.Tensor) -> None:
        """Writes the whole pages of a finished request's tokens that storage lacks; slots: their device slots."""
        P = self.page_tokens
        keys = self._keys(key)
        missing = [i for i, k in enumerate(keys) if k not in self.io.written and not self.io.storage.exists(k)]
        if not missing:
            return
        rows = self.host_pool.gather_device(torch.cat([slots[i * P : (i + 1) * P] for i in missing]))
        pool = self.device_pool
        event = None
        if rows.is_cuda:
            staging = torch.empty(rows.shape, dtype=rows.dtype, pin_memory=True)
            staging.copy_(rows, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            rows = staging
        if rows.dtype != pool.dtype:  # float8 pools are gathered as bytes
            rows = rows.view(pool.dtype)
        self.io.write([keys[i] for i in missing], rows, event)

    def clear(self) -> None:
        """Forgets the reads in flight and waits for the writes (what is on disk stays)."""
        self._prefetches.clear()
        self._missed.clear()
        self.io.drain()
