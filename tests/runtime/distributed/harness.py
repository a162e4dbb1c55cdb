"""Runs a function on N gloo ranks in spawned processes (the CPU stand-in for N GPUs) and returns each rank's result.

The function must be importable (module level); it is called as fn(parallel, *args) with the rank's `Parallel`.
The ranks are spawned once per test process and world size and run one call after another (a spawn imports torch in
each rank: seconds on 2 cores); each call gets a new `Parallel` and torch's generator as a fresh process has it. A
call that fails or times out ends its ranks: the next call spawns new ones."""
from __future__ import annotations

import atexit
import os
import queue
import socket
import time
import traceback

import torch.multiprocessing as mp

RANK_TIMEOUT_S = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_loop(rank: int, world: int, port: int, tasks, results) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    from radixlm.runtime.distributed.parallel import Parallel

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    fresh_seed = torch.initial_seed()
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=RANK_TIMEOUT_S))
    except BaseException:  # noqa: BLE001 - reported to the test by the first call
        error = traceback.format_exc()
        while tasks.get() is not None:
            results.put((rank, "error", error))
        return
    try:
        while (task := tasks.get()) is not None:
            fn, args, ep_size = task
            torch.manual_seed(fresh_seed)
            try:
                parallel = Parallel(tp_rank=rank, tp_size=world, ep_size=ep_size, group=dist.group.WORLD)
                results.put((rank, "ok", fn(parallel, *args)))
            except BaseException:  # noqa: BLE001 - reported to the test
                results.put((rank, "error", traceback.format_exc()))
    finally:
        dist.destroy_process_group()


class RankPool:
    def __init__(self, world: int) -> None:
        ctx = mp.get_context("spawn")
        self.world = world
        self.tasks = [ctx.Queue() for _ in range(world)]
        self.results = ctx.Queue()
        port = free_port()
        self.procs = [ctx.Process(target=_rank_loop, args=(r, world, port, self.tasks[r], self.results), daemon=True)
                      for r in range(world)]
        for p in self.procs:
            p.start()

    def alive(self) -> bool:
        return all(p.is_alive() for p in self.procs)

    def run(self, fn, args: tuple, ep_size: int) -> list:
        for q in self.tasks:
            q.put((fn, args, ep_size))
        got: dict[int, tuple[str, object]] = {}
        deadline = time.monotonic() + RANK_TIMEOUT_S
        while len(got) < self.world and time.monotonic() < deadline:
            try:
                rank, status, value = self.results.get(timeout=1.0)
                got[rank] = (status, value)
                if status != "ok":  # the others may wait on this one in a collective: a short grace, not the timeout
                    deadline = min(deadline, time.monotonic() + 10)
            except queue.Empty:
                if not self.alive():  # a rank died without a result: the others may wait on it forever
                    break
        out = []
        for r in range(self.world):
            status, value = got.get(r, ("error", f"rank {r} exited or timed out without a result"))
            if status != "ok":
                raise AssertionError(f"rank {r} failed:\n{value}")
            out.append(value)
        return out

    def close(self) -> None:
        for q in self.tasks:
            try:
                q.put(None)
            except (OSError, ValueError):
                pass
        for p in self.procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()


# The test process's rank pools by world size: subprocesses kept for the process's lifetime (atexit ends them), not
# state any test reads.
_POOLS: dict[int, RankPool] = {}


def _close_pools() -> None:
    for pool in _POOLS.values():
        pool.close()
    _POOLS.clear()


atexit.register(_close_pools)


def run_ranks(world: int, fn, *args, ep_size: int = 1) -> list:
    pool = _POOLS.get(world)
    if pool is None or not pool.alive():
        if pool is not None:
            pool.close()
        pool = _POOLS[world] = RankPool(world)
    try:
        return pool.run(fn, args, ep_size)
    except BaseException:
        _POOLS.pop(world, None)
        pool.close()
        raise
