"""cache_finished / cache_unfinished driven by a fake scheduler, with exact slot accounting."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from radix_helpers import FakeReq, Sim  # noqa: E402

from radixlm.runtime.cache.radix_cache import RadixKey  # noqa: E402

torch.set_num_threads(1)


def run_to_finish(sim: Sim, req: FakeReq, outputs: list[int], is_insert: bool = True) -> None:
    sim.prefill(req)
    sim.check()
    for t in outputs:
        sim.decode(req, t)
        sim.check()
    sim.finish(req, is_insert)
    sim.check()


@pytest.mark.parametrize("ps", [1, 4])
def test_finished_req_is_cached_and_reused(ps):
    sim = Sim(size=64, page_size=ps)
    prompt = list(range(10))
    a = sim.admit(FakeReq(prompt))
    run_to_finish(sim, a, [100, 101, 102])
    committed = 10 + 2  # the last sampled token has no KV
    assert sim.cache.total_size() == committed // ps * ps
    b = sim.admit(FakeReq(prompt + [7]))
    assert b.cache_protected_len == 10 // ps * ps
    assert sim.cache.protected_size() == b.cache_protected_len
    sim.check()
    run_to_finish(sim, b, [5])
    assert sim.cache.protected_size() == 0
    assert sim.req_pool.available_size() == sim.req_pool.size


@pytest.mark.parametrize("ps", [1, 4])
def test_concurrent_duplicates_are_freed(ps):
    sim = Sim(size=64, page_size=ps)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6, 5]
    a, b = sim.admit(FakeReq(prompt)), sim.admit(FakeReq(prompt))  # both miss
    sim.prefill(a)
    sim.prefill(b)
    sim.check()
    sim.finish(a)
    sim.check()
    free_before = sim.alloc.available_size()
    sim.finish(b)  # b's aligned slots duplicate a's: all of b's pages come back
    sim.check()
    assert sim.alloc.available_size() == free_before + -(-9 // ps) * ps
    assert sim.cache.total_size() == 9 // ps * ps


@pytest.mark.parametrize("ps", [1, 4])
def test_finished_without_insert_frees_own_slots(ps):
    sim = Sim(size=64, page_size=ps)
    run_to_finish(sim, sim.admit(FakeReq(list(range(8)))), [1])
    size_before = sim.cache.total_size()
    r = sim.admit(FakeReq(list(range(8)) + [50, 51, 52, 53, 54]))
    run_to_finish(sim, r, [9, 9], is_insert=False)  # retraction / abort
    assert sim.cache.total_size() == size_before
    assert sim.alloc.available_size() == sim.size - size_before


@pytest.mark.parametrize("ps", [1, 4])
def test_chunked_prefill_becomes_shareable(ps):
    sim = Sim(size=96, page_size=ps)
    prompt = list(range(20, 43))  # 23 tokens, chunks of 6
    a = sim.admit(FakeReq(prompt))
    b = None
    for end in (6, 12, 18, 23):
        slots_before = sim.req_pool.req_to_token[a.req_pool_idx, : a.kv_committed_len].clone()
        sim.extend(a, end)
        sim.cache_unfinished(a)
        aligned = end // ps * ps
        assert a.cache_protected_len == aligned and len(sim.slots(a)) == end
        row = sim.slots(a)
        assert torch.equal(row[: len(slots_before)], slots_before)  # no duplicates for a single request
        assert sim.cache.protected_size() >= aligned
        sim.check()
        if end == 12:
            # A second request now shares the first 12 (aligned, minus the last-token rule) tokens.
            b = sim.admit(FakeReq(prompt[:13] + [0, 0]))
            assert b.cache_protected_len == 12 // ps * ps
            sim.check()
    run_to_finish(sim, b, [1, 2])
    for t in (7, 8):
        sim.decode(a, t)
    sim.check()
    sim.finish(a)
    sim.check()
    assert sim.cache.protected_size() == 0


@pytest.mark.parametrize("ps", [1, 4])
def test_unfinished_req_rematches_onto_tree_slots(ps):
    sim = Sim(size=96, page_size=ps)
    prompt = list(range(1, 18))
    a, b = sim.admit(FakeReq(prompt)), sim.admit(FakeReq(prompt))
    sim.extend(a, 9)
    sim.extend(b, 9)
    sim.cache_unfinished(a)
    sim.check()
    free_before = sim.alloc.available_size()
    sim.cache_unfinished(b)  # b's first aligned(9) slots are duplicates of a's
    sim.check()
    aligned = 9 // ps * ps
    assert sim.alloc.available_size() == free_before + aligned
    assert torch.equal(sim.slots(b)[:aligned], sim.slots(a)[:aligned])
    assert b.last_node is a.last_node and b.last_node.lock_ref == 2
    for r in (a, b):
        sim.extend(r, 17)
        sim.cache_unfinished(r)
        sim.check()
    sim.decode(a, 5)
    sim.finish(a)
    sim.decode(b, 5)
    sim.finish(b, is_insert=False)
    sim.check()
    assert sim.cache.protected_size() == 0 and sim.cache.total_size() == 17 // ps * ps


@pytest.mark.parametrize("ps", [1, 4])
def test_extra_key_reqs_do_not_share(ps):
    sim = Sim(size=96, page_size=ps)
    prompt = list(range(12))
    run_to_finish(sim, sim.admit(FakeReq(prompt, extra_key="lora-a")), [1])
    r = sim.admit(FakeReq(prompt, extra_key="lora-b"))
    assert r.cache_protected_len == 0
    run_to_finish(sim, r, [1])
    assert len(sim.cache.root_node.children) == 2
    r = sim.admit(FakeReq(prompt, extra_key="lora-a"))
    assert r.cache_protected_len == 11 // ps * ps
    run_to_finish(sim, r, [1])


@pytest.mark.parametrize("ps", [1, 4])
def test_disable_mode_keeps_exact_accounting(ps):
    sim = Sim(size=64, page_size=ps, disable=True)
    prompt = list(range(14))
    a = sim.admit(FakeReq(prompt))
    assert a.cache_protected_len == 0
    sim.extend(a, 6)
    sim.cache_unfinished(a)
    assert len(sim.slots(a)) == 6 and sim.cache.total_size() == 0
    assert a.cache_protected_len == 0
    sim.check()
    sim.extend(a, 14)
    sim.cache_unfinished(a)
    sim.decode(a, 1)
    sim.decode(a, 2)
    sim.check()
    sim.finish(a)
    sim.check()
    assert sim.alloc.available_size() == sim.size and sim.cache.total_size() == 0


def test_eviction_under_pressure_then_reuse():
    sim = Sim(size=24, page_size=4)
    for base in (0, 100, 200):
        r = sim.admit(FakeReq([base + i for i in range(6)]))
        need = 12 - sim.alloc.available_size()  # 6 prompt + 4 decoded tokens -> 3 pages
        if need > 0:
            assert sim.cache.evict(need) == 8  # a whole leaf goes at once
        run_to_finish(sim, r, [1, 2, 3, 4, 5])
    # The first prompt's pages were evicted (LRU) to make room for the third.
    assert sim.cache.match_prefix(RadixKey(list(range(6)))).device_indices.numel() == 0
    assert sim.cache.match_prefix(RadixKey([100 + i for i in range(6)])).device_indices.numel() == 4
    assert sim.cache.match_prefix(RadixKey([200 + i for i in range(6)])).device_indices.numel() == 4
