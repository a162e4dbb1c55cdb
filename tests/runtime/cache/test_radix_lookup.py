"""Read-only lookups for the RADIX draft source (cache/radix_lookup.py): the k-gram index stays exact under inserts,
splits, eviction, locks and flushes; the whole-sequence walk follows a growing sequence; no lookup changes what
eviction reads (timestamps, hit counts, locks, the eviction queue)."""
import os
import random
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from radix_helpers import Sim  # noqa: E402

from radixlm.runtime.cache.radix_cache import RadixKey  # noqa: E402
from radixlm.runtime.cache.radix_lookup import (  # noqa: E402
    MAX_FANOUT, KGramIndex, follow, start_cursor, tokens_after)

torch.set_num_threads(1)


def ins(sim: Sim, tokens: list[int], extra_key: str | None = None) -> None:
    slots = sim.alloc.alloc(len(tokens) // sim.page_size * sim.page_size)
    present = sim.cache.insert(RadixKey(tokens, extra_key), slots)
    sim.alloc.free(slots[:present])


def indexed(size: int = 256, page_size: int = 1, k: int = 2) -> tuple[Sim, KGramIndex]:
    sim = Sim(size=size, page_size=page_size)
    return sim, sim.cache.enable_kgram_index(k)


def draft(sim: Sim, tokens: list[int], n: int = 4, extra_key: str | None = None) -> list[int] | None:
    hit = sim.cache.kgram_index.find(extra_key, tokens)
    return None if hit is None else tokens_after(hit[0], hit[1], n) or None


def path_tokens(node) -> list[int]:
    parts = []
    while node.parent is not None:
        parts.append(node.key.token_ids)
        node = node.parent
    return [t for p in reversed(parts) for t in p]


def check_index(sim: Sim, complete: bool = True) -> None:
    """Every entry names a live node of the tree where its k tokens end; `complete`: every k tokens the tree holds
    (per namespace) have an entry (not after evictions: an entry names the latest occurrence, and goes with it even
    where an older one survives)."""
    cache, index = sim.cache, sim.cache.kgram_index
    k = index.k
    expected: dict = {}
    for node in cache._nodes():
        if node is cache.root_node:
            continue
        seq = path_tokens(node)
        start = len(seq) - len(node.key)
        for end in range(max(start + 1, k), len(seq) + 1):
            expected.setdefault(node.key.extra_key, set()).add(hash(tuple(seq[end - k : end])))
    got: dict = {}
    live = set(map(id, cache._nodes()))
    for ns, key, node, offset in index.entries():
        got.setdefault(ns, set()).add(key)
        assert node is not None and id(node) in live and not node.deleted and node.key.extra_key == ns
        assert 0 < offset <= len(node.key)
        seq = path_tokens(node)[: len(path_tokens(node)) - len(node.key) + offset]
        assert hash(tuple(seq[-k:])) == key
    extra = {ns: g - expected.get(ns, set()) for ns, g in got.items()}
    assert not any(extra.values()), extra
    missing = {ns: g - got.get(ns, set()) for ns, g in expected.items()}
    assert not complete or not any(missing.values()), missing
    assert set(index._nodes) <= {n.id for n in cache._nodes()}


def snapshot(sim: Sim):
    cache = sim.cache
    nodes = [(n.id, n.last_access_time, n.hit_count, n.lock_ref, len(n.key), tuple(n.children))
             for n in cache._nodes()]
    return nodes, cache._clock, list(cache.evict_queue.heap), cache.evictable_size(), cache.protected_size()


# ---------------------------------------------------------------------- the k-gram index
def test_latest_occurrence_continues_the_latest_tokens():
    sim, index = indexed(k=2)
    ins(sim, [1, 2, 3, 4, 5, 6])
    assert draft(sim, [9, 9, 3, 4]) == [5, 6]
    assert draft(sim, [5, 6]) is None  # cached, but nothing follows
    assert draft(sim, [7, 3]) is None  # (7, 3) never cached
    ins(sim, [8, 3, 4, 10, 11])  # the same two tokens in another context: the latest insert wins
    assert draft(sim, [3, 4]) == [10, 11]
    assert draft(sim, [9, 3]) is None and draft(sim, [3]) is None  # fewer than k tokens: no lookup
    check_index(sim)


def test_index_survives_splits_without_reindexing():
    sim, index = indexed(k=3)
    ins(sim, list(range(1, 11)))
    sim.cache.match_prefix(RadixKey([1, 2, 3, 4, 99]))  # splits [1..10] after 4
    sim.cache.match_prefix(RadixKey([1, 2, 50]))  # and after 2
    (upper,) = sim.cache.root_node.children.values()
    assert upper.key.token_ids == [1, 2]
    assert draft(sim, [1, 2, 3]) == [4, 5, 6, 7]  # position now in the middle node
    assert draft(sim, [2, 3, 4]) == [5, 6, 7, 8]  # ends at the middle node's end: continues into its child
    assert draft(sim, [7, 8, 9], 4) == [10]
    ins(sim, [1, 2, 3, 4, 20, 21])  # a branch after 4: the new leaf is the most recently used child
    assert draft(sim, [2, 3, 4]) == [20, 21]
    assert draft(sim, [3, 4, 20]) == [21]
    check_index(sim)


def test_eviction_removes_the_evicted_tokens_only():
    sim, index = indexed(size=64, k=2)
    ins(sim, [1, 2, 3, 4, 5, 6])
    ins(sim, [1, 2, 3, 7, 8, 9])  # split after 3; [7, 8, 9] is the newer leaf
    assert sim.cache.evict(1) == 3  # the least recently used leaf: [4, 5, 6]
    assert draft(sim, [4, 5]) is None and draft(sim, [3, 4]) is None
    assert draft(sim, [2, 3]) == [7, 8, 9]  # the live branch
    check_index(sim)
    sim.cache.evict(100)
    assert len(index) == 0 and sim.cache.total_size() == 0 and not index._nodes
    check_index(sim)


def test_a_split_moves_entries_to_the_upper_node_and_they_outlive_the_lower_one():
    """A leaf indexed whole, split, then its lower part evicted: its upper part's positions are still found."""
    sim, index = indexed(size=64, k=2)
    ins(sim, [1, 2, 3, 4, 5, 6])
    leaf = next(iter(sim.cache.root_node.children.values()))
    ins(sim, [1, 2, 3, 9])  # split after 3: `leaf` is now [4, 5, 6]; the entries of (1, 2), (2, 3) name [1, 2, 3]
    sim.cache.match_prefix(RadixKey([1, 2, 3, 9]))  # [9] becomes more recently used than [4, 5, 6]
    assert sim.cache.evict(1) == 3 and leaf.deleted
    assert draft(sim, [1, 2]) == [3, 9]
    check_index(sim)


def test_a_hash_collision_drafts_nothing():
    sim, index = indexed(k=2)
    ins(sim, [1, 2, 3, 4])
    m = index._maps[None]
    m[hash((7, 8))] = m[hash((1, 2))]  # (7, 8) as if it hashed like (1, 2)
    assert draft(sim, [7, 8]) is None and draft(sim, [1, 2]) == [3, 4]


def test_locked_nodes_are_read_and_stay_locked():
    sim, index = indexed(size=64, k=2)
    ins(sim, [1, 2, 3, 4, 5, 6])
    m = sim.cache.match_prefix(RadixKey([1, 2, 3, 4, 5, 6]))
    lock, _ = sim.cache.lock(m.last_node, m.length)
    ins(sim, [7, 8, 9])
    before = snapshot(sim)
    assert draft(sim, [2, 3]) == [4, 5, 6]
    assert snapshot(sim) == before
    assert sim.cache.evict(100) == 3  # only the unlocked [7, 8, 9] goes
    assert draft(sim, [2, 3]) == [4, 5, 6] and draft(sim, [7, 8]) is None
    sim.cache.unlock(lock)
    check_index(sim)


def test_namespaces_do_not_draft_from_each_other():
    sim, index = indexed(k=2)
    ins(sim, [1, 2, 3, 4], extra_key="tenant-a")
    assert draft(sim, [1, 2], extra_key="tenant-a") == [3, 4]
    assert draft(sim, [1, 2], extra_key="tenant-b") is None and draft(sim, [1, 2]) is None
    check_index(sim)


def test_flush_clears_and_enabling_late_indexes_what_is_cached():
    sim = Sim(size=64)
    ins(sim, [1, 2, 3, 4])
    index = sim.cache.enable_kgram_index(2)
    assert draft(sim, [2, 3]) == [4]
    assert sim.cache.enable_kgram_index(2) is index
    with pytest.raises(ValueError):
        sim.cache.enable_kgram_index(3)
    sim.cache.reset()
    assert len(index) == 0 and draft(sim, [2, 3]) is None


def test_continuations_stop_where_the_tree_branches_too_widely():
    sim, index = indexed(size=1024, k=2)
    for i in range(MAX_FANOUT + 1):
        ins(sim, [1, 2, 3, 100 + i, 200 + i])
    assert draft(sim, [1, 2], 4) == [3]


@pytest.mark.parametrize("evictions", [False, True], ids=["no-eviction", "eviction"])
@pytest.mark.parametrize("page_size", [1, 2])
def test_random_operations_keep_the_index_exact(page_size, evictions):
    rng = random.Random(page_size)
    sim, index = indexed(size=160 if evictions else 4096, page_size=page_size, k=3)
    locks = []
    for step in range(300):
        op = rng.random()
        toks = [rng.randrange(1, 6) for _ in range(rng.randrange(2, 14) // page_size * page_size)]
        ns = rng.choice([None, None, "x"])
        if op < 0.45:
            need = len(toks)
            if sim.alloc.available_size() < need:
                sim.cache.evict(need)
            if sim.alloc.available_size() >= need:
                ins(sim, toks, ns)
        elif op < 0.7:
            m = sim.cache.match_prefix(RadixKey(toks, ns))
            if rng.random() < 0.3 and m.length:
                locks.append(sim.cache.lock(m.last_node, m.length)[0])
        elif op < 0.85:
            if evictions:
                sim.cache.evict(rng.randrange(1, 20))
        elif locks:
            sim.cache.unlock(locks.pop(rng.randrange(len(locks))))
        before = snapshot(sim)
        got = draft(sim, toks, 5, ns)
        assert snapshot(sim) == before
        assert got is None or 0 < len(got) <= 5
        check_index(sim, complete=not evictions)
    sim.check()
    assert sim.cache.evicted_tokens_total > 0 if evictions else len(index) > 100


# ---------------------------------------------------------------------- the whole sequence
def test_path_cursor_follows_a_growing_sequence_and_new_branches():
    sim = Sim(size=128)
    ins(sim, list(range(1, 11)))
    cur = start_cursor(sim.cache)
    before = snapshot(sim)
    hit = follow(sim.cache, cur, [1, 2, 3, 4], None)
    assert tokens_after(*hit, 3) == [5, 6, 7]
    assert snapshot(sim) == before
    seq = [1, 2, 3, 4, 5, 6]
    assert tokens_after(*follow(sim.cache, cur, seq, None), 3) == [7, 8, 9]
    assert cur.agreed == 6 and cur.node is sim.cache.root_node
    seq += [77]
    assert follow(sim.cache, cur, seq, None) is None and cur.left
    assert follow(sim.cache, cur, seq + [78], None) is None
    ins(sim, [1, 2, 3, 4, 5, 6, 77, 78, 79])  # another request wrote on from there: the old leaf splits
    assert tokens_after(*follow(sim.cache, cur, seq, None), 3) == [78, 79]
    assert not cur.left and cur.depth == 6  # the new upper node [1..6] is wholly on the path
    assert tokens_after(*follow(sim.cache, cur, seq + [78, 79], None), 3) == []  # held, nothing after


def test_path_cursor_is_invalid_once_its_node_is_evicted_or_the_tree_flushed():
    sim = Sim(size=64)
    ins(sim, [1, 2, 3, 4])
    ins(sim, [1, 2, 3, 4, 5, 6])
    cur = start_cursor(sim.cache)
    assert tokens_after(*follow(sim.cache, cur, [1, 2, 3, 4, 5], None), 2) == [6]
    assert cur.depth == 4 and cur.valid(sim.cache)
    sim.cache.evict(100)
    assert not cur.valid(sim.cache)
    ins(sim, [1, 2, 3, 4, 5, 6])
    cur = start_cursor(sim.cache)
    assert follow(sim.cache, cur, [1, 2], None) is not None
    sim.cache.reset()
    assert not cur.valid(sim.cache)


def test_path_cursor_with_pages_matches_a_partial_page_among_children():
    sim = Sim(size=64, page_size=2)
    ins(sim, [1, 2, 3, 4, 5, 6])
    ins(sim, [1, 2, 3, 9, 7, 7])  # same first page, then branches inside the second
    ins(sim, [1, 2, 8, 8])
    cur = start_cursor(sim.cache)
    assert tokens_after(*follow(sim.cache, cur, [1, 2, 3, 4], None), 2) == [5, 6]
    cur = start_cursor(sim.cache)
    assert tokens_after(*follow(sim.cache, cur, [1, 2, 3], None), 3) == [9, 7, 7]  # the most recently used
    assert tokens_after(*follow(sim.cache, cur, [1, 2, 3, 4], None), 3) == [5, 6]  # not stuck on that choice
    assert follow(sim.cache, start_cursor(sim.cache), [1, 2, 5], None) is None
    assert follow(sim.cache, start_cursor(sim.cache), [1, 2, 3, 4], "other") is None
