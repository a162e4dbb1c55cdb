import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from radix_helpers import Sim  # noqa: E402

from radixlm.runtime.cache.radix_cache import RadixCache, RadixKey  # noqa: E402

torch.set_num_threads(1)


def ins(sim: Sim, tokens: list[int], extra_key: str | None = None) -> tuple[int, torch.Tensor]:
    slots = sim.alloc.alloc(len(tokens))
    present = sim.cache.insert(RadixKey(tokens, extra_key), slots)
    sim.alloc.free(slots[:present])  # duplicates of what the tree already held
    return present, slots


def match(sim: Sim, tokens: list[int], extra_key: str | None = None):
    m = sim.cache.match_prefix(RadixKey(tokens, extra_key))
    return m.device_indices, m.last_node


def test_match_empty_tree_returns_root():
    sim = Sim()
    idx, node = match(sim, [1, 2, 3])
    assert idx.numel() == 0 and node is sim.cache.root_node and idx.dtype == torch.int64
    sim.check()


def test_match_splits_node_on_partial_match():
    sim = Sim()
    _, s = ins(sim, [1, 2, 3, 4])
    idx, node = match(sim, [1, 2, 5])
    assert idx.tolist() == s[:2].tolist() and node.key.token_ids == [1, 2]
    (child,) = node.children.values()
    assert child.key.token_ids == [3, 4] and child.value.tolist() == s[2:].tolist()
    assert match(sim, [1, 2, 3, 4, 9])[0].tolist() == s.tolist()
    sim.check()


def test_insert_returns_already_present_length_and_keeps_old_slots():
    sim = Sim()
    assert ins(sim, [1, 2, 3])[0] == 0
    s1 = match(sim, [1, 2, 3])[0]
    present, s2 = ins(sim, [1, 2, 3, 4, 5])
    assert present == 3
    assert match(sim, [1, 2, 3, 4, 5])[0].tolist() == s1.tolist() + s2[3:].tolist()
    assert ins(sim, [1, 2, 7])[0] == 2  # splits [1,2,3] at 2
    assert sim.cache.total_size() == 6
    sim.check()


def test_lock_moves_tokens_between_evictable_and_protected():
    sim = Sim()
    ins(sim, [1, 2, 3])
    ins(sim, [1, 2, 4, 5])
    _, node = match(sim, [1, 2, 4, 5])
    c = sim.cache
    assert (c.evictable_size(), c.protected_size()) == (5, 0)
    assert c.inc_lock_ref(node) == -4
    assert (c.evictable_size(), c.protected_size()) == (1, 4)
    assert c.inc_lock_ref(node) == 0
    assert c.dec_lock_ref(node) == 0
    sim.check()
    assert c.dec_lock_ref(node) == 4
    assert (c.evictable_size(), c.protected_size()) == (5, 0)
    sim.check()


def test_evict_lru_order_and_skips_locked():
    sim = Sim()
    ins(sim, [1, 2, 3])
    ins(sim, [4, 5])
    ins(sim, [6, 7, 8])
    match(sim, [4, 5])  # [4,5] becomes most recent; [1,2,3] is the oldest
    assert sim.cache.evict(1) == 3
    assert match(sim, [1, 2, 3])[0].numel() == 0
    _, node = match(sim, [6, 7, 8])
    sim.cache.inc_lock_ref(node)
    assert sim.cache.evict(100) == 2  # only [4,5]; [6,7,8] is locked
    assert match(sim, [6, 7, 8])[0].numel() == 3
    sim.check()
    sim.cache.dec_lock_ref(node)
    assert sim.cache.evict(100) == 3 and sim.alloc.available_size() == sim.size
    sim.check()


def test_evict_cascades_to_parent():
    sim = Sim()
    ins(sim, [1, 2, 3])
    ins(sim, [1, 2, 4])
    assert sim.cache.evict(2) == 2  # both leaves; the parent [1,2] stays
    assert match(sim, [1, 2, 3])[0].numel() == 2
    assert sim.cache.evict(1) == 2  # the parent is now an evictable leaf
    assert sim.cache.total_size() == 0 and sim.alloc.available_size() == sim.size
    sim.check()


def test_evict_never_touches_locked_ancestors():
    sim = Sim()
    ins(sim, [1, 2, 3, 4])
    _, node = match(sim, [1, 2])  # split; lock the upper half
    sim.cache.inc_lock_ref(node)
    assert sim.cache.evict(100) == 2
    assert match(sim, [1, 2])[0].numel() == 2
    sim.check()


def test_lfu_evicts_least_hit_first():
    sim = Sim(policy="lfu")
    ins(sim, [1, 2])
    ins(sim, [3, 4])
    for _ in range(3):
        match(sim, [1, 2])
    match(sim, [3, 4])  # most recent, but hit less often
    assert sim.cache.evict(1) == 2
    assert match(sim, [3, 4])[0].numel() == 0 and match(sim, [1, 2])[0].numel() == 2
    sim.check()


def test_fifo_evicts_oldest_insert_first():
    for policy, survivor in (("fifo", [3, 4]), ("lru", [1, 2])):
        sim = Sim(policy=policy)
        ins(sim, [1, 2])
        ins(sim, [3, 4])
        match(sim, [1, 2])
        assert sim.cache.evict(1) == 2
        assert match(sim, survivor)[0].numel() == 2


def test_unknown_policy_rejected():
    with pytest.raises(ValueError):
        RadixCache(None, None, eviction_policy="nope")


def test_extra_key_namespaces_never_share():
    sim = Sim()
    _, sa = ins(sim, [1, 2, 3], "a")
    assert match(sim, [1, 2, 3])[0].numel() == 0
    assert match(sim, [1, 2, 3], "b")[0].numel() == 0
    assert match(sim, [1, 2, 3], "a")[0].tolist() == sa.tolist()
    assert ins(sim, [1, 2, 3], "b")[0] == 0
    assert ins(sim, [1, 2, 3])[0] == 0
    assert len(sim.cache.root_node.children) == 3
    assert sim.cache.total_size() == 9
    sim.check()


def test_page_size_alignment():
    sim = Sim(page_size=4)
    slots = sim.alloc.alloc(12)
    assert sim.cache.insert(RadixKey(list(range(10))), slots[:10]) == 0
    assert sim.cache.total_size() == 8
    sim.alloc.free(slots[8:])  # the unaligned tail's page is still ours
    assert match(sim, list(range(7)))[0].tolist() == slots[:4].tolist()
    idx, node = match(sim, [0, 1, 2, 3, 4, 5, 99, 7])  # diverges inside the 2nd page
    assert idx.tolist() == slots[:4].tolist() and len(node.key) == 4
    assert match(sim, [0, 1, 2])[0].numel() == 0
    s2 = sim.alloc.alloc(8)
    assert sim.cache.insert(RadixKey([0, 1, 2, 3, 9, 9, 9, 9]), s2) == 4
    sim.alloc.free(s2[:4])
    sim.check()


def test_disable_mode():
    sim = Sim(disable=True)
    ins(sim, [1, 2, 3])
    assert sim.cache.total_size() == 0
    idx, node = match(sim, [1, 2, 3])
    assert idx.numel() == 0 and node is sim.cache.root_node
    assert sim.cache.evict(10) == 0


def test_reset_forgets_tree():
    sim = Sim()
    ins(sim, [1, 2, 3])
    sim.cache.reset()
    assert sim.cache.total_size() == 0 and sim.cache.evictable_size() == 0
    assert "#tokens: 0" in sim.cache.pretty_print()


def test_match_at_is_match_against_the_rest_of_the_key():
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        node = RadixKey(torch.randint(0, 3, (int(torch.randint(1, 9, (1,), generator=g)),), generator=g).tolist())
        ids = torch.randint(0, 3, (12,), generator=g).tolist()
        start, ps = int(torch.randint(0, 13, (1,), generator=g)), int(torch.randint(1, 3, (1,), generator=g))
        assert node.match_at(ids, start, ps) == node.match(RadixKey(ids[start:]), ps)
