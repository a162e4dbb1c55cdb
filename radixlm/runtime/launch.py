"""Starts the scheduler and detokenizer processes (forked by a preloaded forkserver: child_context), waits until
both are ready, and stops them (always: no orphan survives the launcher)."""
from __future__ import annotations

import logging
import multiprocessing as mp
import time
from dataclasses import dataclass

from radixlm.runtime.args import ServerArgs
from radixlm.runtime.messages import SchedulerReady
from radixlm.runtime.ipc import PortArgs, free_port

logger = logging.getLogger(__name__)

READY_TIMEOUT_S = 600.0
# The children are forked from one server process that imported these first (multiprocessing's forkserver): each
# spawned child imported torch, transformers and the scheduler's modules again (3-5 s of CPU a child), and the
# forkserver is as clean a parent as spawn's (one thread, no CUDA context, nothing run yet).
CHILD_PRELOAD = ("radixlm.runtime.scheduler.process", "radixlm.runtime.scheduler.scheduler",
                 "radixlm.runtime.executor.model_runner", "radixlm.runtime.detokenizer_manager",
                 "radixlm.runtime.model_loader.tokenizer", "transformers.models.auto.tokenization_auto",
                 "transformers.models.auto.configuration_auto", "transformers.activations")


def child_context() -> mp.context.BaseContext:
    """The context the server's children start in: a forkserver preloaded with CHILD_PRELOAD."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(CHILD_PRELOAD))
    return ctx


def start_child_server() -> None:
    """Starts the forkserver now rather than at the first child: its imports then overlap the caller's (the HTTP
    stack's, before it launches the children). Returns at once; the first child waits for the preload."""
    from multiprocessing import forkserver

    child_context()
    forkserver.ensure_running()


@dataclass
class LaunchedRuntime:
    """Set by launch_subprocesses; owned by the main process."""

    server_args: ServerArgs
    ports: PortArgs
    procs: dict[str, mp.process.BaseProcess]
    info: SchedulerReady
    load_time_s: float

    def dead_child(self) -> str | None:
        """What has exited, or None while all children run. Every dead child is named: one rank's death takes the
        others down within moments, and the first to die is the cause."""
        dead = [f"the {name} process exited (exit code {p.exitcode})" for name, p in self.procs.items()
                if not p.is_alive()]
        return "; ".join(dead) or None

    def shutdown(self, timeout: float = 10.0) -> None:
        """Idempotent. A stopped child (SIGSTOP) cannot act on the SIGTERM until continued: it is killed at once
        instead of after the timeout."""
        for p in self.procs.values():
            if p.is_alive():
                p.terminate()
        deadline = time.monotonic() + timeout
        for p in self.procs.values():
            p.join(0.0 if _stopped(p.pid) else max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join(5)
        self.ports.cleanup()


def _stopped(pid: int | None) -> bool:
    """The process is stopped by a signal (state T in /proc; False where there is no /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "T"
    except (OSError, IndexError):
        return False


def _wait_ready(conn, proc, name: str, deadline: float):
    while time.monotonic() < deadline:
        if conn.poll(0.2):
            return conn.recv()
        if not proc.is_alive():
            raise RuntimeError(f"the {name} process died while starting (exit code {proc.exitcode})")
    raise TimeoutError(f"the {name} process did not become ready in {READY_TIMEOUT_S:.0f}s")


def rank_init_method(server_args: ServerArgs) -> str:
    """Where the tensor-parallel ranks meet: node 0's --dist-init-addr, or a free local port."""
    return f"tcp://{server_args.dist_init_addr or f'127.0.0.1:{free_port()}'}"


def start_ranks(server_args: ServerArgs, ports: PortArgs | None, ctx, init_method: str,
                skip_rank0: bool = False) -> list[tuple[str, mp.process.BaseProcess, object]]:
    """This node's scheduler ranks, started: (name, process, ready pipe). Rank 0 (node 0) gets the ZMQ ports;
    skip_rank0: the caller runs rank 0 itself (the offline Engine)."""
    from radixlm.runtime.distributed.setup import RankPlacement
    from radixlm.runtime.scheduler.process import run_scheduler_process

    tp, per_node = server_args.tp_size, server_args.tp_size // server_args.nnodes
    started = []
    for rank in range(server_args.node_rank * per_node, (server_args.node_rank + 1) * per_node):
        if rank == 0 and skip_rank0:
            continue
        placement = RankPlacement(rank, init_method) if tp > 1 else None
        name = "scheduler" if rank == 0 else f"scheduler-rank{rank}"
        r, w = ctx.Pipe(duplex=False)
        p = ctx.Process(target=run_scheduler_process, args=(server_args, ports if rank == 0 else None, w, placement),
                        name=f"radixlm-{name}", daemon=True)
        p.start()
        started.append((name, p, r))
    return started


def wait_ranks(started, deadline: float) -> SchedulerReady | None:
    """Rank 0's report (else the first rank's started here) once every rank here is ready; the first rank to fail
    or die fails the start (its peers would otherwise wait in a collective until dist_timeout)."""
    infos: dict[str, SchedulerReady] = {}
    while len(infos) < len(started):
        for name, proc, conn in started:
            if name in infos:
                continue
            if conn.poll(0.05):
                info: SchedulerReady = conn.recv()
                if info.error:
                    raise RuntimeError(f"the {name} process failed to start: {info.error}")
                infos[name] = info
            elif not proc.is_alive():
                raise RuntimeError(f"the {name} process died while starting (exit code {proc.exitcode})")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the scheduler ranks did not become ready in {READY_TIMEOUT_S:.0f}s")
    return infos[started[0][0]] if started else None


def launch_subprocesses(server_args: ServerArgs) -> LaunchedRuntime:
    from radixlm.runtime.detokenizer_manager import run_detokenizer_process

    t0 = time.perf_counter()
    ctx = child_context()
    ports = PortArgs.new()
    detok_r, detok_w = ctx.Pipe(duplex=False)
    procs: dict[str, mp.process.BaseProcess] = {}
    runtime = LaunchedRuntime(server_args, ports, procs, SchedulerReady(), 0.0)
    try:
        started = start_ranks(server_args, ports, ctx, rank_init_method(server_args))
        procs.update((name, p) for name, p, _ in started)
        procs["detokenizer"] = ctx.Process(target=run_detokenizer_process, args=(server_args, ports, detok_w),
                                           name="radixlm-detokenizer", daemon=True)
        procs["detokenizer"].start()
        deadline = time.monotonic() + READY_TIMEOUT_S
        info = wait_ranks(started, deadline)
        err = _wait_ready(detok_r, procs["detokenizer"], "detokenizer", deadline)
        if err:
            raise RuntimeError(f"the detokenizer failed to start: {err}")
    except BaseException:
        runtime.shutdown()
        raise
    runtime.info = info
    runtime.load_time_s = time.perf_counter() - t0
    return runtime


def serve_worker_node(server_args: ServerArgs) -> None:
    """A node other than 0 (--node-rank > 0): runs its scheduler ranks until one exits (rank 0's loop stops them
    all), then stops the rest and exits non-zero if any failed."""
    ctx = mp.get_context("spawn")
    started = start_ranks(server_args, None, ctx, rank_init_method(server_args))
    procs = {name: p for name, p, _ in started}
    try:
        wait_ranks(started, time.monotonic() + READY_TIMEOUT_S)
        logger.info("node %d: ranks %s ready", server_args.node_rank, ", ".join(procs))
        while all(p.is_alive() for p in procs.values()):
            time.sleep(1.0)
    finally:
        for p in procs.values():
            if p.is_alive():
                p.terminate()
        for p in procs.values():
            p.join(10)
            if p.is_alive():
                p.kill()
    codes = [p.exitcode for p in procs.values()]
    if any(codes):
        raise SystemExit(f"node {server_args.node_rank}: a scheduler rank exited with {codes}")
