"""A worker SIGKILLed under load. No request is lost: those the victim had in flight when it died are resent once
to the other worker (they may have been read, so once only) and succeed there, and every request started after the
kill succeeds on the other worker; /workers shows the victim down at once, and with the router's default
health-check and circuit-breaker settings it takes traffic again within 10 s of passing its health check once
restarted on its port."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import pytest

from radixlm.router.app import WORKER_HEADER
from tests.router.conftest import (WORKER_STARTUP_S, kill_hard, start_router, start_worker_proc, stop_router,
                                   wait_healthy)

pytestmark = pytest.mark.slow

N_REQUESTS = 24
CONCURRENCY = 4
PICKUP_S = 10.0  # the restarted victim serves within this of passing its health check


@dataclass(frozen=True)
class Outcome:
    started: float  # time.monotonic() when the client sent it
    status: int
    worker: str  # the x-radixlm-worker header: who served (or failed) it
    body: str


def worker_state(router, url: str) -> dict:
    return next(w for w in router.client.get("/workers").json()["workers"] if w["url"] == url)


def wait_for(pred, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.2)
    return False


def run_and_kill(router, victim) -> tuple[list[Outcome], float]:
    """N_REQUESTS over CONCURRENCY threads; the victim is SIGKILLed once 4 have finished. Returns the outcomes
    and when the kill was complete."""
    done = []
    killed_at: list[float] = []

    def one(i: int) -> Outcome:
        started = time.monotonic()
        with httpx.Client(base_url=router.base_url, timeout=120) as c:
            r = c.post("/generate", json={"text": f"Request {i}: the sky is",
                                          "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}})
        done.append(i)
        return Outcome(started, r.status_code, r.headers.get(WORKER_HEADER, ""), r.text)

    def killer() -> None:
        wait_for(lambda: len(done) >= 4, 120)
        kill_hard(victim)
        killed_at.append(time.monotonic())

    k = threading.Thread(target=killer)
    k.start()
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        results = list(pool.map(one, range(N_REQUESTS)))
    k.join()
    assert killed_at, "the victim was not killed"
    return results, killed_at[0]


def test_kill_worker_mid_run_then_restart(fleet):
    router = start_router(fleet.urls, "--policy", "round_robin")  # default health checks and circuit breaker
    survivor, victim = fleet.workers
    try:
        results, killed_at = run_and_kill(router, victim)
        failed = [o for o in results if o.status != 200]
        assert failed == [], failed
        assert {o.worker for o in results if o.started > killed_at} == {survivor.base_url}
        metrics = router.client.get("/metrics").text
        resent = [line for line in metrics.splitlines() if line.startswith("radixlm_router:resends_total{")]
        assert all("maybe_read" in line or "not_sent" in line for line in resent), resent

        # Passive health check: the router saw the victim fail, so it is listed down without waiting.
        assert worker_state(router, victim.base_url)["healthy"] is False
        health = router.client.get("/health").json()
        assert health["healthy_workers"] == 1 and health["total_workers"] == 2
        r = router.client.post("/generate", json={"text": "still up?", "sampling_params": {"max_new_tokens": 1}})
        assert r.status_code == 200 and r.headers[WORKER_HEADER] == survivor.base_url

        port = int(victim.base_url.rsplit(":", 1)[1])
        fleet.workers[1] = wait_healthy(start_worker_proc(port), victim.base_url, timeout=WORKER_STARTUP_S)
        healthy_at = time.monotonic()
        # A down worker is checked every second even with the default 60 s interval; one that refused
        # connections is back after one passed check, which also closes its circuit.
        assert wait_for(lambda: worker_state(router, victim.base_url)["circuit"] == "closed"
                        and worker_state(router, victim.base_url)["healthy"], 30)
        took = time.monotonic() - healthy_at
        assert took < PICKUP_S, f"the restarted worker was listed healthy {took:.1f} s after passing /health"
        served = {router.client.post("/generate", json={"text": f"back {i}", "sampling_params": {
            "max_new_tokens": 1}}).headers[WORKER_HEADER] for i in range(4)}
        assert served == set(fleet.urls)
        metrics = router.client.get("/metrics").text
        assert f'radixlm_router:worker_ejections_total{{worker="{victim.base_url}"}}' in metrics
    finally:
        stop_router(router)
