"""Two real SmolLM2 workers shared by the router's end-to-end modules (package scope: at most two workers for
all of tests/router), plus a router subprocess helper. Workers can be restarted on their own port.
Also model-free stand-in worker processes (fake_worker.py) and an in-process router in front of them."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator

import httpx
import pytest

from radixlm.router.app import create_app
from radixlm.router.args import RouterArgs

from radixlm.runtime.ipc import die_with_parent
from tests.runtime.server.conftest import ServerHandle, child_pids, free_port, stop_server, wait_healthy

WORKER_FLAGS = ("--max-total-tokens", "4096", "--random-seed", "0", "--log-level", "warning")
WORKER_STARTUP_S = 600.0  # two model loads at once on a loaded 2-core machine can take minutes


def start_worker_proc(port: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "radixlm.launch_server", "--port", str(port), *WORKER_FLAGS],
                            preexec_fn=die_with_parent)


def kill_hard(h: ServerHandle) -> None:
    """SIGKILL a worker and its pipeline processes (a crash, not a shutdown)."""
    kids = child_pids(h.proc.pid)
    for pid in [h.proc.pid, *kids]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    h.proc.wait()
    h.client.close()


@dataclass
class Fleet:
    workers: list[ServerHandle]

    @property
    def urls(self) -> list[str]:
        return [w.base_url for w in self.workers]


@pytest.fixture(scope="package")
def fleet():
    ports = [free_port(), free_port()]
    procs = [start_worker_proc(p) for p in ports]  # start both before waiting: they load in parallel
    handles: list[ServerHandle] = []
    try:
        for proc, port in zip(procs, ports):
            handles.append(wait_healthy(proc, f"http://127.0.0.1:{port}", timeout=WORKER_STARTUP_S))
        f = Fleet(handles)
        yield f
        handles = f.workers  # a test may have restarted one
    finally:
        for proc in procs:
            if proc.poll() is None and not any(h.proc is proc for h in handles):
                proc.kill()
                proc.wait()
        for h in handles:
            stop_server(h)


RouterHandle = ServerHandle


def start_router(urls: list[str], *flags: str) -> RouterHandle:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "radixlm.router", "--worker-urls", *urls, "--port", str(port),
                             "--log-level", "warning", *flags], preexec_fn=die_with_parent)
    return wait_healthy(proc, f"http://127.0.0.1:{port}", timeout=60, client_timeout=120)


def stop_router(h: RouterHandle) -> None:
    stop_server(h, timeout=15)


FAKE_WORKER = str(Path(__file__).with_name("fake_worker.py"))


@dataclass
class FakeWorker:
    proc: subprocess.Popen
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str) -> dict:
        return httpx.get(self.url + path, timeout=30).json()

    def seen(self) -> list[str]:
        return self.get("/seen")["texts"]


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


@asynccontextmanager
async def in_process_router(args: RouterArgs) -> AsyncIterator[httpx.AsyncClient]:
    """The router app with its lifespan (health checks) running, behind ASGITransport."""
    app = create_app(args)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://router",
                                     timeout=120) as c:
            yield c
