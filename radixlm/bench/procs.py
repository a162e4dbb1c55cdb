"""Server processes for benchmark scripts: a free port, start-and-wait-until-healthy, and a clean stop."""
from __future__ import annotations

import subprocess
import time

import httpx

from radixlm.runtime.ipc import die_with_parent, free_port  # noqa: F401 - free_port: for the benchmarks

READY_TIMEOUT_S = 600


def wait_ready(proc: subprocess.Popen, url: str, timeout: float = READY_TIMEOUT_S) -> float:
    """Seconds until GET /health answered 200; a process that exits or a timeout raises (and is stopped)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: the process exited with {proc.returncode} while starting")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return time.monotonic() - t0
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    stop(proc)
    raise TimeoutError(f"{url} did not become ready in {timeout:.0f} s")


def start(cmd: list[str], url: str, timeout: float = READY_TIMEOUT_S) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, preexec_fn=die_with_parent)  # no server outlives a killed benchmark
    wait_ready(proc, url, timeout)
    return proc


def stop(proc: subprocess.Popen) -> None:
    # SIGTERM lets a server's launcher take down its scheduler and detokenizer children.
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
