"""The loop shared by the scheduler process and the Engine, over the tiny scheduler and a QueueInbox (one thread)."""
from __future__ import annotations

from radixlm.runtime.messages import (
    AbortReq, FlushCacheReq, FlushCacheReqOutput, GetInternalStateReq, GetInternalStateReqOutput, ShutdownReq,
)
from radixlm.runtime.scheduler.event_loop import QueueInbox, SchedulerLoop
from tests.runtime.scheduler.conftest import make_scheduler, request


def make_loop(sched, stop_when_idle: bool = True):
    inbox, outputs, replies, seen = QueueInbox(), [], [], []
    loop = SchedulerLoop(sched, inbox, deliver=outputs.extend, reply=lambda req, answer: replies.append((req, answer)),
                         keep_going=lambda: not stop_when_idle, on_request=lambda m: seen.append(m.rid))
    return loop, inbox, outputs, replies, seen


def finished(outputs) -> dict:
    return {o.rid: o.finished_reason for o in outputs if o.finished_reason is not None}


def test_runs_requests_to_the_end_and_stops_when_idle(tiny_model_dir):
    sched = make_scheduler(tiny_model_dir)
    loop, inbox, outputs, _, seen = make_loop(sched)
    assert sched.output_sink is not None
    for rid in ("a", "b"):
        inbox.put(request(rid, [5, 6, 7, len(rid)], max_new_tokens=3))
    loop.run()
    assert seen == ["a", "b"]
    assert {rid: r["type"] for rid, r in finished(outputs).items()} == {"a": "length", "b": "length"}
    assert sum(len(o.new_output_ids) for o in outputs if o.rid == "a") == 3
    assert sched.is_idle()


def test_aborts_flush_and_state_are_answered(tiny_model_dir):
    sched = make_scheduler(tiny_model_dir)
    loop, inbox, outputs, replies, _ = make_loop(sched)
    inbox.put(request("gone", [5, 6, 7], max_new_tokens=50))
    inbox.put(request("kept", [5, 6, 8], max_new_tokens=2))
    inbox.put(AbortReq(["gone"]))
    inbox.put(GetInternalStateReq())
    loop.run()
    assert finished(outputs)["gone"]["type"] == "abort" and finished(outputs)["kept"]["type"] == "length"
    state_req, state = replies[0]
    assert isinstance(state_req, GetInternalStateReq) and isinstance(state, GetInternalStateReqOutput)
    assert state.state["num_waiting_reqs"] == 2  # answered before the batched aborts and the first step
    flush = FlushCacheReq()
    inbox.put(flush)
    loop.run()
    assert replies[1] == (flush, FlushCacheReqOutput(True))


def test_shutdown_stops_the_loop_with_work_pending(tiny_model_dir):
    sched = make_scheduler(tiny_model_dir)
    loop, inbox, outputs, _, seen = make_loop(sched, stop_when_idle=False)
    inbox.put(request("a", [5, 6, 7], max_new_tokens=50))
    inbox.put(ShutdownReq())
    inbox.put(request("never", [5, 6, 9]))
    loop.run()
    assert seen == ["a"] and not sched.is_idle()


def run_recording_deliveries(sched, progress_every_s: float) -> list[list]:
    """One non-streaming request of 12 tokens to its end; returns what each delivery carried."""
    inbox, deliveries = QueueInbox(), []
    loop = SchedulerLoop(sched, inbox, deliver=lambda outs: deliveries.append(list(outs)), reply=lambda *_: None,
                         keep_going=lambda: False, progress_every_s=progress_every_s)
    inbox.put(request("long", [5, 6, 7], max_new_tokens=12))
    loop.run()
    return deliveries


def test_passes_deliver_progress_while_a_non_streaming_request_has_no_output_due(tiny_model_dir):
    # The tokenizer manager's watchdog counts deliveries: a long non-streaming request must not look like a stall.
    deliveries = run_recording_deliveries(make_scheduler(tiny_model_dir), progress_every_s=0.0)
    final = [i for i, outs in enumerate(deliveries) if any(o.finished_reason for o in outs)]
    assert final == [len(deliveries) - 1]
    assert len(deliveries) >= 10 and all(outs == [] for outs in deliveries[:-1])


def test_no_progress_deliveries_within_the_interval(tiny_model_dir):
    deliveries = run_recording_deliveries(make_scheduler(tiny_model_dir), progress_every_s=3600.0)
    assert len(deliveries) == 1 and deliveries[0][0].finished_reason is not None
