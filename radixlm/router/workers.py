"""Workers as the router sees them: health with hysteresis, a circuit breaker, and the router's own in-flight
count (its only notion of load for cache_aware). The registry runs the periodic (active) health checks and takes
the proxy's passive verdicts: a worker that failed a request it had accepted, or whose connection failed, is
ejected at once (marked down, its circuit opened) and comes back only through the active checks, which also close
its circuit. A connection refused at the socket (by a request or a health check) means nothing listens: the worker
is down at once, and its first passed check brings it back (a restarted process), not `success_threshold` of them."""
from __future__ import annotations

import asyncio
import enum
import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol
from urllib.parse import urlsplit

import httpx

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class HealthConfig:
    failure_threshold: int = 3  # consecutive failed checks to mark a healthy worker down
    success_threshold: int = 2  # consecutive passed checks to mark a down worker up
    timeout_s: float = 5.0
    interval_s: float = 60.0
    endpoint: str = "/health"
    # A down worker is also checked every min(interval_s, down_interval_s): a restarted worker takes traffic about
    # 1 s after it answers /health (2 s when it was not seen refusing), even with the default 60 s interval.
    down_interval_s: float = 1.0


@dataclass(frozen=True)
class CircuitConfig:
    failure_threshold: int = 10  # consecutive request failures that open the circuit
    success_threshold: int = 3  # consecutive successes in half-open that close it
    timeout_s: float = 60.0  # how long an open circuit refuses before letting probes through
    enabled: bool = True


class CircuitState(enum.IntEnum):
    CLOSED = 0
    OPEN = 1
    HALF_OPEN = 2


@dataclass
class CircuitBreaker:
    config: CircuitConfig = field(default_factory=CircuitConfig)
    clock: Callable[[], float] = time.monotonic
    # all below: set by record() / allows()
    state: CircuitState = CircuitState.CLOSED
    failures: int = 0
    successes: int = 0
    opened_at: float = 0.0

    def allows(self) -> bool:
        if not self.config.enabled or self.state == CircuitState.CLOSED:
            return True
        if self.state == CircuitState.OPEN and self.clock() - self.opened_at >= self.config.timeout_s:
            self.state, self.successes = CircuitState.HALF_OPEN, 0
        return self.state == CircuitState.HALF_OPEN

    def record(self, ok: bool) -> None:
        if ok:
            self.failures = 0
            if self.state == CircuitState.HALF_OPEN:
                self.successes += 1
                if self.successes >= self.config.success_threshold:
                    self.state = CircuitState.CLOSED
            return
        self.successes = 0
        self.failures += 1
        if self.state == CircuitState.HALF_OPEN or self.failures >= self.config.failure_threshold:
            self.state, self.opened_at, self.failures = CircuitState.OPEN, self.clock(), 0

    def trip(self) -> None:
        """Opens the circuit at once (an ejected worker)."""
        self.state, self.opened_at, self.failures, self.successes = CircuitState.OPEN, self.clock(), 0, 0

    def reset(self) -> None:
        self.state, self.failures, self.successes = CircuitState.CLOSED, 0, 0


def normalize_url(url: str) -> str:
    url = url.strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"worker URL must look like http://host:port, got {url!r}")
    return url


@dataclass
class Worker:
    url: str
    breaker: CircuitBreaker
    healthy: bool = False  # set by the registry's health checks (hysteresis)
    check_failures: int = 0  # consecutive failed health checks (set by the registry)
    check_successes: int = 0  # consecutive passed health checks (set by the registry)
    ejections: int = 0  # failed attempts that ejected it (set by the registry's eject(), which marks it down)
    refused: bool = False  # down since a connection to it was refused: one passed check brings it back
    in_flight: int = 0  # requests proxied to it whose response has not ended (set by LoadGuard)
    selections: int = 0  # times a policy chose it (set by the Router)

    @property
    def eligible(self) -> bool:
        return self.healthy and self.breaker.allows()

    def describe(self) -> dict:
        return {"url": self.url, "healthy": self.healthy, "in_flight": self.in_flight,
                "circuit": self.breaker.state.name.lower(), "selections": self.selections,
                "ejections": self.ejections}


class LoadGuard:
    """Counts a request against a worker's load until release() (idempotent): the proxy releases it when the
    response stream ends, not when the headers arrive."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self._held = True
        worker.in_flight += 1

    def release(self) -> None:
        if self._held:
            self._held = False
            self.worker.in_flight -= 1


class Probe(enum.Enum):
    PASSED = "passed"
    FAILED = "failed"  # an answer other than 200, or no answer in time
    REFUSED = "refused"  # no connection: nothing listens at the worker's address


class WorkerListener(Protocol):
    def worker_added(self, url: str) -> None: ...
    def worker_removed(self, url: str) -> None: ...
    def worker_down(self, url: str) -> None: ...


class WorkerRegistry:
    def __init__(self, health: HealthConfig, circuit: CircuitConfig, client: httpx.AsyncClient,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.health, self.circuit, self.client, self.clock = health, circuit, client, clock
        self.workers: dict[str, Worker] = {}
        self.listeners: list[WorkerListener] = []

    def add(self, url: str) -> Worker:
        url = normalize_url(url)
        if url in self.workers:
            raise ValueError(f"worker {url} is already registered")
        w = Worker(url, CircuitBreaker(self.circuit, self.clock))
        self.workers[url] = w
        for lis in self.listeners:
            lis.worker_added(url)
        return w

    def remove(self, url: str) -> Worker:
        url = normalize_url(url)
        w = self.workers.pop(url, None)
        if w is None:
            raise KeyError(f"no worker {url}")
        for lis in self.listeners:
            lis.worker_removed(url)
        return w

    def eligible(self) -> list[Worker]:
        return [w for w in self.workers.values() if w.eligible]

    def record_check(self, w: Worker, ok: bool, first: bool = False, refused: bool = False) -> None:
        """Hysteresis: only `failure_threshold` failures in a row mark a worker down, `success_threshold`
        successes in a row mark it up. The first check of a new worker decides at once, and so do a refused
        connection (down) and the first pass after one (up)."""
        if ok:
            w.check_failures, w.check_successes = 0, w.check_successes + 1
            if not w.healthy and (first or w.refused or w.check_successes >= self.health.success_threshold):
                w.healthy, w.check_successes, w.refused = True, 0, False
                w.breaker.reset()  # it answers again: a stale open circuit must not keep it out
                logger.info("worker %s is up", w.url)
            return
        w.check_successes, w.check_failures = 0, w.check_failures + 1
        if refused:
            w.refused = True
        if w.healthy and (refused or w.check_failures >= self.health.failure_threshold):
            w.check_failures = 0
            self._mark_down(w, "its health check was refused" if refused else "failed health checks")

    def eject(self, w: Worker, why: str, refused: bool = False) -> bool:
        """Passive health check: `w` failed a request, or refused its connection. It is down at once with its
        circuit open until `success_threshold` active checks in a row pass (one, when `refused`). Returns whether
        it was up until now."""
        if self.workers.get(w.url) is not w:
            return False  # removed while the request ran
        was_up = w.healthy
        w.ejections += 1
        w.refused = w.refused or refused
        w.breaker.trip()
        w.check_failures = w.check_successes = 0
        if was_up:
            self._mark_down(w, why)
        return was_up

    def _mark_down(self, w: Worker, why: str) -> None:
        w.healthy = False
        logger.warning("worker %s is down: %s", w.url, why)
        for lis in self.listeners:
            lis.worker_down(w.url)

    async def probe(self, w: Worker) -> Probe:
        try:
            r = await self.client.get(w.url + self.health.endpoint, timeout=self.health.timeout_s)
            return Probe.PASSED if r.status_code == 200 else Probe.FAILED
        except httpx.ConnectError:
            return Probe.REFUSED
        except httpx.HTTPError:
            return Probe.FAILED

    async def check(self, w: Worker, first: bool = False) -> None:
        ejections = w.ejections
        result = await self.probe(w)
        # It may have been removed while we waited; and a probe sent before an ejection predates the failure.
        if self.workers.get(w.url) is w and w.ejections == ejections:
            self.record_check(w, result is Probe.PASSED, first, refused=result is Probe.REFUSED)

    async def check_all(self, first: bool = False, down_only: bool = False) -> None:
        await asyncio.gather(*(self.check(w, first) for w in list(self.workers.values())
                               if not (down_only and w.healthy)))

    async def run_health_checks(self) -> None:
        """Every worker each `interval_s`; the down ones also every `down_interval_s` in between."""
        tick = min(self.health.interval_s, self.health.down_interval_s)
        next_full = self.clock() + self.health.interval_s
        while True:
            await asyncio.sleep(tick)
            full = self.clock() >= next_full
            if full:
                next_full = self.clock() + self.health.interval_s
            await self.check_all(down_only=not full)
