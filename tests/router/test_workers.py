"""Health hysteresis, the circuit breaker and load counting, with a fake clock and a mock transport."""
from __future__ import annotations

import asyncio

import httpx
import pytest

from radixlm.router.workers import (CircuitBreaker, CircuitConfig, CircuitState, HealthConfig, LoadGuard,
                                    WorkerRegistry, normalize_url)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def worker_added(self, url): self.events.append(("added", url))
    def worker_removed(self, url): self.events.append(("removed", url))
    def worker_down(self, url): self.events.append(("down", url))


def registry(handler=None, clock=None):
    transport = httpx.MockTransport(handler or (lambda req: httpx.Response(200)))
    return WorkerRegistry(HealthConfig(failure_threshold=3, success_threshold=2), CircuitConfig(failure_threshold=2,
                          success_threshold=2, timeout_s=10), httpx.AsyncClient(transport=transport), clock or Clock())


def test_health_hysteresis():
    reg = registry()
    rec = Recorder()
    reg.listeners.append(rec)
    w = reg.add("http://w1:1/")
    assert w.url == "http://w1:1" and not w.healthy
    reg.record_check(w, True, first=True)
    assert w.healthy
    reg.record_check(w, False)
    reg.record_check(w, False)
    reg.record_check(w, True)  # a success resets the failure streak
    reg.record_check(w, False)
    reg.record_check(w, False)
    assert w.healthy
    reg.record_check(w, False)
    assert not w.healthy and rec.events == [("added", "http://w1:1"), ("down", "http://w1:1")]
    reg.record_check(w, True)
    assert not w.healthy
    reg.record_check(w, True)
    assert w.healthy


def test_circuit_breaker_opens_half_opens_and_closes():
    clock = Clock()
    cb = CircuitBreaker(CircuitConfig(failure_threshold=2, success_threshold=2, timeout_s=10), clock)
    cb.record(False)
    assert cb.allows()
    cb.record(False)
    assert cb.state == CircuitState.OPEN and not cb.allows()
    clock.t = 10
    assert cb.allows() and cb.state == CircuitState.HALF_OPEN
    cb.record(False)  # a failed probe reopens at once
    assert cb.state == CircuitState.OPEN and not cb.allows()
    clock.t = 20
    assert cb.allows()
    cb.record(True)
    cb.record(True)
    assert cb.state == CircuitState.CLOSED


def test_open_circuit_makes_worker_ineligible():
    reg = registry()
    w = reg.add("http://w1:1")
    reg.record_check(w, True, first=True)
    assert reg.eligible() == [w]
    w.breaker.record(False)
    w.breaker.record(False)
    assert reg.eligible() == []


def test_load_guard_counts_once():
    reg = registry()
    w = reg.add("http://w1:1")
    g1, g2 = LoadGuard(w), LoadGuard(w)
    assert w.in_flight == 2
    g1.release()
    g1.release()
    assert w.in_flight == 1
    g2.release()
    assert w.in_flight == 0


def test_registry_rejects_bad_and_duplicate_urls():
    reg = registry()
    reg.add("http://w1:1")
    with pytest.raises(ValueError, match="already"):
        reg.add("http://w1:1/")
    with pytest.raises(ValueError, match="http://host:port"):
        reg.add("w1:1")
    with pytest.raises(KeyError):
        reg.remove("http://nope:1")
    assert normalize_url(" https://a:2/ ") == "https://a:2"


def test_probe_marks_down_and_up_over_http():
    """A health check that gets an answer other than 200 goes through the hysteresis both ways."""
    up = {"w1": True}

    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.host == "w1" and not up["w1"]:
            return httpx.Response(500)
        return httpx.Response(200 if req.url.path == "/health" else 404)

    async def go():
        reg = registry(handler)
        w = reg.add("http://w1:1")
        await reg.check_all(first=True)
        assert w.healthy
        up["w1"] = False
        for _ in range(2):
            await reg.check_all()
        assert w.healthy
        await reg.check_all()
        assert not w.healthy
        up["w1"] = True
        await reg.check_all()
        assert not w.healthy
        await reg.check_all()
        assert w.healthy
        await reg.client.aclose()

    asyncio.run(go())


def test_a_refused_probe_marks_down_at_once_and_one_pass_brings_it_back():
    up = {"w1": True}

    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.host == "w1" and not up["w1"]:
            raise httpx.ConnectError("refused")
        return httpx.Response(200 if req.url.path == "/health" else 404)

    async def go():
        reg = registry(handler)
        rec = Recorder()
        reg.listeners.append(rec)
        w = reg.add("http://w1:1")
        await reg.check_all(first=True)
        assert w.healthy
        up["w1"] = False
        await reg.check_all()
        assert not w.healthy and rec.events.count(("down", "http://w1:1")) == 1
        await reg.check_all()
        up["w1"] = True  # restarted
        await reg.check_all()
        assert w.healthy and not w.refused
        await reg.client.aclose()

    asyncio.run(go())


def test_a_refused_request_ejects_and_one_pass_brings_it_back():
    reg = registry(clock=Clock())
    w = reg.add("http://w1:1")
    reg.record_check(w, True, first=True)
    assert reg.eject(w, "connection refused", refused=True)
    assert not w.healthy and w.breaker.state == CircuitState.OPEN
    reg.record_check(w, True)
    assert reg.eligible() == [w] and w.breaker.state == CircuitState.CLOSED
    assert reg.eject(w, "connection reset")  # broke on a request: not known to be a new process
    reg.record_check(w, True)
    assert reg.eligible() == []
    reg.record_check(w, True)
    assert reg.eligible() == [w]


def test_ejection_opens_the_circuit_and_only_active_checks_bring_the_worker_back():
    clock = Clock()
    reg = registry(clock=clock)
    rec = Recorder()
    reg.listeners.append(rec)
    w = reg.add("http://w1:1")
    reg.record_check(w, True, first=True)
    reg.record_check(w, True)  # a streak of passes from before the failure must not count
    assert reg.eject(w, "connection reset") is True
    assert not w.healthy and w.breaker.state == CircuitState.OPEN and w.ejections == 1
    assert reg.eject(w, "a second request in flight failed too") is False
    assert rec.events.count(("down", "http://w1:1")) == 1 and w.ejections == 2
    clock.t = 1000  # far past the circuit's timeout: time alone brings nothing back
    assert reg.eligible() == []
    reg.record_check(w, True)
    assert reg.eligible() == []
    reg.record_check(w, True)
    assert reg.eligible() == [w] and w.breaker.state == CircuitState.CLOSED


def test_a_probe_sent_before_an_ejection_does_not_count():
    release = asyncio.Event()

    async def handler(req: httpx.Request) -> httpx.Response:
        await release.wait()
        return httpx.Response(200)

    async def go():
        reg = registry(handler)
        w = reg.add("http://w1:1")
        w.healthy = True
        probe = asyncio.create_task(reg.check(w))
        await asyncio.sleep(0)  # the probe is on its way
        reg.eject(w, "read error")
        release.set()
        await probe
        assert not w.healthy and w.check_successes == 0
        await reg.client.aclose()

    asyncio.run(go())


def test_down_workers_are_checked_every_down_interval():
    checks: dict[str, int] = {"up": 0, "down": 0}

    def handler(req: httpx.Request) -> httpx.Response:
        checks[req.url.host] += 1
        return httpx.Response(200)

    async def go():
        reg = WorkerRegistry(HealthConfig(interval_s=60.0, down_interval_s=0.01), CircuitConfig(),
                             httpx.AsyncClient(transport=httpx.MockTransport(handler)))
        up, down = reg.add("http://up:1"), reg.add("http://down:1")
        await reg.check_all(first=True)
        reg.eject(down, "worker died")
        task = asyncio.create_task(reg.run_health_checks())
        try:
            async with asyncio.timeout(30):
                while not down.healthy:
                    await asyncio.sleep(0.01)
        finally:
            task.cancel()
        assert down.breaker.state == CircuitState.CLOSED and reg.eligible() == [up, down]
        assert checks["up"] == 1, "a healthy worker waits for the full interval"
        assert checks["down"] >= 1 + reg.health.success_threshold
        await reg.client.aclose()

    asyncio.run(go())
