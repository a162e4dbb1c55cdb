"""Host <-> device KV copies of the hierarchical cache (radixlm/runtime/cache/hicache/host_pool.py) on Llama-3.1-8B
shapes (32 layers x K and V, 8 KV heads x 128, bf16: 128 KiB a token), against the copy engine's own bandwidth
(one pinned <-> device copy of a contiguous block), in one device call:

- load (host -> device, HostKVPool.load, layer by layer) and backup (device -> host, HostKVPool.backup + flush, in
  nodes of --node-tokens) of 256 / 1024 / 4096 tokens, the host slots contiguous, in runs of 16 tokens (shuffled), or
  scattered one by one; `load`/`backup` as the server runs them (kernels through the device's mapping of the pinned
  pool where it has one, `uva`), `load_dma`/`backup_dma` through DMA calls per run of host slots (and the host-gather
  path for scattered slots), a second pool with uva off;
- each timed to completion (torch.cuda.synchronize) and for the host time the call itself takes (what the scheduler
  thread spends); tokens per ms, GB/s and the share of the copy engine's bandwidth; the copy calls it made;
- `legacy`: the copies as they were before the fix (a host index_select into a fresh pinned buffer and a scatter per
  buffer for a load; a gather, a stack, a pinned buffer and a host-side index_put per backup), for the same cases.

    python benchmarks/kernels/hicache_copy.py --out $OUT/hicache_copy.json       # ~1 min on an H200
    python benchmarks/kernels/hicache_copy.py --dry --out /tmp/hicache_copy.json   # CPU: tiny shapes, the logic"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from radixlm.runtime.cache.hicache.host_pool import HostKVPool  # noqa: E402
from radixlm.runtime.cache.memory_pool import TokenToKVPool  # noqa: E402

TOKENS = (256, 1024, 4096)
RUN_TOKENS = 16


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def timed(fn, dev: torch.device, reps: int) -> tuple[float, float]:
    """(median seconds to completion, median seconds of host time in fn)."""
    fn()
    sync(dev)
    total, host = [], []
    for _ in range(reps):
        sync(dev)
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        sync(dev)
        total.append(time.perf_counter() - t0)
        host.append(t1 - t0)
    return statistics.median(total), statistics.median(host)


def copy_engine(dev: torch.device, nbytes: int, reps: int) -> dict:
    """GB/s of one contiguous pinned -> device and device -> pinned copy."""
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=dev.type == "cuda")
    on_dev = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    h2d, _ = timed(lambda: on_dev.copy_(pinned, non_blocking=True), dev, reps)
    d2h, _ = timed(lambda: pinned.copy_(on_dev, non_blocking=True), dev, reps)
    return {"bytes": nbytes, "h2d_gb_s": round(nbytes / h2d / 1e9, 4), "d2h_gb_s": round(nbytes / d2h / 1e9, 4)}


def host_slots(layout: str, n: int, size: int, g: torch.Generator) -> torch.Tensor:
    if layout == "contiguous":
        return torch.arange(n) + 1
    if layout == f"runs{RUN_TOKENS}":
        runs = torch.randperm(size // RUN_TOKENS - 1, generator=g)[: n // RUN_TOKENS] + 1
        return (runs[:, None] * RUN_TOKENS + torch.arange(RUN_TOKENS)).reshape(-1)
    return torch.randperm(size, generator=g)[:n] + 1


def load(host: HostKVPool, hs: torch.Tensor, ds: torch.Tensor) -> None:
    """A load as admission issues it, then what the pass does before its last layer reads the KV."""
    host.load(hs, ds)
    waiter = host.take_layer_loads()
    if waiter is not None:
        waiter.wait_all()


def backup(host: HostKVPool, hs: torch.Tensor, ds: torch.Tensor, node: int) -> None:
    for s in range(0, len(hs), node):
        host.backup(ds[s : s + node], hs[s : s + node])
    host.flush()
    host.poll()


def legacy_load(host: HostKVPool, hs: torch.Tensor, ds: torch.Tensor) -> None:
    dev = host.device_pool.device
    rows = torch.empty((len(hs), *host.kv.shape[1:]), dtype=host.kv.dtype, pin_memory=dev.type == "cuda")
    torch.index_select(host.kv, 0, hs, out=rows)
    on_dev = rows.to(dev, non_blocking=True)
    idx = ds.to(dev)
    for i, b in enumerate(host.device_pool.buffers()):
        b[idx] = on_dev[:, i]


def legacy_backup(host: HostKVPool, ds: torch.Tensor, hs: torch.Tensor, node: int) -> None:
    dev = host.device_pool.device
    staged = []
    for s in range(0, len(ds), node):  # per node: a gather per buffer, a stack, a fresh pinned buffer
        idx = ds[s : s + node].to(dev)
        rows = torch.stack([b[idx] for b in host.device_pool.buffers()], dim=1)
        staging = torch.empty(rows.shape, dtype=rows.dtype, pin_memory=dev.type == "cuda")
        staging.copy_(rows, non_blocking=True)
        staged.append((hs[s : s + node], staging))
    sync(dev)
    for slots, staging in staged:  # then an indexed write into the pool on the host
        host.kv[slots] = staging


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry", action="store_true", help="CPU, tiny shapes: the script's logic")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--node-tokens", type=int, default=256, help="tokens per backed-up node")
    p.add_argument("--no-legacy", action="store_true")
    p.add_argument("--no-dma", action="store_true", help="skip the uva-off pool's load_dma/backup_dma")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/kernels/hicache_copy.json"))
    args = p.parse_args(argv)
    if args.dry:
        dev, layers, heads, dim, dtype, tokens, reps = torch.device("cpu"), 2, 2, 8, torch.float32, (64, 256), 2
    else:
        if not torch.cuda.is_available():
            sys.exit("needs CUDA (or --dry)")
        dev, layers, heads, dim, dtype = torch.device("cuda"), 32, 8, 128, torch.bfloat16
        tokens, reps = TOKENS, args.reps
    size = 4 * max(tokens)
    pool = TokenToKVPool(size, 1, dtype, layers, heads, dim, device=dev)
    t0 = time.perf_counter()
    host = HostKVPool(2 * size, pool)
    setup = time.perf_counter() - t0
    dma = HostKVPool(2 * size, pool, uva=False) if host.uva and not args.no_dma else None
    per_token = pool.layout.bytes_per_token
    ce = copy_engine(dev, max(tokens) * per_token, reps)
    print(f"host pool {host.mem_bytes() / 2**30:.2f} GiB, pinned {host.pinned}, uva {host.uva} ({setup:.1f} s); "
          f"{per_token} B/token; "
          f"copy engine h2d {ce['h2d_gb_s']} GB/s, d2h {ce['d2h_gb_s']} GB/s", flush=True)
    g = torch.Generator().manual_seed(0)
    cases = []
    layouts = ("contiguous", f"runs{RUN_TOKENS}", "scattered")
    for n in tokens:
        for layout in layouts:
            hs = host_slots(layout, n, 2 * size - RUN_TOKENS, g)
            ds = (torch.randperm(size, generator=g)[:n] + 1).to(dev)
            variants = {}
            for suffix, pool_ in (("", host), ("_dma", dma)):
                if pool_ is not None:
                    variants["load" + suffix] = lambda h=pool_: load(h, hs, ds)
                    variants["backup" + suffix] = lambda h=pool_: backup(h, hs, ds, args.node_tokens)
            if not args.no_legacy:
                variants["legacy_load"] = lambda: legacy_load(host, hs, ds)
                variants["legacy_backup"] = lambda: legacy_backup(host, ds, hs, args.node_tokens)
            for name, fn in variants.items():
                stats = (dma if name.endswith("_dma") else host).stats
                before = stats.as_dict()
                total, host_s = timed(fn, dev, reps)
                after = stats.as_dict()
                calls = {k: (after[k] - before[k]) // (reps + 1) for k in after if after[k] != before[k]}
                gbs = n * per_token / total / 1e9
                ref = ce["h2d_gb_s"] if "load" in name else ce["d2h_gb_s"]
                cases.append({"op": name, "tokens": n, "host_slots": layout, "ms": round(total * 1e3, 3),
                              "host_ms": round(host_s * 1e3, 3), "tokens_per_ms": round(n / total / 1e3, 1),
                              "gb_s": round(gbs, 4), "of_copy_engine": round(gbs / ref, 3), "calls": calls})
                c = cases[-1]
                print(f"{name:14s} {n:5d} {layout:10s} {c['ms']:8.3f} ms (host {c['host_ms']:7.3f}) "
                      f"{c['tokens_per_ms']:8.1f} tok/ms {c['gb_s']:7.2f} GB/s {c['of_copy_engine']:.2f}x CE "
                      f"{calls}", flush=True)
    report = {"command": "python benchmarks/kernels/hicache_copy.py " + " ".join(argv if argv is not None else
                                                                               sys.argv[1:]),
              "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
              "shapes": {"layers": layers, "kv_heads": heads, "head_dim": dim, "dtype": str(dtype),
                         "bytes_per_token": per_token},
              "host_pool": {"tokens": host.size, "gib": round(host.mem_bytes() / 2**30, 2), "pinned": host.pinned,
                            "uva": host.uva,
                            "setup_s": round(setup, 2)},
              "copy_engine": ce, "cases": cases}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
