"""Started radixlm processes (a server or the router) for benchmarks that drive them from outside (the soak test):
each the leader of its own process group, its log in a file, ready when /health answers, its group's resident memory
read from /proc, stopped with SIGTERM and then the group killed."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

HOST = "127.0.0.1"  # loopback only, on purpose
REPO = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 600
STOP_GRACE_S = 20.0


@dataclass
class Target:
    """One started process (a server or the router), leader of its own process group."""
    name: str
    url: str
    popen: subprocess.Popen
    log_path: Path
    is_server: bool
    child_pids: dict[str, int] = field(default_factory=dict)  # scheduler, detokenizer (from /server_info)

    def dead_reason(self) -> str | None:
        if self.popen.poll() is not None:
            return f"{self.name} exited with {self.popen.returncode}"
        for role, pid in self.child_pids.items():
            if _stat(pid)[:1] in ([], ["Z"], ["X"]):
                return f"{self.name}'s {role} (pid {pid}) died"
        return None

    def rss_mib(self) -> float:
        """VmRSS summed over the process group: the server and its scheduler, detokenizer and helpers."""
        return sum(self.rss_by_process().values())

    def rss_by_process(self) -> dict[str, float]:
        """VmRSS (MiB) of each process of the group, keyed "pid:name" (which one grows, when the sum does)."""
        out = {}
        for pid in (int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit()):
            if _stat(pid)[2:3] == [str(self.popen.pid)]:
                with contextlib.suppress(OSError, ValueError, StopIteration):
                    status = Path(f"/proc/{pid}/status").read_text().splitlines()
                    name = next(line for line in status if line.startswith("Name:")).split()[1]
                    kib = int(next(line for line in status if line.startswith("VmRSS:")).split()[1])
                    out[f"{pid}:{name}"] = round(kib / 1024, 1)
        return out

    def log_tail(self, lines: int = 30) -> list[str]:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace").splitlines()[-lines:]
        return []


def _stat(pid: int) -> list[str]:
    """/proc/<pid>/stat after the command name: state, ppid, pgrp, ...; [] when the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return []


def start_target(name: str, cmd: list[str], port: int, log_dir: Path, is_server: bool, threads: int = 0) -> Target:
    """threads: torch threads of a server (0: torch's default, one per core)."""
    log_path = log_dir / f"{name}.log"
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)} if threads else None
    with open(log_path, "wb") as log:
        popen = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True, cwd=REPO, env=env)
    return Target(name, f"http://{HOST}:{port}", popen, log_path, is_server)


def wait_ready(targets: list[Target], timeout: float = READY_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    for t in targets:
        while True:
            if (why := t.dead_reason()) is not None:
                raise RuntimeError(f"{why} while starting; log tail:\n" + "\n".join(t.log_tail()))
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(t.url + "/health", timeout=5).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{t.name} not ready in {timeout:.0f} s")
            time.sleep(0.5)
        if t.is_server:
            t.child_pids = httpx.get(t.url + "/server_info", timeout=30).json().get("process_pids", {})


def stop_targets(targets: list[Target]) -> None:
    # SIGTERM lets each launcher shut its children down; then the whole group is killed, whatever is left.
    for t in targets:
        with contextlib.suppress(ProcessLookupError):
            t.popen.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    for t in targets:
        with contextlib.suppress(subprocess.TimeoutExpired):
            t.popen.wait(max(0.1, deadline - time.monotonic()))
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(t.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            t.popen.wait(5)
