"""Request deadlines over FakeRunner (no model): the waiting and running limits and a request's own timeout_s abort
with their finish reasons, free the request's KV (the integrity check runs after every step), and leave the other
requests' outputs as they were; the limits come from the flags, else SGLang's environment variables."""
from __future__ import annotations

import time

import pytest

from radixlm.runtime.args import ServerArgs
from radixlm.runtime.scheduler.deadlines import (
    RUNNING_TIMEOUT_ENV, RUNNING_TIMEOUT_MESSAGE, WAITING_TIMEOUT_ENV, WAITING_TIMEOUT_MESSAGE, DeadlineConfig,
    request_timeout_message,
)
from radixlm.runtime.scheduler.event_loop import QueueInbox, SchedulerLoop

from .conftest import request, run_all
from .fake_runner import make_fake_scheduler, make_prompts, reference
from .fake_serving import assert_all_free


def find(sched, rid):
    return next(r for r in [*sched.waiting_queue, *sched.running, sched.chunked_req] if r is not None and r.rid == rid)


def expire(sched, rid: str, attr: str, seconds: float) -> None:
    """Moves a request's clock back, as if `seconds` had passed since `attr` (arrived, started_at)."""
    req = find(sched, rid)
    setattr(req, attr, getattr(req, attr) - seconds)
    sched.abort_expired(sched.expired(time.monotonic()))


def check_prefix(res: dict, req) -> None:
    got = res[req.rid]["output_ids"]
    assert got == reference(req.input_ids, len(got))


def test_a_request_past_the_waiting_limit_is_aborted_before_any_prefill():
    sched = make_fake_scheduler(req_waiting_timeout=5.0, max_running_requests=1)
    first, queued = (request(f"r{i}", p, max_new_tokens=8) for i, p in enumerate(make_prompts(1, 2)))
    sched.add_request(first)
    sched.add_request(queued)
    sched.step()
    assert sched.expired(time.monotonic()) == []
    expire(sched, "r1", "arrived", 6.0)
    res = run_all(sched)
    assert res["r1"] == {"output_ids": [], "finish_reason": {"type": "abort", "message": WAITING_TIMEOUT_MESSAGE,
                                                                "status_code": 503},
                         "cached_tokens": 0, "num_retractions": 0, "prompt_tokens": len(queued.input_ids)}
    assert res["r0"]["output_ids"] == reference(first.input_ids, 8)
    assert sched.stats["deadline_aborts"] == 1
    assert_all_free(sched)


@pytest.mark.parametrize("kwargs", [{}, {"overlap_schedule": "on", "page_size": 4}, {"chunked_prefill_size": 8}])
def test_a_request_past_the_running_limit_is_aborted_and_its_kv_freed(kwargs):
    sched = make_fake_scheduler(req_running_timeout=30.0, **kwargs)
    reqs = [request(f"r{i}", p, max_new_tokens=30) for i, p in enumerate(make_prompts(2, 3, lo=20, hi=40))]
    for r in reqs:
        sched.add_request(r)
    for _ in range(6):
        sched.step()
    res: dict = {}
    expire(sched, "r1", "started_at", 31.0)
    for out in sched.step():  # the abort takes effect at the next step
        res.setdefault(out.rid, {"output_ids": []})["output_ids"] += out.new_output_ids
        res[out.rid]["finish_reason"] = out.finished_reason
    assert "r1" not in [r.rid for r in sched.running]
    for rid, r in run_all(sched).items():
        res.setdefault(rid, {"output_ids": []})["output_ids"] += r.pop("output_ids")
        res[rid].update(r)
    assert res["r1"]["finish_reason"] == {"type": "abort", "message": RUNNING_TIMEOUT_MESSAGE, "status_code": 503}
    check_prefix(res, reqs[1])
    for r in (reqs[0], reqs[2]):
        assert res[r.rid]["output_ids"] == reference(r.input_ids, 30)
    assert_all_free(sched)


def test_a_requests_own_timeout_ends_it_with_what_it_generated():
    sched = make_fake_scheduler()
    timed = request("t", make_prompts(3, 1)[0], max_new_tokens=40, timeout_s=2.0)
    queued = request("q", make_prompts(4, 1)[0], max_new_tokens=4, timeout_s=2.0)
    sched.add_request(timed)
    for _ in range(4):
        sched.step()
    sched.add_request(queued)
    expire(sched, "t", "arrived", 3.0)
    assert sched.expired(time.monotonic()) == []  # "t" is being aborted; "q" arrived just now
    res = run_all(sched)
    assert res["t"]["finish_reason"] == {"type": "abort", "message": request_timeout_message(2.0)}
    assert 0 < len(res["t"]["output_ids"]) < 40
    check_prefix(res, timed)
    assert res["q"]["output_ids"] == reference(queued.input_ids, 4)
    assert sched.expired(time.monotonic()) == [] and not sched.deadlines.timed  # finished ones are forgotten
    assert_all_free(sched)


def test_the_loop_finds_expired_requests():
    sched = make_fake_scheduler()
    inbox, outputs = QueueInbox(), []
    loop = SchedulerLoop(sched, inbox, deliver=outputs.extend, reply=lambda *a: None, keep_going=lambda: False)
    inbox.put(request("t", make_prompts(5, 1)[0], max_new_tokens=2000, timeout_s=0.05))
    loop.run()
    done = [o.finished_reason for o in outputs if o.finished_reason is not None]
    assert done == [{"type": "abort", "message": request_timeout_message(0.05)}]
    assert_all_free(sched)


def test_the_limits_come_from_the_flags_else_the_environment():
    env = {WAITING_TIMEOUT_ENV: "12.5", RUNNING_TIMEOUT_ENV: "0"}
    assert DeadlineConfig.from_args(ServerArgs(), env) == DeadlineConfig(12.5, None)  # 0: no limit, as in SGLang
    flags = ServerArgs(req_waiting_timeout=0.0, req_running_timeout=60.0)
    assert DeadlineConfig.from_args(flags, env) == DeadlineConfig(None, 60.0)  # the flags win
    assert DeadlineConfig.from_args(ServerArgs(), {}) == DeadlineConfig(None, None)
    with pytest.raises(ValueError, match=WAITING_TIMEOUT_ENV):
        DeadlineConfig.from_args(ServerArgs(), {WAITING_TIMEOUT_ENV: "soon"})
    with pytest.raises(ValueError, match="req_running_timeout"):
        ServerArgs(req_running_timeout=-1.0)
