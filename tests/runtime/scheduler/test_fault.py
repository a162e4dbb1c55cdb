"""Fault isolation: an error in one request's data fails that request only; a step that raises fails the requests
holding KV and leaves consistent pools; steps failing in a row (or a device fault) are fatal."""
from __future__ import annotations

import pytest

from radixlm.runtime.scheduler.req import Req
from radixlm.runtime.scheduler.fault import MAX_FAILED_STEPS, FatalSchedulerError, StepGuard, is_device_fault
from radixlm.runtime.scheduler.scheduler import Scheduler
from tests.runtime.scheduler.conftest import make_scheduler, request, run_all


def run_guarded(sched: Scheduler, guard: StepGuard) -> dict:
    return run_all(sched, 2_000, step=guard.step)


def test_error_in_one_requests_token_fails_only_that_request(tiny_model_dir, monkeypatch):
    sched = make_scheduler(tiny_model_dir)
    original = Req.append_tokens

    def flaky(req, tokens, *args, **kwargs):
        if req.rid == "bad" and len(req.output_ids) == 2:
            raise ValueError("broken logprob data")
        return original(req, tokens, *args, **kwargs)

    monkeypatch.setattr(Req, "append_tokens", flaky)
    for rid in ("a", "bad", "b"):
        sched.add_request(request(rid, [5, 6, 7, 8, 9 + len(rid)], max_new_tokens=6))
    guard = StepGuard(sched)
    res = run_guarded(sched, guard)
    assert res["bad"]["finish_reason"]["type"] == "abort"
    assert res["bad"]["finish_reason"]["status_code"] == 500
    assert "broken logprob data" in res["bad"]["finish_reason"]["message"]
    for rid in ("a", "b"):
        assert res[rid]["finish_reason"]["type"] == "length" and len(res[rid]["output_ids"]) == 6
    assert guard.failed_steps == 0
    sched.check_memory()


def test_bad_request_data_on_arrival_fails_that_request(tiny_model_dir):
    sched = make_scheduler(tiny_model_dir)
    broken = request("broken", [5, 6, 7])
    broken.sampling_params = None  # data the front never sends: the scheduler must not die on it
    sched.add_request(broken)
    sched.add_request(request("ok", [5, 6, 7], max_new_tokens=3))
    res = run_guarded(sched, StepGuard(sched))
    assert res["broken"]["finish_reason"]["status_code"] == 500
    assert res["ok"]["finish_reason"]["type"] == "length"


def test_failed_step_fails_running_requests_and_the_next_ones_run(tiny_model_dir, monkeypatch):
    sched = make_scheduler(tiny_model_dir)
    for rid in ("a", "b"):
        sched.add_request(request(rid, [5, 6, 7, 8], max_new_tokens=8))
    guard = StepGuard(sched)
    guard.step()  # both prefilled: they hold KV
    forward = sched.runner.forward
    calls = {"n": 0}

    def fail_once(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("kernel failed")
        return forward(*args, **kwargs)

    monkeypatch.setattr(sched.runner, "forward", fail_once)
    failed = {o.rid: o.finished_reason for o in guard.step()}
    assert set(failed) == {"a", "b"}
    assert all(fr["type"] == "abort" and fr["status_code"] == 500 and "kernel failed" in fr["message"]
               for fr in failed.values())
    assert guard.failed_steps == 1
    sched.check_memory()
    assert sched.allocator.available_size() == sched.allocator.size
    sched.add_request(request("c", [5, 6, 7, 8], max_new_tokens=3))
    res = run_guarded(sched, guard)
    assert res["c"]["finish_reason"]["type"] == "length" and len(res["c"]["output_ids"]) == 3
    assert guard.failed_steps == 0


def test_steps_failing_in_a_row_are_fatal(tiny_model_dir, monkeypatch):
    sched = make_scheduler(tiny_model_dir)

    def always(*args, **kwargs):
        raise RuntimeError("broken pool")

    monkeypatch.setattr(sched.runner, "forward", always)
    guard = StepGuard(sched)
    for i in range(MAX_FAILED_STEPS - 1):
        sched.add_request(request(f"r{i}", [5, 6, 7], max_new_tokens=3))
        outs = guard.step()
        assert [o.finished_reason["status_code"] for o in outs] == [500]
    sched.add_request(request("last", [5, 6, 7], max_new_tokens=3))
    with pytest.raises(FatalSchedulerError, match="broken pool"):
        guard.step()


def test_device_faults_are_recognised():
    assert is_device_fault(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert not is_device_fault(RuntimeError("selected index k out of range"))
    assert not is_device_fault(ValueError("CUDA error"))


def test_many_aborts_take_one_pass(tiny_model_dir):
    sched = make_scheduler(tiny_model_dir)
    for i in range(300):
        sched.add_request(request(f"q{i}", [5, 6, 7], max_new_tokens=3))
    sched.abort_requests([f"q{i}" for i in range(0, 300, 2)])
    assert len(sched.waiting_queue) == 150
    res = run_guarded(sched, StepGuard(sched))
    aborted = [rid for rid, r in res.items() if r["finish_reason"]["type"] == "abort"]
    assert sorted(aborted) == sorted(f"q{i}" for i in range(0, 300, 2))
    assert all("status_code" not in res[rid]["finish_reason"] for rid in aborted)  # an abort asked for is no error
