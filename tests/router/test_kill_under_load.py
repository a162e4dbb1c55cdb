"""A worker process SIGKILLed under load (fake workers, tests/router/fake_worker.py, no model), the router in-process
behind ASGITransport: every request it had in flight (held there, so they are in flight for sure, some of them
copies of one another) is resent once to the other worker and succeeds; requests sent after the kill succeed;
nothing is lost. Then the victim, restarted on its port, takes traffic within 10 s of passing its health check,
and a worker killed while idle loses nothing sent right after (its pooled connections are dead)."""
from __future__ import annotations

import asyncio
import time
from collections import Counter

import httpx

from radixlm.router.app import WORKER_HEADER
from radixlm.router.args import RouterArgs
from tests.router.conftest import FakeWorker, in_process_router
from tests.router.test_poison import DEADLINE_S, PICKUP_S, picked_up_after_restart

N_IN_FLIGHT = 8
N_AFTER = 6
SHARED = "the same prompt from several clients"


async def wait_until(pred, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not pred():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


async def generate(c: httpx.AsyncClient, text: str, hold: bool = False) -> httpx.Response:
    return await c.post("/generate", json={"text": text, "hold": hold})


def metric(text: str, line: str) -> float:
    return next((float(s.rsplit(" ", 1)[1]) for s in text.splitlines() if s.startswith(line + " ")), 0.0)


async def kill_under_load(c: httpx.AsyncClient, victim: FakeWorker, survivor: FakeWorker) -> None:
    texts = [SHARED if i % 2 else f"request {i}" for i in range(N_IN_FLIGHT)]
    tasks = [asyncio.create_task(generate(c, t, hold=True)) for t in texts]
    await wait_until(lambda: len(victim.seen()) + len(survivor.seen()) == N_IN_FLIGHT,
                     "the requests did not all reach the workers")
    on_victim = victim.seen()
    assert on_victim, "round robin sent the victim nothing"
    victim.proc.kill()
    assert victim.proc.wait(timeout=DEADLINE_S) == -9
    survivor.get("/release")  # held requests are answered from now on

    results = await asyncio.wait_for(asyncio.gather(*tasks), DEADLINE_S)
    assert [r.status_code for r in results] == [200] * N_IN_FLIGHT, [r.text for r in results if r.status_code != 200]
    assert {r.headers[WORKER_HEADER] for r in results} == {survivor.url}
    # Each request was served once by the survivor; those the victim had were resent exactly once.
    assert Counter(survivor.seen()) == Counter(texts)
    metrics = (await c.get("/metrics")).text
    assert metric(metrics, 'radixlm_router:resends_total{kind="maybe_read"}') == len(on_victim)
    assert (await c.get("/quarantine")).json() == {"quarantined": 0, "suspected": 0, "quarantine_secs": 600.0}

    for i in range(N_AFTER):
        r = await generate(c, f"after the kill {i}")
        assert r.status_code == 200 and r.headers[WORKER_HEADER] == survivor.url


async def kill_idle(c: httpx.AsyncClient, victim: FakeWorker, survivor: FakeWorker) -> None:
    """Both serve (their connections pooled in the router); the victim dies idle; the next requests, sent before
    any health check can notice, all succeed."""
    served = set()
    for i in range(4):
        r = await generate(c, f"warm {i}")
        assert r.status_code == 200
        served.add(r.headers[WORKER_HEADER])
    assert served == {victim.url, survivor.url}
    victim.proc.kill()
    victim.proc.wait(timeout=DEADLINE_S)
    results = await asyncio.gather(*(generate(c, f"right after {i}") for i in range(N_AFTER)))
    assert [r.status_code for r in results] == [200] * N_AFTER
    assert {r.headers[WORKER_HEADER] for r in results} == {survivor.url}


def test_kill_a_worker_under_load_then_restart_it(start_fake_worker):
    survivor, victim = start_fake_worker(), start_fake_worker()

    async def go() -> None:
        args = RouterArgs(worker_urls=[victim.url, survivor.url], policy="round_robin")
        async with in_process_router(args) as c:
            await kill_under_load(c, victim, survivor)
            restarted, took = await picked_up_after_restart(c, victim, start_fake_worker)
            assert took < PICKUP_S, f"the restarted worker took {took:.1f} s to get traffic"
            await kill_idle(c, restarted, survivor)

    asyncio.run(go())
