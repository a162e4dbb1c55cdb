"""A dead child process fails pending requests with a clear error, and the server exits non-zero (never a server that
answers 503 forever); a killed server process takes every process below it down (no orphan keeps the model)."""
from __future__ import annotations

import asyncio
import os
import signal
import time

import httpx
import pytest

from tests.runtime.server.conftest import child_pids, pid_alive, start_server, stop_server

pytestmark = pytest.mark.slow


def test_scheduler_death_fails_pending_requests():
    h = start_server()
    try:
        async def main():
            async with httpx.AsyncClient(base_url=h.base_url, timeout=30) as c:
                scheduler_pid = (await c.get("/server_info")).json()["process_pids"]["scheduler"]
                pending = asyncio.create_task(c.post("/generate", json={
                    "text": "Count forever:", "sampling_params": {"max_new_tokens": 1000, "ignore_eos": True}}))
                await asyncio.sleep(1.0)
                os.kill(scheduler_pid, signal.SIGKILL)
                return await pending

        r = asyncio.run(main())
        # A 500: the request was accepted (a router must not resend it: it may be what killed the pipeline).
        assert r.status_code == 500 and "retry-after" not in r.headers
        assert "scheduler process exited" in r.json()["message"]
        assert h.proc.wait(timeout=60) == 1
    finally:
        stop_server(h)


def test_a_killed_server_takes_its_processes_down():
    """SIGKILL, not SIGTERM: nothing of the server runs its shutdown. The scheduler and detokenizer are children of
    the forkserver that forked them, which must exit with the server (runtime/ipc.py: die_with_parent)."""
    h = start_server()
    below = child_pids(h.proc.pid)
    try:
        assert len(below) >= 3, below  # the forkserver, the scheduler, the detokenizer (and a resource tracker)
        h.proc.kill()
        h.proc.wait(30)
        deadline = time.monotonic() + 30
        while any(pid_alive(p) for p in below) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [p for p in below if pid_alive(p)]
    finally:
        stop_server(h)
        for p in below:  # what a failure left behind
            if pid_alive(p):
                os.kill(p, signal.SIGKILL)
