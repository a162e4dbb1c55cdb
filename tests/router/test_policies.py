"""Policies over fake workers (no HTTP): the cache-aware two-mode decision and its imbalance switch."""
from __future__ import annotations

import random

import pytest

from radixlm.router.policies import (CacheAwareConfig, CacheAwarePolicy, ConsistentHashPolicy, PowerOfTwoPolicy,
                                     PrefixHashPolicy, RoundRobinPolicy, RoutingRequest, is_imbalanced, make_policy)
from radixlm.router.tree import ApproxRadixTree
from radixlm.router.workers import CircuitBreaker, Worker


def workers(*loads: int) -> list[Worker]:
    return [Worker(f"http://w{i}", CircuitBreaker(), healthy=True, in_flight=n) for i, n in enumerate(loads)]


def route(policy, ws, tree, text):
    w = policy.select(ws, RoutingRequest(text))
    tree.insert(text, w.url)  # what the Router does after every selection
    return w


@pytest.mark.parametrize("loads,expected", [
    ([0, 0], False), ([65, 0], True), ([64, 0], False),  # abs gap must exceed 64
    ([300, 210], False),  # gap 90 > 64 but 300 is not > 1.5 x 210
    ([151, 86], True), ([150, 100], False),
])
def test_imbalance_needs_both_thresholds(loads, expected):
    assert is_imbalanced(loads, CacheAwareConfig()) is expected


def test_cache_aware_groups_stick_and_new_groups_spread():
    tree = ApproxRadixTree()
    p = CacheAwarePolicy(tree)
    ws = workers(0, 0)
    for w in ws:
        tree.add_tenant(w.url)
    a = route(p, ws, tree, "SYSTEM PROMPT ALPHA " * 5 + "question 1")
    b = route(p, ws, tree, "SYSTEM PROMPT BETA " * 5 + "question 1")
    assert a is not b, "a new group goes to the worker with the smaller tree"
    assert p.last_mode == "min_load"
    for q in range(2, 6):
        assert route(p, ws, tree, "SYSTEM PROMPT ALPHA " * 5 + f"question {q}") is a
        assert p.last_mode == "cache_hit"
        assert route(p, ws, tree, "SYSTEM PROMPT BETA " * 5 + f"question {q}") is b


def test_cache_aware_below_threshold_goes_to_least_loaded():
    tree = ApproxRadixTree()
    p = CacheAwarePolicy(tree, CacheAwareConfig(cache_threshold=0.5))
    ws = workers(3, 1)
    tree.insert("abcd", ws[0].url)
    # 4 of 10 characters match (rate 0.4 <= 0.5): least loaded wins even though w0 holds the prefix.
    assert p.select(ws, RoutingRequest("abcdefghij")) is ws[1]
    assert p.select(ws, RoutingRequest("abcdef")) is ws[0]  # rate 0.67 > 0.5


def test_imbalance_switch_overrides_affinity():
    tree = ApproxRadixTree()
    cfg = CacheAwareConfig(balance_abs_threshold=2, balance_rel_threshold=1.1)
    p = CacheAwarePolicy(tree, cfg)
    ws = workers(0, 0)
    tree.insert("shared long prefix", ws[0].url)
    assert p.select(ws, RoutingRequest("shared long prefix!")) is ws[0]
    ws[0].in_flight = 3  # gap 3 > 2 and 3 > 0 x 1.1
    assert p.select(ws, RoutingRequest("shared long prefix!")) is ws[1]
    assert p.last_mode == "imbalanced"
    ws[0].in_flight = 2  # gap 2 is not > 2: back to affinity
    assert p.select(ws, RoutingRequest("shared long prefix!")) is ws[0]


def test_shared_prefix_goes_to_least_loaded_owner():
    tree = ApproxRadixTree()
    p = CacheAwarePolicy(tree)
    ws = workers(5, 1, 0)
    tree.insert("common", ws[0].url)
    tree.insert("common", ws[1].url)
    assert p.select(ws, RoutingRequest("common")) is ws[1]


def test_cache_aware_ignores_ineligible_owner():
    tree = ApproxRadixTree()
    p = CacheAwarePolicy(tree)
    ws = workers(0, 4)
    tree.insert("held by w0", ws[0].url)
    # w0 is not offered (unhealthy): the match only counts eligible owners, so it falls to min load.
    assert p.select([ws[1]], RoutingRequest("held by w0")) is ws[1]


def test_round_robin_cycles():
    p, ws = RoundRobinPolicy(), workers(0, 0, 0)
    assert [p.select(ws, RoutingRequest("x")).url for _ in range(6)] == [w.url for w in ws] * 2


def test_power_of_two_prefers_lighter_of_two():
    p, ws = PowerOfTwoPolicy(random.Random(0)), workers(9, 0)
    assert all(p.select(ws, RoutingRequest("")) is ws[1] for _ in range(20))


def test_consistent_hash_is_sticky_and_moves_only_the_removed_workers_keys():
    p, ws = ConsistentHashPolicy(), workers(0, 0, 0)
    keys = [f"session-{i}" for i in range(60)]
    before = {k: p.select(ws, RoutingRequest("text", k)).url for k in keys}
    assert len(set(before.values())) == 3
    assert before == {k: p.select(ws, RoutingRequest("other text", k)).url for k in keys}
    after = {k: p.select(ws[:2], RoutingRequest("text", k)).url for k in keys}
    assert all(after[k] == before[k] for k in keys if before[k] != ws[2].url)


def test_prefix_hash_same_prefix_same_worker_unless_overloaded():
    p, ws = PrefixHashPolicy(prefix_chars=8, load_factor=1.25), workers(0, 0)
    a = p.select(ws, RoutingRequest("PREFIX-1 tail a"))
    assert p.select(ws, RoutingRequest("PREFIX-1 tail b")) is a
    a.in_flight = 10
    assert p.select(ws, RoutingRequest("PREFIX-1 tail c")) is not a


def test_make_policy_names():
    tree = ApproxRadixTree()
    assert make_policy("consistent_hashing", tree, CacheAwareConfig()).name == "consistent_hash"
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("fastest", tree, CacheAwareConfig())
