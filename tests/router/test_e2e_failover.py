"""A worker SIGKILLed under load: every request that had not started streaming still succeeds (retried on the
other worker), health shows the worker down, and it comes back when restarted on the same port."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.router.conftest import kill_hard, start_router, start_worker_proc, stop_router, wait_healthy

pytestmark = pytest.mark.slow

N_REQUESTS = 24


def worker_state(router, url: str) -> dict:
    return next(w for w in router.client.get("/workers").json()["workers"] if w["url"] == url)


def wait_for(pred, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.2)
    return False


def test_kill_worker_mid_run_then_restart(fleet):
    router = start_router(fleet.urls, "--policy", "round_robin", "--health-check-interval-secs", "0.5",
                          "--health-failure-threshold", "2", "--health-success-threshold", "2")
    victim = fleet.workers[1]
    try:
        done = []
        killed = threading.Event()

        def one(i: int) -> tuple[int, str]:
            with httpx.Client(base_url=router.base_url, timeout=120) as c:
                r = c.post("/generate", json={"text": f"Request {i}: the sky is",
                                              "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}})
            done.append(i)
            return r.status_code, r.headers.get("x-radixlm-worker", "")

        def killer() -> None:
            wait_for(lambda: len(done) >= 4, 120)
            kill_hard(victim)
            killed.set()

        k = threading.Thread(target=killer)
        k.start()
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(one, range(N_REQUESTS)))
        k.join()
        assert killed.is_set()
        assert [s for s, _ in results] == [200] * N_REQUESTS
        served_after = {w for s, w in results[8:]}
        assert fleet.workers[0].base_url in served_after

        assert wait_for(lambda: not worker_state(router, victim.base_url)["healthy"], 15)
        health = router.client.get("/health").json()
        assert health["healthy_workers"] == 1 and health["total_workers"] == 2
        # With one worker left, everything goes there.
        r = router.client.post("/generate", json={"text": "still up?", "sampling_params": {"max_new_tokens": 1}})
        assert r.status_code == 200 and r.headers["x-radixlm-worker"] == fleet.workers[0].base_url

        port = int(victim.base_url.rsplit(":", 1)[1])
        fleet.workers[1] = wait_healthy(start_worker_proc(port), victim.base_url)
        assert wait_for(lambda: worker_state(router, victim.base_url)["healthy"], 30)
        served = {router.client.post("/generate", json={"text": f"back {i}", "sampling_params": {
            "max_new_tokens": 1}}).headers["x-radixlm-worker"] for i in range(4)}
        assert served == set(fleet.urls)
        metrics = router.client.get("/metrics").text.splitlines()
        retries = sum(float(line.rsplit(" ", 1)[1]) for line in metrics
                      if line.startswith("radixlm_router:retries_total{"))
        assert retries >= 1, "the requests caught by the kill were retried, not lost"
    finally:
        stop_router(router)
