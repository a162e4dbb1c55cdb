"""Two real SmolLM2 workers shared by the router's end-to-end modules (package scope: at most two workers for
all of tests/router), plus a router subprocess helper. Workers can be restarted on their own port."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass

import pytest

from radixlm.runtime.ipc import die_with_parent
from tests.runtime.server.conftest import ServerHandle, child_pids, free_port, stop_server, wait_healthy

WORKER_FLAGS = ("--max-total-tokens", "4096", "--random-seed", "0", "--log-level", "warning")


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
            handles.append(wait_healthy(proc, f"http://127.0.0.1:{port}"))
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
