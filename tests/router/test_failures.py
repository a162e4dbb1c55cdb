"""Failed attempts against fake workers (httpx.MockTransport): what is resent to another worker (only what the
worker never accepted), which failures eject the worker (passive health check), and the error shapes."""
from __future__ import annotations

import httpx
import orjson
import pytest

from radixlm.router.app import WORKER_HEADER
from radixlm.router.failures import Effect, failure_of_exception, failure_of_status
from tests.router.fakes import FakeFleet, Mode, run

REQ = httpx.Request("POST", "http://w:1/generate")
A, B = "http://a:1", "http://b:1"


@pytest.mark.parametrize("exc,resend,effect,status", [
    (httpx.ConnectError, True, Effect.EJECT, 502),
    (httpx.ConnectTimeout, True, Effect.COUNT, 502),
    (httpx.PoolTimeout, True, Effect.NONE, 503),
    (httpx.ReadError, False, Effect.EJECT, 502),
    (httpx.RemoteProtocolError, False, Effect.EJECT, 502),
    (httpx.WriteError, False, Effect.EJECT, 502),
    (httpx.ReadTimeout, False, Effect.EJECT, 504),
    (httpx.WriteTimeout, False, Effect.EJECT, 504),
])
def test_exceptions_are_resent_only_before_acceptance(exc, resend, effect, status):
    f = failure_of_exception(exc("boom", request=REQ), A)
    assert (f.resend, f.effect, f.status) == (resend, effect, status)
    assert A in f.message and (resend or "not resent" in f.message)


def test_statuses():
    busy = failure_of_status(503, A)
    assert busy is not None and busy.resend and busy.effect is Effect.NONE
    for status in (500, 502, 504):
        f = failure_of_status(status, A)
        assert f is not None and not f.resend and f.effect is Effect.EJECT and f.status == status
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


@pytest.mark.parametrize("mode,status", [
    (Mode.DROP, 502), (Mode.READ_ERROR, 502), (Mode.READ_TIMEOUT, 504), (Mode.ERROR, 500)])
def test_failures_after_acceptance_are_not_resent_and_eject_the_worker(mode, status):
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
    fleet.mode["a"] = Mode.DROP

    async def go(c, router):
        r = await c.post(path, json=body)
        assert r.status_code == 502 and fleet.received["b"] == []
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
