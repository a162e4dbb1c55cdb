"""HiRadixCache as a data structure (no model): each write policy, eviction to host and host eviction, loading back,
slot adoption, and the file storage tier across two caches. Every KV row holds its token id, so a wrong slot or a
stale copy shows in the values loaded back."""
from __future__ import annotations

import pytest
import torch

from radixlm.runtime.args import HiCachePrefetchPolicy, HiCacheStorageBackend, HiCacheWritePolicy
from radixlm.runtime.cache.hicache import HiCacheConfig, HiRadixCache
from radixlm.runtime.cache.memory_pool import ReqToTokenPool, TokenToKVPool, TokenToKVPoolAllocator
from radixlm.runtime.cache.radix_node import CacheLock, RadixKey

WB, WT = HiCacheWritePolicy.WRITE_BACK, HiCacheWritePolicy.WRITE_THROUGH
WTS = HiCacheWritePolicy.WRITE_THROUGH_SELECTIVE


class Harness:
    def __init__(self, policy: HiCacheWritePolicy, size: int = 32, host: int = 64, page_size: int = 1,
                 eviction_policy: str = "lru", **config):
        self.rows = ReqToTokenPool(4, 256)
        self.alloc = TokenToKVPoolAllocator(size, page_size)
        self.kv = TokenToKVPool(size, page_size, torch.float32, num_layers=2, num_kv_heads=1, head_dim=2)
        cfg = HiCacheConfig(host_tokens=host, write_policy=policy, **config)
        self.tree = HiRadixCache(self.rows, self.alloc, self.kv, cfg, page_size=page_size,
                                 eviction_policy=eviction_policy)

    def run(self, tokens: list[int]) -> int:
        """A request over `tokens`: matches (loading its host hit), computes the rest, finishes; the tokens it
        found cached."""
        key = RadixKey(tokens)
        m = self.tree.match_and_load(key)
        lock, _ = self.tree.lock(m.last_node, m.length)
        row = self.rows.alloc()
        self.rows.req_to_token[row, : m.length] = m.device_indices
        if m.length < len(tokens):
            ps = self.alloc.page_size
            self.tree.evict((-(-len(tokens) // ps) - m.length // ps) * ps - self.alloc.available_size())
            last = int(m.device_indices[-1]) if m.length else -1
            slots = self.alloc.alloc_extend([m.length], [len(tokens)], [last])
            assert slots is not None
            self.rows.req_to_token[row, m.length : len(tokens)] = slots
            self._write(slots, tokens[m.length :])
        self.check_kv(self.rows.req_to_token[row, : len(tokens)], tokens)
        self.tree.cache_finished(lock, row, key)
        self.check()
        return m.length

    def _write(self, slots: torch.Tensor, tokens: list[int]) -> None:
        vals = torch.tensor(tokens, dtype=torch.float32)[:, None, None].expand(-1, 1, 2)
        for layer in range(2):
            self.kv.set_kv_buffer(layer, slots, vals + layer, -vals - layer)

    def check_kv(self, slots: torch.Tensor, tokens: list[int]) -> None:
        want = torch.tensor(tokens, dtype=torch.float32)
        for layer in range(2):
            assert torch.equal(self.kv.k_buffer[layer][slots, 0, 0], want + layer)
            assert torch.equal(self.kv.v_buffer[layer][slots, 0, 1], -want - layer)

    def check(self) -> None:
        self.tree.check_consistency()
        held = self.tree.evictable_size() + self.tree.protected_size()
        assert self.alloc.available_size() + held == self.alloc.size


def seq(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


@pytest.mark.parametrize("policy", [WB, WT])
def test_a_prefix_evicted_from_the_device_is_loaded_back_from_host(policy):
    h = Harness(policy)
    a = seq(100, 20)
    assert h.run(a) == 0
    written = h.tree.tier_stats().get("host_written_tokens", 0)
    assert written == (20 if policy is WT else 0)  # write_through copies when cached, write_back not yet
    assert h.run(seq(500, 24)) == 0  # evicts most of `a` from the device
    m = h.tree.match_prefix(RadixKey(a))
    assert m.length + m.host_hit_length == 20 and m.host_hit_length > 0
    # write_through copied both prompts when cached; write_back copied what it evicted, when it did
    assert h.tree.tier_stats()["host_written_tokens"] == (44 if policy is WT else m.host_hit_length)
    assert h.run(a + [7, 8]) == 20
    assert h.tree.tier_stats()["host_loaded_tokens"] == m.host_hit_length


def test_write_through_selective_copies_at_the_second_hit_and_drops_what_it_never_copied():
    h = Harness(WTS)
    a, b = seq(100, 16), seq(300, 16)
    h.run(a), h.run(b)
    h.run(a[:12] + [1])  # a's first hit
    assert h.tree.tier_stats().get("host_written_tokens", 0) == 0
    h.run(a[:12] + [2])  # the second: a's first 12 tokens are copied
    assert h.tree.tier_stats()["host_written_tokens"] == 12
    h.tree.evict(h.alloc.size)  # everything unlocked leaves the device
    assert h.tree.match_prefix(RadixKey(a)).host_hit_length == 12
    assert h.tree.match_prefix(RadixKey(b)).host_hit_length == 0  # never hit twice: gone
    h.check()
    assert h.run(a) == 12


def test_host_eviction_deletes_the_least_recently_used_host_only_leaves():
    h = Harness(WB, size=32, host=32)
    prompts = [seq(1000 * i, 16) for i in range(1, 6)]
    for p in prompts:
        h.run(p)
    h.tree.evict(h.alloc.size)
    h.check()
    hits = [h.tree.match_prefix(RadixKey(p)).host_hit_length for p in prompts]
    assert hits[:3] == [0, 0, 0] and hits[3:] == [16, 16]  # 32 host slots keep the last two
    assert h.run(prompts[0]) == 0 and h.run(prompts[4]) == 16


def test_a_request_that_recomputed_a_host_only_prefix_hands_its_slots_to_those_nodes():
    h = Harness(WB)
    a = seq(100, 16)
    h.run(a)
    h.tree.evict(h.alloc.size)
    # A request admitted without loading (as when the device had no room for the load) computes `a` itself.
    row = h.rows.alloc()
    slots = h.alloc.alloc(20)
    h.rows.req_to_token[row, :20] = slots
    h._write(slots, a + [1, 2, 3, 4])
    h.tree.cache_finished(CacheLock(h.tree.root_node, 0), row, RadixKey(a + [1, 2, 3, 4]))
    h.check()
    m = h.tree.match_prefix(RadixKey(a + [1, 2, 3, 4]))
    assert m.length == 20 and m.host_hit_length == 0
    h.check_kv(m.device_indices, a + [1, 2, 3, 4])


def test_load_back_splits_a_host_only_node_at_the_hit_and_pages_stay_whole():
    h = Harness(WT, size=32, host=64, page_size=4)
    a = seq(100, 16)
    h.run(a)
    h.tree.evict(h.alloc.size)
    assert h.run(a[:9] + [5, 6, 7]) == 8  # two of a's four pages come back; a's node is cut after them
    h.check()
    m = h.tree.match_prefix(RadixKey(a))
    assert (m.length, m.host_hit_length) == (8, 8)


def test_flush_clears_both_tiers():
    h = Harness(WT)
    h.run(seq(100, 16))
    h.tree.evict(8)
    h.tree.reset()
    h.alloc.clear()
    h.check()
    assert h.tree.host_pool.allocator.available_size() == 64
    assert h.run(seq(100, 16)) == 0


@pytest.mark.parametrize("prefetch", list(HiCachePrefetchPolicy))
def test_file_storage_serves_a_second_cache_with_the_same_directory(tmp_path, prefetch):
    config = dict(storage_backend=HiCacheStorageBackend.FILE, storage_dir=tmp_path, prefetch_policy=prefetch,
                  namespace="m", storage_page_tokens=8)
    first = Harness(WT, **config)
    a = seq(100, 21)
    first.run(a)
    first.tree.reset()  # waits for the writes
    assert len(list(tmp_path.glob("*.kv"))) == 2  # whole pages only
    second = Harness(WT, **config)
    key = RadixKey(a[:20])
    assert second.tree.match_prefix(key).storage_hit  # a waiting request's match starts the read
    second.tree.storage._prefetches[StorageKey(key)].future.result()  # (the read ends before admission)
    assert second.tree.prefetch_ready(key)
    m = second.tree.match_and_load(key)
    assert m.length == 16 and second.tree.tier_stats()["storage_loaded_tokens"] == 16
    second.check_kv(m.device_indices, a[:16])
    second.check()
    other = Harness(WT, **{**config, "namespace": "another model"})
    other.tree.match_prefix(key)
    assert other.tree.match_and_load(key).length == 0


def test_the_prefetch_policy_decides_whether_admission_waits_for_a_read(tmp_path):
    import concurrent.futures

    a = seq(100, 17)
    config = dict(storage_backend=HiCacheStorageBackend.FILE, storage_dir=tmp_path, namespace="m",
                  storage_page_tokens=8)
    first = Harness(WT, **config)
    first.run(a)
    first.tree.reset()
    key = RadixKey(a[:16])
    for policy, ready in ((HiCachePrefetchPolicy.BEST_EFFORT, True), (HiCachePrefetchPolicy.WAIT_COMPLETE, False),
                          (HiCachePrefetchPolicy.TIMEOUT, False)):
        h = Harness(WT, **config, prefetch_policy=policy)
        h.tree.storage.io.prefetch = lambda keys: concurrent.futures.Future()  # a read that never ends
        assert h.tree.match_prefix(key).storage_hit
        assert h.tree.prefetch_ready(key) is ready
        h.tree.storage._prefetches[StorageKey(key)].deadline = 0.0
        assert h.tree.prefetch_ready(key) is (policy is not HiCachePrefetchPolicy.WAIT_COMPLETE)
        assert h.tree.match_and_load(key).length == 0  # admitted without the pages: the read is dropped
        h.check()


def StorageKey(key: RadixKey):
    from radixlm.runtime.cache.hicache.storage_tier import StorageTier

    return StorageTier._id(key)


class FakeEvent:
    """A device copy that has not finished until `done` (the CUDA path's ordering, checked on the CPU)."""

    def __init__(self):
        self.done = False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.done = True


def test_host_copies_in_flight_land_before_a_read_of_their_slots_or_a_direct_write():
    h = Harness(WB)
    pool = h.tree.host_pool
    pool._put_in_flight(FakeEvent(), torch.tensor([5, 6]), None)
    pool.read(torch.tensor([7]))
    assert pool._inflight  # elsewhere: no wait
    pool.read(torch.tensor([6]))
    assert not pool._inflight
    stale = FakeEvent()  # its slots were handed out again
    pool._put_in_flight(stale, torch.tensor([5, 6]), None)
    pool.write(torch.tensor([5, 6]), torch.full((2, 4, 1, 2), 9.0))
    assert stale.done and float(pool.read(torch.tensor([6]))[0, 3, 0, 1]) == 9.0


def test_a_read_waits_for_the_newest_in_flight_batch_writing_its_slots_and_no_later_one():
    host = Harness(WB).tree.host_pool
    events = [FakeEvent() for _ in range(3)]
    words = host._kv_words
    host._put_in_flight(events[0], torch.tensor([1, 2, 3]), None)
    host._put_in_flight(events[1], torch.tensor([3, 4]), torch.full((2, *words.shape[1:]), 7, dtype=words.dtype))
    host._put_in_flight(events[2], torch.tensor([5]), None)
    assert [host._overlapping(torch.tensor(s)) for s in ([9, 10], [1], [4, 1], [3], [5, 2])] == [0, 1, 2, 2, 3]
    assert [host._overlapping(torch.tensor(s), staged_only=True) for s in ([5, 2], [3])] == [0, 2]
    events[0].done = True  # polled: the oldest has ended
    assert host._overlapping(torch.tensor([1])) == 0 and host._overlapping(torch.tensor([4])) == 1
    host._wait_for(torch.tensor([3]))  # waits for the staged batch (and lands its rows), not the newest
    assert events[1].done and not events[2].done and len(host._inflight) == 1
    assert bool((words[[3, 4]] == 7).all()) and host._overlapping(torch.tensor([5])) == 1


def test_the_host_pool_must_hold_the_device_pool():
    from radixlm.runtime.args import ServerArgs

    kv = TokenToKVPool(64, 1, torch.float32, num_layers=2, num_kv_heads=1, head_dim=2)
    args = ServerArgs(enable_hierarchical_cache=True, hicache_ratio=1.5)
    assert HiCacheConfig.from_args(args, kv, "m").host_tokens == 96
    with pytest.raises(ValueError, match="at least the device pool"):
        HiCacheConfig.from_args(ServerArgs(enable_hierarchical_cache=True, hicache_size=1e-6), kv, "m")
    with pytest.raises(ValueError, match="hicache_ratio"):
        ServerArgs(enable_hierarchical_cache=True, hicache_ratio=0.5)
    with pytest.raises(ValueError, match="needs enable_hierarchical_cache"):
        ServerArgs(hicache_storage_backend="file")


def test_a_load_that_finds_no_room_leaves_both_tiers_consistent():
    h = Harness(WB, size=32, host=32, eviction_policy="fifo")
    a = seq(100, 16)
    h.run(a), h.run(seq(300, 16))
    h.tree.evict(h.alloc.size)  # both host-only: the host pool is full
    h.run(seq(500, 8))  # on the device only
    held = h.alloc.alloc(h.alloc.available_size())  # a running request holds the rest of the device pool
    # Loading `a` evicts the 8 tokens (write_back copies them: host eviction passes over `a`, being loaded, and
    # takes the other prompt) and still finds no room.
    key = RadixKey(a + [1])
    assert h.tree.match_and_load(key).host_hit_length == 16
    h.tree.check_consistency()
    h.alloc.free(held)
    assert h.tree.match_and_load(key).length == 16
    h.check()
