"""Waiting-queue policies: LPM order and its FCFS fallback, DFS-weight, in-batch prefix dedupe, and the
optimal cache hit rate of Theorem 3.1 under LPM."""
from __future__ import annotations

import random

from radixlm.runtime.scheduler.policy import IN_BATCH_DEPRIORITIZE_THRESHOLD, LPM_FALLBACK_QUEUE_LEN
from radixlm.runtime.scheduler.req import Req

from .conftest import make_scheduler, request, run_all
from .fake_runner import record_plans


def seq(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, 500) for _ in range(n)]


def waiting_reqs(sched, prompts: dict[str, list[int]]) -> list[Req]:
    for rid, ids in prompts.items():
        sched.add_request(request(rid, ids))
    return sched.waiting_queue


def test_lpm_orders_by_longest_cached_prefix(tiny_model_dir):
    rng = random.Random(0)
    sched = make_scheduler(tiny_model_dir)
    a, b = seq(rng, 60), seq(rng, 40)
    sched.add_request(request("warm-a", a + seq(rng, 5), max_new_tokens=1))
    sched.add_request(request("warm-b", b + seq(rng, 5), max_new_tokens=1))
    run_all(sched)
    queue = waiting_reqs(sched, {"none": seq(rng, 30), "short": b[:20] + seq(rng, 10), "long": a + seq(rng, 3), "mid": b + seq(rng, 3)})
    assert sched.policy.calc_priority(queue, 1) == "lpm"
    assert [r.rid for r in queue] == ["long", "mid", "short", "none"]
    assert [len(r.prefix_indices) for r in queue] == [60, 40, 20, 0]


def test_lpm_falls_back_to_fcfs_above_128_waiting(tiny_model_dir):
    rng = random.Random(1)
    sched = make_scheduler(tiny_model_dir)
    a = seq(rng, 40)
    sched.add_request(request("warm", a + [7], max_new_tokens=1))
    run_all(sched)
    prompts = {f"r{i}": seq(rng, 8) for i in range(LPM_FALLBACK_QUEUE_LEN)}
    prompts["hit"] = a + [9]
    queue = waiting_reqs(sched, prompts)
    before = [r.rid for r in queue]
    assert sched.policy.calc_priority(queue, 1) == "fcfs"
    assert [r.rid for r in queue] == before  # arrival order kept, the cache hit is not moved up
    queue.pop(0)  # 128 waiting: LPM again
    assert sched.policy.calc_priority(queue, 2) == "lpm"
    assert queue[0].rid == "hit"


def test_dfs_weight_visits_heavier_subtree_first(tiny_model_dir):
    rng = random.Random(2)
    sched = make_scheduler(tiny_model_dir, schedule_policy="dfs-weight")
    a, b = seq(rng, 30), seq(rng, 30)
    sched.add_request(request("warm-a", a + [5], max_new_tokens=1))
    sched.add_request(request("warm-b", b + [5], max_new_tokens=1))
    run_all(sched)
    queue = waiting_reqs(sched, {"a1": a + seq(rng, 4), "b1": b + seq(rng, 4), "b2": b + seq(rng, 4), "b3": b + seq(rng, 4), "a2": a + seq(rng, 4)})
    assert sched.policy.calc_priority(queue, 1) == "dfs-weight"
    order = [r.rid for r in queue]
    assert sorted(order[:3]) == ["b1", "b2", "b3"] and sorted(order[3:]) == ["a1", "a2"]


def test_in_batch_prefix_dedupe_prefills_shared_prefix_once(tiny_model_dir):
    rng = random.Random(3)
    sched = make_scheduler(tiny_model_dir)
    shared = seq(rng, 48)
    queue = waiting_reqs(sched, {"s1": shared + seq(rng, 6), "other": seq(rng, 20), "s2": shared + seq(rng, 6), "s3": shared + seq(rng, 6)})
    sched.policy.calc_priority(queue, 1)
    assert [r.rid for r in queue][:2] in (["s1", "other"], ["other", "s1"])
    assert {r.rid for r in queue[2:]} == {"s2", "s3"}
    results = run_all(sched)
    assert results["s1"]["cached_tokens"] == 0
    assert results["s2"]["cached_tokens"] >= 48 and results["s3"]["cached_tokens"] >= 48


def test_in_batch_dedupe_needs_the_threshold_of_shared_tokens_under_one_extra_key(tiny_model_dir):
    rng = random.Random(5)
    sched = make_scheduler(tiny_model_dir)
    n = IN_BATCH_DEPRIORITIZE_THRESHOLD
    head = seq(rng, n + 8)
    first = head + seq(rng, 6)

    def diverging_at(k: int) -> list[int]:  # shares exactly k tokens with `first`
        return head[:k] + [first[k] % 496 + 4] + seq(rng, 8)

    queue = waiting_reqs(sched, {"first": first, "short": head[: n // 2], "at_n-1": diverging_at(n - 1),
                                 "at_n": diverging_at(n), "whole": first[:-1] + seq(rng, 3)})
    sched.add_request(request("salted", head + seq(rng, 4), extra_key="salt"))
    sched.add_request(request("salted_too", head + seq(rng, 4), extra_key="salt"))
    sched.policy.calc_priority(queue, 1)
    assert {r.rid for r in sched.policy.deprioritized} == {"at_n", "whole", "salted_too"}
    assert [r.rid for r in queue[-3:]] == ["at_n", "whole", "salted_too"]  # sorted last, in arrival order


def _tree_workload(rng: random.Random) -> tuple[list[list[int]], int]:
    """3-level prefix tree (2 x 3 x 3 leaves); no prompt is a prefix of another. Returns prompts and the
    number of distinct tree tokens (the least any order must compute)."""
    prompts = []
    for _ in range(2):
        root = seq(rng, 40)
        for _ in range(3):
            mid = seq(rng, 12)
            for _ in range(3):
                prompts.append(root + mid + seq(rng, 6))
    return prompts, 2 * 40 + 6 * 12 + 18 * 6


def _hit_rate(tiny_model_dir, policy: str, prompts: list[list[int]], pool: int) -> float:
    # One request per prefill batch (max_prefill_tokens=1: the first is always admitted), so the order
    # of the waiting queue is the order of computation, as in the theorem.
    sched = make_scheduler(tiny_model_dir, schedule_policy=policy, max_total_tokens=pool,
                           max_prefill_tokens=1, chunked_prefill_size=-1)
    for i, p in enumerate(prompts):
        sched.add_request(request(f"r{i}", p, max_new_tokens=1))
    results = run_all(sched)
    return sum(r["cached_tokens"] for r in results.values()) / sum(len(p) for p in prompts)


def test_lpm_reaches_theorem_3_1_optimum_with_a_small_cache(tiny_model_dir):
    rng = random.Random(4)
    prompts, distinct = _tree_workload(rng)
    rng.shuffle(prompts)
    optimum = 1 - distinct / sum(len(p) for p in prompts)
    pool = max(len(p) for p in prompts) + 8  # the theorem's condition: cache >= the longest request
    assert abs(_hit_rate(tiny_model_dir, "lpm", prompts, pool) - optimum) < 1e-9
    assert abs(_hit_rate(tiny_model_dir, "dfs-weight", prompts, pool) - optimum) < 1e-9
    assert _hit_rate(tiny_model_dir, "fcfs", prompts, pool) < optimum - 0.1


def test_fcfs_admits_one_of_requests_sharing_an_uncached_prefix_per_round(tiny_model_dir):
    rng = random.Random(6)
    sched = make_scheduler(tiny_model_dir, schedule_policy="fcfs")
    shared = seq(rng, 48)
    queue = waiting_reqs(sched, {"s1": shared + seq(rng, 6), "s2": shared + seq(rng, 6), "other": seq(rng, 20)})
    assert [r.rid for r in queue] == ["s1", "s2", "other"]
    plans = record_plans(sched)
    results = run_all(sched)
    assert [[r.rid for r in b.new_reqs] for b in plans if b.new_reqs] == [["s1", "other"], ["s2"]]
    assert results["s2"]["cached_tokens"] >= 48 and results["s1"]["cached_tokens"] == 0


def test_without_a_radix_cache_siblings_are_admitted_together(tiny_model_dir):
    rng = random.Random(6)
    sched = make_scheduler(tiny_model_dir, schedule_policy="fcfs", disable_radix_cache=True)
    shared = seq(rng, 48)
    waiting_reqs(sched, {"s1": shared + seq(rng, 6), "s2": shared + seq(rng, 6), "other": seq(rng, 20)})
    plans = record_plans(sched)
    run_all(sched)
    assert [[r.rid for r in b.new_reqs] for b in plans if b.new_reqs] == [["s1", "s2", "other"]]


def test_a_prompt_in_the_prefill_pass_in_flight_holds_back_its_siblings(tiny_model_dir):
    rng = random.Random(7)
    sched = make_scheduler(tiny_model_dir, overlap_schedule="on")
    shared = seq(rng, 48)
    sched.add_request(request("s1", shared + seq(rng, 6), max_new_tokens=8))
    sched.step()
    assert sched.inflight is not None and [r.rid for r in sched.inflight.batch.new_reqs] == ["s1"]
    sched.add_request(request("s2", shared + seq(rng, 6)))
    sched.add_request(request("other", seq(rng, 20)))
    sched.step()  # launched before s1's prompt is in the tree
    assert [r.rid for r in sched.waiting_queue] == ["s2"]
    results = run_all(sched)
    assert results["s2"]["cached_tokens"] >= 48
