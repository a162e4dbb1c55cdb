"""Runs a function on N gloo ranks in spawned processes (the CPU stand-in for N GPUs) and returns each rank's result.

The function must be importable (module level); it is called as fn(parallel, *args) with the rank's `Parallel`."""
from __future__ import annotations

import os
import socket
import traceback

import torch.multiprocessing as mp

RANK_TIMEOUT_S = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world: int, port: int, ep_size: int, fn, args, results) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    from radixlm.runtime.distributed.parallel import Parallel

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=RANK_TIMEOUT_S))
        parallel = Parallel(tp_rank=rank, tp_size=world, ep_size=ep_size, group=dist.group.WORLD)
        results[rank] = ("ok", fn(parallel, *args))
    except BaseException:  # noqa: BLE001 - reported to the test
        results[rank] = ("error", traceback.format_exc())
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(world: int, fn, *args, ep_size: int = 1) -> list:
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        results = manager.dict()
        port = free_port()
        procs = [ctx.Process(target=_rank_main, args=(r, world, port, ep_size, fn, args, results), daemon=True)
                 for r in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(RANK_TIMEOUT_S)
        for p in procs:
            if p.is_alive():
                p.kill()
        out = []
        for r in range(world):
            status, value = results.get(r, ("error", f"rank {r} exited without a result"))
            if status != "ok":
                raise AssertionError(f"rank {r} failed:\n{value}")
            out.append(value)
        return out
