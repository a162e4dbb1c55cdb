"""`radixlm serve` subprocesses for the tests (SmolLM2, small KV pool, random free port): one shared by the modules
that take `server`, or one a module starts with its own arguments."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

import httpx
import pytest

from radixlm.runtime.ipc import die_with_parent

STARTUP_TIMEOUT_S = 180
# One torch thread: on a loaded 2-core machine more threads oversubscribe it (a 16-token completion took 2-19 s with the
# default, a steady 1.2 s with one).
SERVER_THREADS = os.environ.get("OMP_NUM_THREADS", "1")


@dataclass
class ServerHandle:
    proc: subprocess.Popen
    base_url: str
    client: httpx.Client


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_pids(pid: int) -> list[int]:
    """Every process below pid: the server's children and theirs (its scheduler and detokenizer are forked by a
    forkserver child, runtime/launch.py)."""
    parents: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    parents[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    out, frontier = [], [pid]
    while frontier:
        kids = [p for p, pp in parents.items() if pp in frontier]
        out += kids
        frontier = kids
    return out


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def start_server(*extra: str) -> ServerHandle:
    port = free_port()
    cmd = [sys.executable, "-m", "radixlm.launch_server", "--port", str(port), "--max-total-tokens", "4096",
           "--random-seed", "0", "--enable-integrity-check", "--log-level", "warning", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": SERVER_THREADS}
    return wait_healthy(subprocess.Popen(cmd, env=env, preexec_fn=die_with_parent), f"http://127.0.0.1:{port}")


def wait_healthy(proc: subprocess.Popen, base: str, timeout: float = STARTUP_TIMEOUT_S,
                 client_timeout: float = 60) -> ServerHandle:
    """Polls GET /health until 200; a process that exits or a timeout raises (and the process is killed)."""
    client = httpx.Client(base_url=base, timeout=client_timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            client.close()
            raise RuntimeError(f"{base} exited with {proc.returncode} while starting")
        try:
            if client.get("/health").status_code == 200:
                return ServerHandle(proc, base, client)
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    client.close()
    proc.kill()
    proc.wait()
    raise TimeoutError(f"{base} did not become healthy")


def stop_server(h: ServerHandle, timeout: float = 40) -> None:
    """SIGTERM and wait (then SIGKILL), and make sure no child process outlives it."""
    h.client.close()
    if h.proc.poll() is None:
        kids = child_pids(h.proc.pid)
        h.proc.send_signal(signal.SIGTERM)
        try:
            h.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            h.proc.kill()
            h.proc.wait()
        for k in kids:
            if pid_alive(k):
                os.kill(k, signal.SIGKILL)


@pytest.fixture(scope="module")
def server(shared_server):
    """The session's default server (tests/conftest.py), checked alive for each module that takes it."""
    assert shared_server.proc.poll() is None, f"the shared server exited with {shared_server.proc.returncode}"
    assert shared_server.client.get("/health").status_code == 200
    return shared_server


@pytest.fixture(scope="module")
def tokenizer():
    """The default model's tokenizer (the shared server's)."""
    from radixlm.runtime.model_loader.tokenizer import get_tokenizer
    return get_tokenizer("default")


@pytest.fixture(scope="module")
def anthropic_client(server):
    import anthropic

    with anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0, timeout=60) as c:
        yield c


def kv_state(server) -> dict:
    return server.client.get("/server_info").json()["internal_states"][0]


def kv_idle(st: dict) -> bool:
    """No request running or waiting and every KV slot free or evictable."""
    return (st["is_idle"] and st["protected_tokens"] == 0
            and st["available_tokens"] + st["evictable_tokens"] == st["max_total_num_tokens"])


def wait_idle(server, timeout: float = 10.0) -> dict:
    """Polls /server_info until the KV pool is idle; returns the last state (callers assert kv_idle on it)."""
    deadline = time.monotonic() + timeout
    while True:
        st = kv_state(server)
        if kv_idle(st) or time.monotonic() > deadline:
            return st
        time.sleep(0.1)
