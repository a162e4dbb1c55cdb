"""Spawns the scheduler and detokenizer processes, waits until both are ready, and stops them
(always: no orphan survives the launcher)."""
from __future__ import annotations

import logging
import multiprocessing as mp
import time
from dataclasses import dataclass

from radixlm.runtime.args import ServerArgs
from radixlm.runtime.messages import SchedulerReady
from radixlm.runtime.ipc import PortArgs

logger = logging.getLogger(__name__)

READY_TIMEOUT_S = 600.0


@dataclass
class LaunchedRuntime:
    """Set by launch_subprocesses; owned by the main process."""

    server_args: ServerArgs
    ports: PortArgs
    procs: dict[str, mp.process.BaseProcess]
    info: SchedulerReady
    load_time_s: float

    def dead_child(self) -> str | None:
        """A description of the first child that has exited, or None while all run."""
        for name, p in self.procs.items():
            if not p.is_alive():
                return f"the {name} process exited (exit code {p.exitcode})"
        return None

    def shutdown(self, timeout: float = 10.0) -> None:
        """Idempotent."""
        for p in self.procs.values():
            if p.is_alive():
                p.terminate()
        deadline = time.monotonic() + timeout
        for p in self.procs.values():
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join(5)
        self.ports.cleanup()


def _wait_ready(conn, proc, name: str, deadline: float):
    while time.monotonic() < deadline:
        if conn.poll(0.2):
            return conn.recv()
        if not proc.is_alive():
            raise RuntimeError(f"the {name} process died while starting (exit code {proc.exitcode})")
    raise TimeoutError(f"the {name} process did not become ready in {READY_TIMEOUT_S:.0f}s")


def launch_subprocesses(server_args: ServerArgs) -> LaunchedRuntime:
    from radixlm.runtime.detokenizer_manager import run_detokenizer_process
    from radixlm.runtime.scheduler.process import run_scheduler_process

    t0 = time.perf_counter()
    ctx = mp.get_context("spawn")
    ports = PortArgs.new()
    sched_r, sched_w = ctx.Pipe(duplex=False)
    detok_r, detok_w = ctx.Pipe(duplex=False)
    procs = {
        "scheduler": ctx.Process(target=run_scheduler_process, args=(server_args, ports, sched_w), name="radixlm-scheduler", daemon=True),
        "detokenizer": ctx.Process(target=run_detokenizer_process, args=(server_args, ports, detok_w), name="radixlm-detokenizer", daemon=True),
    }
    for p in procs.values():
        p.start()
    runtime = LaunchedRuntime(server_args, ports, procs, SchedulerReady(), 0.0)
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        info: SchedulerReady = _wait_ready(sched_r, procs["scheduler"], "scheduler", deadline)
        if info.error:
            raise RuntimeError(f"the scheduler failed to start: {info.error}")
        err = _wait_ready(detok_r, procs["detokenizer"], "detokenizer", deadline)
        if err:
            raise RuntimeError(f"the detokenizer failed to start: {err}")
    except BaseException:
        runtime.shutdown()
        raise
    runtime.info = info
    runtime.load_time_s = time.perf_counter() - t0
    return runtime
