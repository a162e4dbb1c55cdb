"""A poison pill against real sockets: a request that kills every worker process that reads it
(tests/router/fake_worker.py, no model), with three workers. It is resent once after the first death; the second
death quarantines it: the client gets a 502 saying so, the third worker keeps serving and never sees it, and a copy
sent afterwards is refused at the router with a 422 without reaching any worker. A victim restarted on its port
takes traffic within seconds of passing its health check. The router's default health-check and circuit-breaker
settings; it runs in-process, behind ASGITransport."""
from __future__ import annotations

import asyncio
import time
import uuid

import httpx

from radixlm.router.app import WORKER_HEADER
from radixlm.router.args import RouterArgs
from tests.router.conftest import FakeWorker, in_process_router
from tests.router.fake_worker import POISON

PICKUP_S = 10.0  # a restarted worker serves within this of passing its health check
DEADLINE_S = 60.0  # for anything else that waits on the (loaded) machine


def listed(workers: dict) -> dict[str, dict]:
    return {w["url"]: w for w in workers["workers"]}


async def generate(c: httpx.AsyncClient, text: str) -> httpx.Response:
    return await c.post("/generate", json={"text": text, "sampling_params": {"max_new_tokens": 1}})


def health_passes(w: FakeWorker) -> bool:
    try:
        return httpx.get(w.url + "/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


async def picked_up_after_restart(c: httpx.AsyncClient, victim: FakeWorker, start) -> tuple[FakeWorker, float]:
    """Restarts `victim` on its port; returns the new process and the seconds from its first passed health check
    to its first request served through the router."""
    restarted = start(victim.port)
    deadline = time.monotonic() + DEADLINE_S
    while not health_passes(victim):
        assert time.monotonic() < deadline, "the restarted worker never passed its health check"
        await asyncio.sleep(0.05)
    healthy_at = time.monotonic()
    while True:
        # A fresh prefix each time: cache_aware must not keep it on another worker for a cache hit.
        r = await generate(c, f"{uuid.uuid4().hex} after the restart")
        assert r.status_code == 200, r.text
        if r.headers[WORKER_HEADER] == victim.url:
            return restarted, time.monotonic() - healthy_at
        assert time.monotonic() - healthy_at < DEADLINE_S, "the restarted worker took no traffic"
        await asyncio.sleep(0.05)


async def poison_then_recover(c: httpx.AsyncClient, workers: dict[str, FakeWorker], start) -> None:
    r = await generate(c, f"{POISON} a malformed request")
    assert r.status_code == 502, r.text
    message = r.json()["message"]
    assert "two workers" in message and "copies of it will be refused" in message
    victims = [w for w in workers.values() if w.url in message]
    assert len(victims) == 2
    for v in victims:
        assert v.proc.wait(timeout=DEADLINE_S) == 3, "the poison pill ended its worker"
    survivor = next(w for w in workers.values() if w not in victims)
    assert survivor.proc.poll() is None and not any(POISON in t for t in survivor.seen())

    state = listed((await c.get("/workers")).json())
    assert [state[v.url]["healthy"] for v in victims] == [False, False]
    assert state[survivor.url]["healthy"] is True

    seen = survivor.seen()
    r = await generate(c, f"{POISON} a malformed request")  # a copy: refused at the router
    assert r.status_code == 422 and "quarantined" in r.json()["message"], r.text
    assert survivor.seen() == seen, "the copy reached the survivor"
    assert all(v.proc.poll() == 3 for v in victims)
    assert (await c.get("/quarantine")).json()["quarantined"] == 1
    for i in range(5):
        r = await generate(c, f"normal request {i}")
        assert r.status_code == 200 and r.headers[WORKER_HEADER] == survivor.url

    _, took = await picked_up_after_restart(c, victims[0], start)
    assert took < PICKUP_S, f"the restarted worker took {took:.1f} s to get traffic"
    state = listed((await c.get("/workers")).json())
    assert state[victims[0].url]["healthy"] is True and state[victims[0].url]["circuit"] == "closed"
    r = await generate(c, f"{POISON} a malformed request")
    assert r.status_code == 422, "still quarantined: the restarted worker is not offered to it"


def test_poison_pill_kills_two_workers_at_most_and_a_restarted_worker_takes_traffic_again(start_fake_worker):
    fakes = [start_fake_worker() for _ in range(3)]
    workers = {w.url: w for w in fakes}

    async def go() -> None:
        # Default health checks and circuit breaker.
        async with in_process_router(RouterArgs(worker_urls=list(workers))) as c:
            await poison_then_recover(c, workers, start_fake_worker)

    asyncio.run(go())
