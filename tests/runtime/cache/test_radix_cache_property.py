"""Random insert / match / lock / unlock / evict sequences against a model dict prefix -> KV slot."""
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixlm.runtime.cache.memory_pool import ReqToTokenPool, TokenToKVPoolAllocator
from radixlm.runtime.cache.radix_cache import RadixCache, RadixKey

torch.set_num_threads(1)
POOL = 64

# Tiny alphabet plus a common stem, so keys share prefixes and end inside each other's nodes.
_STEM = [0, 1, 2, 0, 1, 2, 0, 1, 2, 0]
_tail_st = st.lists(st.integers(0, 2), max_size=8)
tokens_st = st.one_of(
    st.lists(st.integers(0, 2), max_size=14),
    st.builds(lambda cut, tail: _STEM[:cut] + tail, st.integers(0, len(_STEM)), _tail_st),
)
extra_st = st.sampled_from([None, None, None, "x"])
op_st = st.one_of(
    st.tuples(st.just("insert"), tokens_st, extra_st),
    st.tuples(st.just("match"), tokens_st, extra_st),
    st.tuples(st.just("lock"), tokens_st, extra_st),
    st.tuples(st.just("unlock"), st.integers(0, 99)),
    st.tuples(st.just("evict"), st.integers(1, 24)),
)

# Pages are the unit of sharing: the model maps (extra_key, *tokens up to a page end) -> that page's slots.
Prefix = tuple


def tree_mapping(cache: RadixCache, ps: int) -> dict[Prefix, tuple[int, ...]]:
    """Every cached page-aligned prefix -> the KV slots of its last page, read off the tree."""
    out: dict[Prefix, tuple[int, ...]] = {}
    stack = [(cache.root_node, ())]
    while stack:
        node, toks = stack.pop()
        for child in node.children.values():
            ctoks, slots = toks, child.value.tolist()
            for j in range(0, len(child.key), ps):
                ctoks = ctoks + tuple(child.key.token_ids[j : j + ps])
                out[(child.key.extra_key, *ctoks)] = tuple(slots[j : j + ps])
            stack.append((child, ctoks))
    return out


def expected_match(model: dict[Prefix, tuple[int, ...]], tokens: list[int], extra, ps: int) -> list[int]:
    slots: list[int] = []
    for end in range(ps, len(tokens) + 1, ps):
        page = model.get((extra, *tokens[:end]))
        if page is None:
            break
        slots.extend(page)
    return slots


def check_invariants(cache: RadixCache, alloc: TokenToKVPoolAllocator) -> None:
    cache.check_consistency()
    alloc.check_no_double_free()
    assert cache.evictable_size() + cache.protected_size() == cache.total_size()
    assert alloc.available_size() + cache.total_size() == POOL  # no request holds slots here


@settings(max_examples=200, deadline=None)
@given(ps=st.sampled_from([1, 4]), policy=st.sampled_from(["lru", "lfu", "fifo"]), ops=st.lists(op_st, max_size=30))
def test_random_ops_keep_tree_exact(ps, policy, ops):
    alloc = TokenToKVPoolAllocator(POOL, ps, "cpu")
    cache = RadixCache(ReqToTokenPool(1, 8, "cpu"), alloc, page_size=ps, eviction_policy=policy)
    model: dict[Prefix, int] = {}
    locks: list[tuple] = []  # (node, extra, tokens matched)
    for op in ops:
        kind = op[0]
        if kind == "insert":
            _, tokens, extra = op
            n = len(tokens) // ps * ps
            if n > alloc.available_size():
                cache.evict(n - alloc.available_size())
                now = tree_mapping(cache, ps)  # what the eviction left (checked in the "evict" op below)
                assert all(model[p] == s for p, s in now.items())
                model = now
            value = alloc.alloc(n)
            if value is None:
                continue
            present = cache.insert(RadixKey(tokens, extra), value)
            assert present == len(expected_match(model, tokens, extra, ps))
            alloc.free(value[:present])
            for end in range(ps, n + 1, ps):
                model.setdefault((extra, *tokens[:end]), tuple(value[end - ps : end].tolist()))
        elif kind in ("match", "lock"):
            _, tokens, extra = op
            m = cache.match_prefix(RadixKey(tokens, extra))
            want = expected_match(model, tokens, extra, ps)
            assert m.device_indices.tolist() == want
            if kind == "lock":
                before = cache.evictable_size()
                delta = cache.inc_lock_ref(m.last_node)
                assert cache.evictable_size() - before == delta <= 0
                locks.append((m.last_node, extra, tokens[: len(want)]))
        elif kind == "unlock":
            if locks:
                node, _, _ = locks.pop(op[1] % len(locks))
                before = cache.evictable_size()
                delta = cache.dec_lock_ref(node)
                assert cache.evictable_size() - before == delta >= 0
        else:
            evictable_before = cache.evictable_size()
            evicted = cache.evict(op[1])
            assert evicted >= min(op[1], evictable_before)
            assert evicted == evictable_before - cache.evictable_size()
            now = tree_mapping(cache, ps)
            assert all(model[p] == s for p, s in now.items())
            gone = [s for p, page in model.items() if p not in now for s in page]
            assert len(gone) == evicted
            if gone:
                assert bool(alloc.page_is_free[torch.tensor(gone) // ps].all())
            for _, extra, toks in locks:  # locked paths survive
                assert all((extra, *toks[:end]) in now for end in range(ps, len(toks) + 1, ps))
            model = now
        check_invariants(cache, alloc)
    assert tree_mapping(cache, ps) == model
    for node, _, _ in locks:
        cache.dec_lock_ref(node)
    cache.evict(POOL)
    assert cache.total_size() == 0 and alloc.available_size() == POOL
    check_invariants(cache, alloc)


def insert_evicting(cache: RadixCache, alloc: TokenToKVPoolAllocator, tokens: list[int], extra, ps: int) -> None:
    """Inserts tokens with fresh slots (evicting first if the pool is short); the tree keeps its own for a prefix."""
    n = len(tokens) // ps * ps
    if n > alloc.available_size():
        cache.evict(n - alloc.available_size())
    value = alloc.alloc(n)
    if value is not None:
        alloc.free(value[: cache.insert(RadixKey(tokens, extra), value)])


@settings(max_examples=150, deadline=None)
@given(ps=st.sampled_from([1, 4]), policy=st.sampled_from(["lru", "lfu", "fifo"]), ops=st.lists(op_st, max_size=30))
def test_incremental_eviction_order_equals_a_full_scan(ps, policy, ops):
    """The eviction queue is kept incrementally; each eviction must take the leaf a scan of the whole tree picks."""
    alloc = TokenToKVPoolAllocator(POOL, ps, "cpu")
    cache = RadixCache(ReqToTokenPool(1, 8, "cpu"), alloc, page_size=ps, eviction_policy=policy)
    locks = []
    for op in ops:
        if op[0] == "insert":
            insert_evicting(cache, alloc, op[1], op[2], ps)
        elif op[0] in ("match", "lock"):
            m = cache.match_prefix(RadixKey(op[1], op[2]))
            if op[0] == "lock":
                cache.inc_lock_ref(m.last_node)
                locks.append(m.last_node)
        elif op[0] == "unlock" and locks:
            cache.dec_lock_ref(locks.pop(op[1] % len(locks)))
    while True:
        leaves = [n for n in cache._nodes() if n is not cache.root_node and n.is_leaf() and n.lock_ref == 0]
        if not leaves:
            assert cache.evict(1) == 0
            break
        want = min(leaves, key=lambda n: (cache.eviction_strategy(n), n.id))
        assert cache.evict(1) == len(want.key) and want.deleted
        cache.check_consistency()


@settings(max_examples=200, deadline=None)
@given(ps=st.sampled_from([1, 4]), ops=st.lists(op_st, max_size=30))
def test_match_unchanged_means_the_same_match(ps, ops):
    """The scheduler skips re-matching a waiting request while match_unchanged holds: a fresh match must then end at
    the same node after the same number of tokens, whatever inserts, splits and evictions happened meanwhile."""
    alloc = TokenToKVPoolAllocator(POOL, ps, "cpu")
    cache = RadixCache(ReqToTokenPool(1, 8, "cpu"), alloc, page_size=ps)
    watched: dict[tuple, tuple] = {}  # (tokens, extra) -> (last_node, length, generation) at its last match
    for op in ops:
        if op[0] == "insert":
            insert_evicting(cache, alloc, op[1], op[2], ps)
        elif op[0] == "evict":
            cache.evict(op[1])
        elif op[0] == "unlock" and op[1] % 7 == 0:
            cache.reset()
            alloc.clear()
        elif op[0] in ("match", "lock"):
            watched[(tuple(op[1]), op[2])] = None
        for (tokens, extra), seen in list(watched.items()):
            if seen is not None and cache.match_unchanged(seen[0], list(tokens), len(tokens), extra, seen[1], seen[2]):
                m = cache.match_prefix(RadixKey(list(tokens), extra))
                assert (m.last_node, m.length) == seen[:2]
            else:
                m = cache.match_prefix(RadixKey(list(tokens), extra))
            watched[(tokens, extra)] = (m.last_node, m.length, cache.generation)
