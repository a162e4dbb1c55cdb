"""Priority scheduling over FakeRunner (no model): admission by rank, preemption of lower-priority running requests
through retraction (outputs identical to an unpreempted run: the fake model's reference continuations), the
starvation bound (aging), and the KV accounting checked after every step (enable_integrity_check)."""
from __future__ import annotations

import pytest

from radixlm.runtime.scheduler.priority import PRIORITY_DISABLED_MESSAGE
from radixlm.runtime.scheduler.req import Req

from .conftest import make_scheduler, request, run_all
from .fake_runner import make_fake_scheduler, make_prompts, record_plans, reference
from .fake_serving import assert_all_free, assert_reference

LOW, HIGH = 0, 100


def low_requests(n: int, max_new: int = 24, lo: int = 30, hi: int = 35):
    return [request(f"low{i}", p, max_new_tokens=max_new, priority=LOW)
            for i, p in enumerate(make_prompts(7, n, lo=lo, hi=hi))]


def decode_until_running(sched, rids: set[str], steps: int = 50) -> None:
    for _ in range(steps):
        sched.step()
        if {r.rid for r in sched.running if r.output_ids} >= rids:
            return
    raise AssertionError(f"{rids} never all decoded")


FULL_BATCH = [
    pytest.param({"max_running_requests": 4}, 4, id="slots"),
    pytest.param({"max_running_requests": 4, "overlap_schedule": "on"}, 4, id="slots-overlap"),
    pytest.param({"max_running_requests": 4, "page_size": 4, "chunked_prefill_size": 8}, 4, id="slots-page4-chunked"),
    # The KV pool, not the slots: the running requests hold it and the high one's prompt does not fit beside them.
    pytest.param({"max_total_tokens": 160, "chunked_prefill_size": -1}, 3, id="kv"),
    pytest.param({"max_total_tokens": 160, "chunked_prefill_size": -1, "overlap_schedule": "on"}, 3, id="kv-overlap"),
]


@pytest.mark.parametrize("kwargs, n_low", FULL_BATCH)
def test_a_high_priority_request_at_a_full_batch_starts_in_one_step(kwargs, n_low):
    sched = make_fake_scheduler(enable_priority_scheduling=True, **kwargs)
    plans = record_plans(sched)
    lows = low_requests(n_low)
    for r in lows:
        sched.add_request(r)
    decode_until_running(sched, {r.rid for r in lows})
    high = request("high", make_prompts(8, 1, lo=40, hi=41)[0], max_new_tokens=8, priority=HIGH)
    sched.add_request(high)
    before = len(plans)
    sched.step()
    assert "high" in [r.rid for b in plans[before:] for r in b.new_reqs]  # admitted by the very next step
    assert sched.stats["preemptions"] >= 1
    out = run_all(sched)
    assert_reference(out, [high] + [r for r in lows if r.rid in out])
    preempted = {rid for rid, r in out.items() if r["num_retractions"]}
    assert preempted and "high" not in preempted
    assert_all_free(sched)


def test_preempted_requests_finish_as_an_unpreempted_run_and_resume_from_the_cache():
    sched = make_fake_scheduler(enable_priority_scheduling=True, max_running_requests=2)
    plans = record_plans(sched)
    lows = low_requests(2, max_new=30, lo=40, hi=60)
    for r in lows:
        sched.add_request(r)
    decode_until_running(sched, {"low0", "low1"})
    for _ in range(3):
        sched.step()
    had = {r.rid: len(r.output_ids) for r in sched.running}
    highs = [request(f"high{i}", p, max_new_tokens=6, priority=HIGH) for i, p in enumerate(make_prompts(9, 2))]
    for r in highs:
        sched.add_request(r)
    sched.step()
    assert {r.rid for r in sched.running} == {"high0", "high1"}  # both lows preempted at once
    out = run_all(sched)
    assert_reference(out, lows + highs)
    for low in lows:
        assert out[low.rid]["num_retractions"] == 1
        # Admitted twice; the second time its prompt and the output it had were a cached prefix (its KV stayed in
        # the radix tree).
        starts = [b.worker.prefix_lens[b.reqs.index(r)] for b in plans for r in b.new_reqs if r.rid == low.rid]
        assert len(starts) == 2 and starts[1] == len(low.input_ids) + had[low.rid] - 1
    assert sched.stats["preemptions"] == 2 and sched.stats["retractions"] == 0
    assert_all_free(sched)


def test_no_preemption_within_the_threshold_or_without_priority_scheduling():
    for kwargs, priority in (({"enable_priority_scheduling": True}, 10), ({}, HIGH)):
        sched = make_fake_scheduler(max_running_requests=2, **kwargs)
        lows = low_requests(2, max_new=12)
        for r in lows:
            sched.add_request(r)
        decode_until_running(sched, {"low0", "low1"})
        sched.add_request(request("high", make_prompts(8, 1)[0], max_new_tokens=4, priority=priority))
        sched.step()
        assert {r.rid for r in sched.running} == {"low0", "low1"}
        out = run_all(sched)
        assert sched.stats["preemptions"] == 0
        assert_reference(out, lows + [request("high", make_prompts(8, 1)[0], max_new_tokens=4)])


@pytest.mark.parametrize("low_values_first", [False, True])
def test_waiting_requests_are_admitted_by_priority_then_arrival(low_values_first):
    sched = make_fake_scheduler(enable_priority_scheduling=True, max_running_requests=1, schedule_policy="fcfs",
                                schedule_low_priority_values_first=low_values_first, default_priority_value=5)
    prompts = make_prompts(3, 5)
    plans = record_plans(sched)
    prios = [None, 1, 9, 9, 1]  # None: the default, 5
    for i, (p, prio) in enumerate(zip(prompts, prios)):
        sched.add_request(request(f"r{i}", p, max_new_tokens=2, priority=prio))
    run_all(sched)
    order = [r.rid for b in plans for r in b.new_reqs]
    assert order == (["r1", "r4", "r0", "r2", "r3"] if low_values_first else ["r2", "r3", "r0", "r1", "r4"])


def test_aging_bounds_starvation():
    """A low-priority request that has waited (priority gap) x aging interval is admitted before newer
    higher-priority ones."""
    sched = make_fake_scheduler(enable_priority_scheduling=True, max_running_requests=1, priority_aging_interval=1.0)
    plans = record_plans(sched)
    sched.add_request(request("old", make_prompts(4, 1)[0], max_new_tokens=2, priority=0))
    sched.add_request(request("busy", make_prompts(5, 1)[0], max_new_tokens=2, priority=3))
    sched.waiting_queue[0].wait_since -= 4.0  # "old" has waited 4 s: rank 0 + 4 > 3
    run_all(sched)
    assert [r.rid for b in plans for r in b.new_reqs] == ["old", "busy"]
    x = Req.from_input(request("x", [5, 6], priority=2), frozenset())
    assert sched.priority.rank(x, x.arrived + 2.5) == 4 and sched.priority.rank(x, x.arrived) == 2
    x.admitted_at(x.arrived + 1.5)  # running: its rank stays
    assert sched.priority.rank(x, x.arrived + 60) == 3
    x.requeued_at(x.arrived + 60)  # preempted: ages again from where it was
    assert sched.priority.rank(x, x.arrived + 61) == 4


def test_a_priority_on_a_server_without_priority_scheduling():
    ignored = make_fake_scheduler()
    res = run_all_after(ignored, request("p", [5, 6, 7], max_new_tokens=3, priority=HIGH))
    assert res["p"]["output_ids"] == reference([5, 6, 7], 3)
    refused = make_fake_scheduler(abort_on_priority_when_disabled=True)
    res = run_all_after(refused, request("p", [5, 6, 7], max_new_tokens=3, priority=HIGH))
    assert res["p"]["finish_reason"] == {"type": "abort", "message": PRIORITY_DISABLED_MESSAGE, "status_code": 503}
    res = run_all_after(refused, request("q", [5, 6, 7], max_new_tokens=3))
    assert res["q"]["output_ids"] == reference([5, 6, 7], 3)


def run_all_after(sched, req) -> dict:
    sched.add_request(req)
    return run_all(sched)


@pytest.mark.parametrize("kwargs", [
    {"max_running_requests": 3},
    {"max_running_requests": 3, "overlap_schedule": "on", "page_size": 4, "chunked_prefill_size": 16},
    {"max_total_tokens": 200, "schedule_conservativeness": 0.3},  # preemption and pool retraction together
    {"max_running_requests": 4, "speculative_algorithm": "NGRAM", "overlap_schedule": "on"},
], ids=["slots", "overlap-page4-chunked", "tiny-pool", "drafts"])
def test_random_priorities_and_arrivals_keep_every_output(kwargs):
    """Requests of random priorities arrive while others decode, sharing prefixes (lpm's in-batch deferral meets the
    priority order): every output is the unpreempted run's."""
    import random

    rng = random.Random(5)
    sched = make_fake_scheduler(enable_priority_scheduling=True, priority_scheduling_preemption_threshold=0, **kwargs)
    shared = make_prompts(11, 1, lo=40, hi=41)[0]
    prompts = make_prompts(12, 6, lo=5, hi=30) + make_prompts(13, 6, lo=5, hi=20, prefix=shared)
    rng.shuffle(prompts)
    reqs = [request(f"r{i}", p, max_new_tokens=rng.randrange(8, 30), priority=rng.randrange(0, 9))
            for i, p in enumerate(prompts)]
    out: dict = {}
    for r in reqs:
        sched.add_request(r)
        for _ in range(rng.randrange(0, 3)):
            for o in sched.step():
                out.setdefault(o.rid, {"output_ids": []})["output_ids"] += o.new_output_ids
    for rid, r in run_all(sched).items():
        out.setdefault(rid, {"output_ids": []})["output_ids"] += r.pop("output_ids")
        out[rid].update(r)
    for r in reqs:
        assert out[r.rid]["output_ids"] == reference(r.input_ids, r.sampling_params.max_new_tokens), r.rid
    assert sched.stats["preemptions"] > 0
    assert_all_free(sched)


def test_preemption_keeps_a_real_models_outputs(tiny_model_dir):
    """The tiny random-weight Llama (real attention over the resumed cached prefix): the preempted request's greedy
    tokens are those of an unpreempted run."""
    ps = make_prompts(21, 3, lo=20, hi=40)
    sched = make_scheduler(tiny_model_dir, enable_priority_scheduling=True, max_running_requests=2,
                           max_total_tokens=512)

    def reqs(tag: str, priorities: tuple[int, int, int]):
        return [request(f"{tag}{i}", p, max_new_tokens=n, priority=prio)
                for i, (p, n, prio) in enumerate(zip(ps, (16, 16, 6), priorities))]

    for r in reqs("plain", (LOW, LOW, LOW)):  # equal priorities: nothing is preempted
        sched.add_request(r)
    baseline = [r["output_ids"] for _, r in sorted(run_all(sched).items())]
    assert sched.stats["preemptions"] == 0 and sched.flush_cache()
    low0, low1, high = reqs("r", (LOW, LOW, HIGH))
    sched.add_request(low0)
    sched.add_request(low1)
    decode_until_running(sched, {"r0", "r1"})
    for _ in range(3):
        sched.step()
    sched.add_request(high)
    res = run_all(sched)
    assert sched.stats["preemptions"] == 1 and res["r1"]["num_retractions"] == 1
    assert [r["output_ids"] for _, r in sorted(res.items())] == baseline
    sched.check_memory()
