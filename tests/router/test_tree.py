"""The approximate radix tree: unit tests, and property tests against a plain model (the set of strings each
tenant was given)."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from radixlm.router.tree import ApproxRadixTree


def lcp(a: str, b: str) -> int:
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    return i


def test_insert_and_match_one_tenant():
    t = ApproxRadixTree()
    t.insert("hello world", "w1")
    r = t.prefix_match("hello there")
    assert (r.matched_chars, r.input_chars, r.tenants) == (6, 11, ("w1",))
    assert r.match_rate == 6 / 11
    assert t.char_count == {"w1": 11}
    t.check_invariants()


def test_split_keeps_both_tenants_and_deepest_owner_wins():
    t = ApproxRadixTree()
    t.insert("system prompt A: question 1", "w1")
    t.insert("system prompt B: question 2", "w2")
    t.check_invariants()
    assert t.prefix_match("system prompt A: question 9").tenants == ("w1",)
    assert t.prefix_match("system prompt B").tenants == ("w2",)
    # Both hold "system prompt " (14 chars): the most recent user comes first.
    r = t.prefix_match("system prompt C")
    assert r.matched_chars == 14 and r.tenants == ("w2", "w1")
    assert t.char_count == {"w1": 27, "w2": 27}


def test_allowed_tenants_restrict_the_match():
    t = ApproxRadixTree()
    t.insert("abcdef", "w1")
    t.insert("abc", "w2")
    assert t.prefix_match("abcdef").tenants == ("w1",)
    r = t.prefix_match("abcdef", allowed={"w2"})
    assert (r.matched_chars, r.tenants) == (3, ("w2",))
    assert t.prefix_match("abcdef", allowed=set()).matched_chars == 0


def test_empty_text_and_registered_tenants():
    t = ApproxRadixTree()
    t.add_tenant("w1")
    assert t.tenants() == ["w1"] and t.char_count == {"w1": 0}
    r = t.prefix_match("")
    assert r.matched_chars == 0 and r.match_rate == 0.0
    t.insert("", "w2")
    assert t.char_count == {"w1": 0, "w2": 0}
    t.check_invariants()


def test_eviction_peels_lru_leaves_bottom_up():
    t = ApproxRadixTree()
    t.insert("aaaa-old", "w1")
    t.insert("bbbb-new", "w1")
    t.insert("aaaa-old", "w2")
    evicted = t.evict_tenant_by_size(8)
    assert evicted == {"w1": 8}
    assert t.match_tenant("bbbb-new", "w1") == 8
    assert t.match_tenant("aaaa-old", "w1") == 0
    assert t.match_tenant("aaaa-old", "w2") == 8  # another tenant's copy is untouched
    t.check_invariants()


def test_remove_and_clear_tenant():
    t = ApproxRadixTree()
    t.insert("shared prefix / one", "w1")
    t.insert("shared prefix / two", "w2")
    t.remove_tenant("w1")
    assert t.tenants() == ["w2"]
    assert t.prefix_match("shared prefix / one").tenants == ("w2",)
    t.clear_tenant("w2")
    assert t.char_count == {"w2": 0}
    assert t.root.children == {}
    t.check_invariants()


def test_remove_prefix_keeps_shorter_prefixes():
    t = ApproxRadixTree()
    t.insert("doc A: question 1", "w1")
    t.insert("doc A: question 2", "w1")
    t.insert("doc B", "w1")
    dropped = t.remove_prefix("doc A: q", "w1")
    assert dropped == len("question ") + 2  # the shared "question " once, then "1" and "2"
    assert t.match_tenant("doc A: question 1", "w1") == len("doc A: ")
    assert t.match_tenant("doc B", "w1") == 5
    assert t.remove_prefix("zzz", "w1") == 0 and t.remove_prefix("doc", "nobody") == 0
    t.check_invariants()


texts = st.text(alphabet="abc", max_size=12)
tenants = st.sampled_from(["w1", "w2", "w3"])
ops = st.lists(st.tuples(texts, tenants), max_size=30)


@settings(max_examples=150, deadline=None)
@given(ops, st.lists(texts, min_size=1, max_size=5))
def test_matches_the_model(inserts, queries):
    t = ApproxRadixTree()
    held: dict[str, list[str]] = {}
    for s, w in inserts:
        t.insert(s, w)
        held.setdefault(w, []).append(s)
    t.check_invariants()
    for w, strs in held.items():
        prefixes = {s[:k] for s in strs for k in range(1, len(s) + 1)}
        assert t.char_count[w] == len(prefixes)
    for q in queries:
        per = {w: max(lcp(q, s) for s in strs) for w, strs in held.items()}
        for w, m in per.items():
            assert t.match_tenant(q, w) == m
        r = t.prefix_match(q)
        best = max(per.values(), default=0)
        assert r.matched_chars == best
        if best > 0:
            assert set(r.tenants) == {w for w, m in per.items() if m == best}


@settings(max_examples=150, deadline=None)
@given(ops, st.integers(min_value=0, max_value=15))
def test_eviction_respects_budget_and_keeps_the_newest(inserts, budget):
    t = ApproxRadixTree()
    last: dict[str, str] = {}
    for s, w in inserts:
        t.insert(s, w)
        last[w] = s
    before = {w: {q: t.match_tenant(q, w) for q, _ in inserts} for w in last}
    t.evict_tenant_by_size(budget)
    t.check_invariants()
    for w, s in last.items():
        assert t.char_count[w] <= budget
        if len(s) <= budget:
            assert t.match_tenant(s, w) == len(s), "the most recently used string is evicted last"
        for q, m in before[w].items():
            assert t.match_tenant(q, w) <= m


@settings(max_examples=150, deadline=None)
@given(ops, texts.filter(bool), tenants, st.lists(texts, min_size=1, max_size=5))
def test_remove_prefix_model(inserts, prefix, tenant, queries):
    t = ApproxRadixTree()
    for s, w in inserts:
        t.insert(s, w)
    before = {q: t.match_tenant(q, tenant) for q in queries + [prefix]}
    others = {(q, w): t.match_tenant(q, w) for q in queries for w in t.tenants() if w != tenant}
    t.remove_prefix(prefix, tenant)
    t.check_invariants()
    assert t.match_tenant(prefix, tenant) == min(before[prefix], len(prefix) - 1)
    for q in queries:
        if q.startswith(prefix):
            assert t.match_tenant(q, tenant) == min(before[q], len(prefix) - 1)
        else:
            assert t.match_tenant(q, tenant) == before[q]
    assert {k: t.match_tenant(*k) for k in others} == others


@settings(max_examples=100, deadline=None)
@given(ops, tenants)
def test_remove_tenant_model(inserts, gone):
    t = ApproxRadixTree()
    held: dict[str, list[str]] = {}
    for s, w in inserts:
        t.insert(s, w)
        held.setdefault(w, []).append(s)
    t.remove_tenant(gone)
    t.check_invariants()
    assert gone not in t.tenants()
    for w, strs in held.items():
        for s in strs:
            assert t.match_tenant(s, w) == (0 if w == gone else len(s))
