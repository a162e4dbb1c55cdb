"""Failed attempts against fake workers (httpx.MockTransport): what is resent to another worker (always what the
worker never got, once what it may have read when it broke, never what it answered), which failures eject the
worker (passive health check), and the error shapes. Quarantine of poison requests: test_quarantine.py."""
from __future__ import annotations

import random
import time

import httpx
import orjson
import pytest

from radixlm.router.app import WORKER_HEADER
from radixlm.router.args import RouterArgs
from radixlm.router.failures import Backoff, Delivery, Effect, failure_of_exception, failure_of_status
from tests.router.fakes import FakeFleet, Mode, run

REQ = httpx.Request("POST", "http://w:1/generate")
A, B = "http://a:1", "http://b:1"


NOT_SENT, MAYBE_READ, ANSWERED = Delivery.NOT_SENT, Delivery.MAYBE_READ, Delivery.ANSWERED


@pytest.mark.parametrize("exc,delivery,effect,status", [
    (httpx.ConnectError, NOT_SENT, Effect.REFUSED, 502),
    (httpx.ConnectTimeout, NOT_SENT, Effect.COUNT, 502),
    (httpx.PoolTimeout, NOT_SENT, Effect.NONE, 503),
    (httpx.WriteError, NOT_SENT, Effect.EJECT, 502),  # the request was not fully written
    (httpx.WriteTimeout, NOT_SENT, Effect.EJECT, 504),
    (httpx.ReadError, MAYBE_READ, Effect.EJECT, 502),
    (httpx.RemoteProtocolError, MAYBE_READ, Effect.EJECT, 502),
    (httpx.ReadTimeout, ANSWERED, Effect.EJECT, 504),  # it may still be running it
])
def test_exceptions_are_classified_by_what_the_worker_can_have_seen(exc, delivery, effect, status):
    f = failure_of_exception(exc("boom", request=REQ), A)
    assert (f.delivery, f.effect, f.status) == (delivery, effect, status)
    assert A in f.message


def test_statuses():
    busy = failure_of_status(503, A)
    assert busy is not None and busy.delivery is NOT_SENT and busy.effect is Effect.NONE
    for status in (500, 502, 504):
        f = failure_of_status(status, A)
        assert f is not None and f.delivery is ANSWERED and f.effect is Effect.EJECT and f.status == status
    assert all(failure_of_status(s, A) is None for s in (200, 204, 400, 404, 429))


def state(router, url: str) -> dict:
    return next(w for w in router.describe_workers() if w["url"] == url)


@pytest.mark.parametrize("mode,ejected,breaker_failures", [
    (Mode.REFUSE, True, 0),  # nothing listens: the worker is down
    (Mode.CONNECT_TIMEOUT, False, 1),
    (Mode.POOL_TIMEOUT, False, 0),  # the router's own limit, not the worker's fault
    (Mode.BUSY, False, 0),  # a live worker saying "busy"
])
def test_failures_before_acceptance_are_resent(mode, ejected, breaker_failures):
    fleet = FakeFleet("a", "b")
    fleet.mode["a"] = mode

    async def go(c, router):
        r = await c.post("/generate", json={"text": "hello"})
        assert r.status_code == 200 and r.headers[WORKER_HEADER] == B
        assert fleet.received["b"] == [{"text": "hello"}]
        a = router.registry.workers[A]
        assert a.healthy is not ejected and a.breaker.failures == breaker_failures
        assert state(router, A)["circuit"] == ("open" if ejected else "closed")

    run(fleet, go, policy="round_robin")


@pytest.mark.parametrize("mode,status", [(Mode.READ_TIMEOUT, 504), (Mode.ERROR, 500)])
def test_answered_failures_are_not_resent_and_eject_the_worker(mode, status):
    fleet = FakeFleet("a", "b")
    fleet.mode["a"] = mode

    async def go(c, router):
        r = await c.post("/generate", json={"text": "poison"})
        assert r.status_code == status and r.headers[WORKER_HEADER] == A
        if mode is Mode.ERROR:
            assert r.json()["message"] == "scheduler crashed"  # the worker's own answer, passed on
        else:
            assert r.json()["object"] == "error" and "not resent" in r.json()["message"]
        assert fleet.received["a"] == [{"text": "poison"}] and fleet.received["b"] == []
        listed = {w["url"]: w for w in (await c.get("/workers")).json()["workers"]}
        assert listed[A]["healthy"] is False and listed[A]["circuit"] == "open" and listed[A]["ejections"] == 1
        assert listed[B]["healthy"] is True
        for i in range(3):
            r = await c.post("/generate", json={"text": f"fine {i}"})
            assert r.status_code == 200 and r.headers[WORKER_HEADER] == B
        assert f'radixlm_router:worker_ejections_total{{worker="{A}"}} 1.0' in (await c.get("/metrics")).text

    run(fleet, go, policy="round_robin")


@pytest.mark.parametrize("mode", [Mode.DROP, Mode.READ_ERROR])
def test_a_request_its_worker_broke_on_is_resent_once_and_the_worker_ejected(mode):
    fleet = FakeFleet("a", "b")
    fleet.mode["a"] = mode

    async def go(c, router):
        r = await c.post("/generate", json={"text": "bystander"})
        assert r.status_code == 200 and r.headers[WORKER_HEADER] == B
        assert fleet.received["a"] == fleet.received["b"] == [{"text": "bystander"}]
        listed = {w["url"]: w for w in (await c.get("/workers")).json()["workers"]}
        assert listed[A]["healthy"] is False and listed[A]["circuit"] == "open" and listed[A]["ejections"] == 1
        metrics = (await c.get("/metrics")).text
        assert 'radixlm_router:resends_total{kind="maybe_read"} 1.0' in metrics
        assert f'radixlm_router:worker_ejections_total{{worker="{A}"}} 1.0' in metrics
        assert (await c.get("/quarantine")).json()["suspected"] == 0, "it succeeded elsewhere: no suspect"

    run(fleet, go, policy="round_robin")


def test_a_broken_request_with_no_other_worker_is_not_resent():
    fleet = FakeFleet("a")
    fleet.mode["a"] = Mode.DROP

    async def go(c, router):
        r = await c.post("/generate", json={"text": "x"})
        assert r.status_code == 502 and r.headers[WORKER_HEADER] == A
        assert "not resent (no other worker could take it)" in r.json()["message"]
        assert (await c.get("/quarantine")).json() == {"quarantined": 0, "suspected": 1, "quarantine_secs": 600.0}

    run(fleet, go)


def test_not_sent_after_a_break_still_moves_on():
    """a breaks with the request; its one resend goes to b, which refuses it (never got it): c serves it."""
    fleet = FakeFleet("a", "c", "b")  # round robin: a (0 of a, c, b), then b (1 of c, b), then c
    fleet.mode["a"], fleet.mode["b"] = Mode.DROP, Mode.REFUSE

    async def go(c, router):
        r = await c.post("/generate", json={"text": "x"})
        assert r.status_code == 200 and r.headers[WORKER_HEADER] == "http://c:1"
        assert len(fleet.received["a"]) == 1 and len(fleet.received["c"]) == 1 and fleet.received["b"] == []
        metrics = (await c.get("/metrics")).text
        assert 'radixlm_router:resends_total{kind="maybe_read"} 1.0' in metrics
        assert 'radixlm_router:resends_total{kind="not_sent"} 1.0' in metrics

    run(fleet, go, policy="round_robin", retry_initial_backoff_ms=1)


def test_resends_wait_the_backoff():
    fleet = FakeFleet("a", "b")
    fleet.mode["a"] = Mode.REFUSE

    async def go(c, router):
        t0 = time.monotonic()
        r = await c.post("/generate", json={"text": "x"})
        assert r.status_code == 200 and r.headers[WORKER_HEADER] == B
        assert time.monotonic() - t0 >= 0.3 * (1 - 0.2) - 0.01

    run(fleet, go, policy="round_robin", retry_initial_backoff_ms=300)


def test_backoff_delays():
    b = Backoff(initial_s=0.05, max_s=0.1, multiplier=1.5, jitter=0.0)
    assert [round(b.delay_s(n), 6) for n in range(3)] == [0.05, 0.075, 0.1]
    jittered = Backoff(initial_s=1.0, max_s=30.0, multiplier=2.0, jitter=0.2)
    rand = random.Random(0)
    delays = [jittered.delay_s(2, rand) for _ in range(200)]
    assert all(3.2 <= d <= 4.8 for d in delays) and max(delays) - min(delays) > 0.5
    args = RouterArgs(retry_initial_backoff_ms=10, retry_max_backoff_ms=20, retry_backoff_multiplier=3,
                      retry_jitter_factor=0)
    assert Backoff.of(args) == Backoff(0.01, 0.02, 3.0, 0.0)
    with pytest.raises(ValueError):
        RouterArgs(retry_initial_backoff_ms=100, retry_max_backoff_ms=10)
    with pytest.raises(ValueError):
        RouterArgs(quarantine_secs=0)


def test_503_is_retried_500_is_not():
    fleet = FakeFleet("a", "b")

    async def go(c, router):
        fleet.mode["a"] = Mode.BUSY
        r = await c.post("/generate", json={"text": "one"})
        assert r.status_code == 200 and len(fleet.received["a"]) == 1 and len(fleet.received["b"]) == 1
        assert router.registry.workers[A].healthy
        fleet.mode["a"] = Mode.ERROR
        r = await c.post("/generate", json={"text": "two"})  # round robin: a again
        assert r.status_code == 500 and len(fleet.received["a"]) == 2 and len(fleet.received["b"]) == 1
        assert not router.registry.workers[A].healthy

    run(fleet, go, policy="round_robin")


def test_with_retries_disabled_a_refused_request_is_a_502():
    fleet = FakeFleet("a", "b")
    fleet.mode["a"] = Mode.REFUSE

    async def go(c, router):
        r = await c.post("/generate", json={"text": "x"})
        assert r.status_code == 502 and "no worker accepted the request (1 tried" in r.json()["message"]
        assert fleet.received["b"] == []

    run(fleet, go, policy="round_robin", disable_retries=True)


CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


def error_of(path: str, payload: dict) -> tuple[str, str]:
    """(message, type) out of an error body in the shape the path's API uses."""
    if path.startswith("/v1/messages"):
        assert payload["type"] == "error" and set(payload["error"]) == {"type", "message"}
        return payload["error"]["message"], payload["error"]["type"]
    if path.startswith("/v1/"):
        assert set(payload) == {"error"} and set(payload["error"]) == {"message", "type", "param", "code"}
        return payload["error"]["message"], payload["error"]["type"]
    assert payload["object"] == "error"
    return payload["message"], payload["type"]


@pytest.mark.parametrize("path,body,err_type", [
    ("/generate", {"text": "hi"}, "ServiceUnavailableError"),
    ("/v1/chat/completions", CHAT, "ServiceUnavailableError"),
    ("/v1/messages", CHAT, "overloaded_error"),
])
def test_no_healthy_worker_in_each_apis_shape_with_retry_after(path, body, err_type):
    fleet = FakeFleet("a")
    fleet.mode["a"] = Mode.DOWN

    async def go(c, router):
        r = await c.post(path, json=body)
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert error_of(path, r.json()) == ("no healthy worker available", err_type)

    run(fleet, go)


@pytest.mark.parametrize("path,body", [("/generate", {"text": "hi"}), ("/v1/chat/completions", CHAT),
                                       ("/v1/messages", CHAT)])
def test_worker_failure_in_each_apis_shape(path, body):
    fleet = FakeFleet("a", "b")
    fleet.mode["a"] = Mode.READ_TIMEOUT

    async def go(c, router):
        r = await c.post(path, json=body)
        assert r.status_code == 504 and fleet.received["b"] == []
        message, _ = error_of(path, r.json())
        assert A in message and "not resent" in message

    run(fleet, go, policy="round_robin")


def sse_events(raw: bytes) -> list[tuple[str | None, dict | str]]:
    out = []
    for block in raw.decode().strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.split("\n"))
        data = fields["data"]
        out.append((fields.get("event"), data if data == "[DONE]" else orjson.loads(data)))
    return out


@pytest.mark.parametrize("path,body", [("/generate", {"text": "hi"}), ("/v1/chat/completions", CHAT),
                                       ("/v1/messages", CHAT)])
def test_stream_broken_after_its_first_byte_ends_with_an_error_event(path, body):
    fleet = FakeFleet("a", "b")
    fleet.mode["a"] = Mode.BREAK_STREAM

    async def go(c, router):
        async with c.stream("POST", path, json={**body, "stream": True}) as r:
            assert r.status_code == 200
            raw = b"".join([chunk async for chunk in r.aiter_raw()])
        events = sse_events(raw)
        assert len(events) == 2 and fleet.received["b"] == []
        name, data = events[-1]
        if path.startswith("/v1/messages"):
            assert name == "error"
            message, _ = error_of(path, data)
        elif path.startswith("/v1/"):
            message, _ = error_of(path, data)
        else:
            message, _ = error_of(path, data["error"])
        assert A in message and "not resent" in message
        assert not router.registry.workers[A].healthy and router.registry.workers[A].in_flight == 0

    run(fleet, go, policy="round_robin")
