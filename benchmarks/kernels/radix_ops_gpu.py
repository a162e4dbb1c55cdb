"""Radix-tree operations on a CUDA KV allocator in isolation (no model): per-call host time of insert, match, evict
and their frees, with the GPU idle and with the GPU busy on queued work (as under the overlap scheduler).

    python benchmarks/kernels/radix_ops_gpu.py --out $OUT/radix_ops_gpu.json
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

from radixlm.runtime.cache.memory_pool import ReqToTokenPool, TokenToKVPoolAllocator
from radixlm.runtime.cache.radix_cache import RadixCache, RadixKey


def run(pool_tokens: int, n_reqs: int, busy: bool) -> dict:
    alloc = TokenToKVPoolAllocator(pool_tokens, 1, "cuda", debug=False)
    cache = RadixCache(ReqToTokenPool(4, 8, "cuda"), alloc, page_size=1)
    rng = random.Random(0)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    times = {"insert": [], "match": [], "evict": [], "alloc": []}
    for _ in range(n_reqs):
        if busy:
            for _ in range(4):  # ~several ms of queued GPU work, as a running batch would be
                a @ a
        key = RadixKey([rng.randrange(128000) for _ in range(1536)])
        t0 = time.perf_counter()
        if alloc.available_size() < 1536:
            cache.evict(1536 - alloc.available_size())
        t1 = time.perf_counter()
        value = alloc.alloc(1536)
        t2 = time.perf_counter()
        cache.match_prefix(key[:1023])
        t3 = time.perf_counter()
        cache.insert(key, value)
        t4 = time.perf_counter()
        if t1 - t0 > 1e-6:
            times["evict"].append(t1 - t0)
        times["alloc"].append(t2 - t1)
        times["match"].append(t3 - t2)
        times["insert"].append(t4 - t3)
    torch.cuda.synchronize()
    return {k: {"calls": len(v), "mean_us": 1e6 * sum(v) / max(len(v), 1), "max_us": 1e6 * max(v, default=0)}
            for k, v in times.items()}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--pool-tokens", type=int, default=390_000)
    p.add_argument("--requests", type=int, default=600)
    p.add_argument("--out", default="benchmarks/results/kernels/radix_ops_gpu.json")
    args = p.parse_args()
    result = {"command": " ".join(["python", *sys.argv]), "gpu": torch.cuda.get_device_name()}
    for busy in (False, True):
        result["gpu_busy" if busy else "gpu_idle"] = r = run(args.pool_tokens, args.requests, busy)
        print("busy" if busy else "idle", json.dumps(r))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
