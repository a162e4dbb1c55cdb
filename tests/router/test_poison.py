"""A poison pill against real sockets: a request that kills its worker process (tests/router/fake_worker.py, no
model) gets an error and reaches no other worker; the dead worker is listed down at once, the other keeps
serving, and once restarted on its port the dead one takes traffic again, with the router's default health-check
and circuit-breaker settings. The router runs in-process, behind ASGITransport."""
from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from radixlm.router.app import WORKER_HEADER, create_app
from radixlm.router.args import RouterArgs
from tests.router.fake_worker import POISON

FAKE_WORKER = str(Path(__file__).with_name("fake_worker.py"))
RECOVERY_DEADLINE_S = 30.0


@dataclass
class FakeWorker:
    proc: subprocess.Popen
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def seen(self) -> list[str]:
        return httpx.get(self.url + "/seen", timeout=10).json()["texts"]


@pytest.fixture
def start_fake_worker():
    """Starts fake workers (port 0: any free one); all are killed at the end. They also die with this process."""
    started: list[subprocess.Popen] = []

    def start(port: int = 0) -> FakeWorker:
        proc = subprocess.Popen([sys.executable, FAKE_WORKER, str(port)], stdout=subprocess.PIPE, text=True)
        started.append(proc)
        line = proc.stdout.readline()  # it prints once bound, or exits
        if not line.startswith("listening on "):
            raise RuntimeError(f"fake worker on port {port} did not start (exit code {proc.poll()})")
        return FakeWorker(proc, int(line.split()[-1]))

    try:
        yield start
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            proc.stdout.close()


def listed(workers: dict) -> dict[str, dict]:
    return {w["url"]: w for w in workers["workers"]}


async def generate(c: httpx.AsyncClient, text: str) -> httpx.Response:
    return await c.post("/generate", json={"text": text, "sampling_params": {"max_new_tokens": 1}})


async def poison_then_recover(c: httpx.AsyncClient, workers: dict[str, FakeWorker], start) -> None:
    r = await generate(c, f"{POISON} a malformed request")
    assert r.status_code == 502, r.text
    assert "not resent" in r.json()["message"]
    victim = workers[r.headers[WORKER_HEADER]]
    survivor = next(w for w in workers.values() if w is not victim)
    assert victim.proc.wait(timeout=10) == 3, "the poison pill ended its worker"
    assert not any(POISON in t for t in survivor.seen()), "the poison pill was resent"

    state = listed((await c.get("/workers")).json())
    assert state[victim.url]["healthy"] is False and state[victim.url]["circuit"] == "open"
    assert state[survivor.url]["healthy"] is True
    for i in range(5):
        r = await generate(c, f"normal request {i}")
        assert r.status_code == 200 and r.headers[WORKER_HEADER] == survivor.url

    start(victim.port)  # restarted on the same port
    restarted = time.monotonic()
    served: set[str] = set()
    while victim.url not in served:
        assert time.monotonic() - restarted < RECOVERY_DEADLINE_S, "the restarted worker took no traffic"
        # A fresh prefix each time: cache_aware must not keep it on the survivor for a cache hit.
        r = await generate(c, f"{uuid.uuid4().hex} after the restart")
        assert r.status_code == 200
        served.add(r.headers[WORKER_HEADER])
        await asyncio.sleep(0.05)
    state = listed((await c.get("/workers")).json())
    assert state[victim.url]["healthy"] is True and state[victim.url]["circuit"] == "closed"


def test_poison_pill_kills_one_worker_and_the_restarted_worker_takes_traffic_again(start_fake_worker):
    fakes = [start_fake_worker(), start_fake_worker()]
    workers = {w.url: w for w in fakes}

    async def go() -> None:
        app = create_app(RouterArgs(worker_urls=list(workers)))  # default health checks and circuit breaker
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://router",
                                         timeout=30) as c:
                await poison_then_recover(c, workers, start_fake_worker)

    asyncio.run(go())
