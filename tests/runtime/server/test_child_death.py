"""A dead child process fails pending requests with a clear error, and the server exits non-zero (never a server that
answers 503 forever)."""
from __future__ import annotations

import asyncio
import os
import signal

import httpx
import pytest

from tests.runtime.server.conftest import start_server, stop_server

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
