"""All-reduce latency on the GPUs of one host, as a decode step pays it (benchmarks/multi_gpu/gpu_multi.py --parts
allreduce): bf16 tensors of 8 KiB (batch 1 of an 8B model) to 8 MiB, each path replayed from a CUDA graph of REPS
calls (and NCCL once eagerly), microseconds per call:

  nccl_eager   dist.all_reduce outside graphs
  nccl_graph   dist.all_reduce captured in a CUDA graph
  one_shot     symmetric memory, PyTorch's one_shot_all_reduce_copy_out (radixlm's path up to 1 MiB), in a graph
  two_shot     copy into symmetric memory + PyTorch's two_shot_all_reduce_out (radixlm's path above), in a graph

and then, per row count of a (rows, 4096) bf16 decode activation, the all-reduce with the residual add and RMSNorm
after it, in a graph: `unfused` (the all-reduce above, then the norm kernel) against `fused` (one kernel,
kernels/elementwise/allreduce_rmsnorm.py; the default since it won here at every row count), its sum + residual
checked bit for bit against the unfused one's.

Every path's sum is checked. NVLink multicast stays off (the caller exports NCCL_NVLS_ENABLE=0 and
TORCH_SYMM_MEM_DISABLE_MULTICAST=1)."""
from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from radixlm.runtime.distributed.symm_all_reduce import build_symm_all_reduce

REPS = 50


def graph_us(fn, device, reps: int = REPS, replays: int = 10) -> float:
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    graph.replay()
    torch.cuda.synchronize(device)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(replays):
        graph.replay()
    torch.cuda.synchronize(device)
    return (time.perf_counter() - t0) / (replays * reps) * 1e6


def eager_us(fn, device, reps: int = 200) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize(device)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize(device)
    return (time.perf_counter() - t0) / reps * 1e6


def rank_main(rank: int, world: int, port: int, sizes: list[int], out: str) -> None:
    device = f"cuda:{rank}"
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            device_id=torch.device(device))
    group = dist.group.WORLD
    comm = build_symm_all_reduce(group, device, lambda flags: flags, max(sizes), fuse_norm=True)  # + torch.ops.symm_mem
    if comm is not None:
        comm.one_shot_max_bytes = max(sizes)  # time one-shot at every size

    rows = []
    for nbytes in sizes:
        n = nbytes // 2
        x = torch.full((n,), float(rank + 1), dtype=torch.bfloat16, device=device)
        want = world * (world + 1) / 2
        row: dict = {"bytes": nbytes}
        y = x.clone()

        def nccl():
            y.copy_(x)
            dist.all_reduce(y, group=group)

        paths = {"nccl_eager": (lambda: eager_us(nccl, device), lambda: y),
                 "nccl_graph": (lambda: graph_us(nccl, device), lambda: y)}
        if comm is not None:
            box = {}

            def one_shot():
                box["out"] = comm.all_reduce(x)

            def two_shot():
                slot = comm.buffer.view(torch.bfloat16)[:n]
                slot.copy_(x)
                box["out"] = torch.ops.symm_mem.two_shot_all_reduce_out(slot, "sum", comm.group_name,
                                                                         torch.empty_like(x))

            paths["one_shot"] = (lambda: graph_us(one_shot, device), lambda: box["out"])
            paths["two_shot"] = (lambda: graph_us(two_shot, device), lambda: box["out"])
        for name, (timer, result) in paths.items():
            try:
                row[name + "_us"] = timer()
                torch.cuda.synchronize(device)
                row[name + "_ok"] = bool((result() == want).all())
            except Exception as e:  # noqa: BLE001 - reported in the table
                row[name + "_error"] = f"{type(e).__name__}: {e}"[:300]
        rows.append(row)
        if rank == 0:
            shown = "  ".join(f"{k[:-3]} {v:7.1f}" for k, v in row.items() if k.endswith("_us"))
            print(f"{nbytes >> 10:6d} KiB  {shown}", flush=True)
    norm_rows = norm_table(comm, device, rank) if comm is not None and comm.arnorm is not None else []
    if rank == 0:
        result = {"benchmark": "all-reduce latency, bf16, microseconds per call", "world_size": world,
                  "gpu": torch.cuda.get_device_name(device), "torch": torch.__version__,
                  "nccl": ".".join(map(str, torch.cuda.nccl.version())), "reps_per_graph": REPS,
                  "symmetric_memory": comm is not None, "rows": rows, "norm_rows": norm_rows,
                  "env": {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST")}}
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(result, indent=2) + "\n")
    dist.barrier()
    dist.destroy_process_group()


def norm_table(comm, device: str, rank: int, hidden: int = 4096) -> list[dict]:
    """The all-reduce + residual add + RMSNorm of `rows` decode rows, unfused and fused, us per call in a graph."""
    from radixlm.runtime.kernels.elementwise import rmsnorm

    comm.one_shot_max_bytes = 1 << 20
    g = torch.Generator(device=device).manual_seed(rank)
    shared = torch.Generator(device=device).manual_seed(7)
    weight = torch.randn(hidden, generator=shared, device=device).to(torch.bfloat16)
    out = []
    for n in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        x = torch.randn(n, hidden, generator=g, device=device).to(torch.bfloat16)
        residual = torch.randn(n, hidden, generator=shared, device=device).to(torch.bfloat16)
        box = {}

        def unfused():
            box["unfused"] = rmsnorm(comm.all_reduce(x), weight, 1e-5, residual)

        def fused():
            box["fused"] = comm.fused_add_rmsnorm(x, residual, weight, 1e-5)

        row = {"rows": n, "unfused_us": graph_us(unfused, device), "fused_us": graph_us(fused, device)}
        torch.cuda.synchronize(device)
        row["same_sum"] = bool(torch.equal(box["fused"][1], box["unfused"][1]))
        row["norm_max_diff"] = float((box["fused"][0].float() - box["unfused"][0].float()).abs().max())
        out.append(row)
        if rank == 0:
            print(f"norm rows {n:4d}  unfused {row['unfused_us']:7.1f}  fused {row['fused_us']:7.1f} us  "
                  f"same sum {row['same_sum']}", flush=True)
    return out


def measure(world: int, sizes_kib: list[int], out: Path) -> dict:
    """One process per GPU (rank 0 writes `out`); the table rank 0 wrote."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(world, port, [k << 10 for k in sizes_kib], str(out)), nprocs=world)
    return json.loads(out.read_text())
