"""Does programmatic dependent launch (PDL) pay in a decode step's chain of GEMVs? A batch-1 decode step of an 8B model
is ~215 kernels in one CUDA graph, 129 of them GEMVs that stream their weights; each kernel boundary costs its drain,
its successor's launch and its ramp. With PDL (sm_90) a kernel launched with `launch_pdl=True` may start while its
predecessor finishes: it loads its first weight tile (which no earlier kernel writes), then waits at `gdc_wait` for the
predecessor's results (its activations), and the predecessor lets it start early (`gdc_launch_dependents`).

This script times the 8B layer's four GEMVs (qkv 6144x4096, o 4096x4096, gate_up 28672x4096, down 4096x14336) x
--layers in one CUDA graph, with a plain Triton GEMV kernel of its own (not the production skinny kernel), three ways:
`off` (plain launches), `pdl_code` (the wait and trigger compiled in, launched without PDL: what the code costs) and
`pdl` (launched with PDL); each chain's output is compared with `off`'s bit for bit, and each figure stands next to
the weights' bytes floor. The answer decides whether the production kernels (kernels/gemm/skinny_gemm.py, the
attention and norm kernels between them) take PDL.

    python benchmarks/kernels/pdl_chain.py --out $OUT            # on an H100/H200 (Triton >= 3.5)
    python benchmarks/kernels/pdl_chain.py --dry                 # the kernel's sums at tiny shapes, on the CPU
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

_COMPILED = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") != "1")
SHAPES = ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336))  # (N, K): qkv, o, gate_up, down


@triton.jit
def _gemv(X, W, Y, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_K)
    w_ptrs = W + rows[:, None] * K + cols[None, :]
    w = tl.load(w_ptrs)  # the weight: no earlier kernel writes it, so it may load before the wait
    if PDL and _COMPILED:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x = tl.load(X + k0 + cols)
        nxt = k0 + BLOCK_K
        w_next = tl.load(w_ptrs + nxt, mask=(nxt + cols < K)[None, :], other=0.0)
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
        w = w_next
    tl.store(Y + rows, tl.sum(acc, axis=1).to(Y.dtype.element_ty))


def gemv(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor, pdl_code: bool, pdl_launch: bool, block_n: int,
         block_k: int, num_warps: int) -> None:
    n, k = w.shape
    assert n % block_n == 0 and k % block_k == 0, (n, k)
    extra = {"launch_pdl": True} if pdl_launch else {}
    _gemv[(n // block_n,)](x, w, y, k, BLOCK_N=block_n, BLOCK_K=block_k, PDL=pdl_code, num_warps=num_warps, **extra)


def build_chain(layers: int, device: str, dtype: torch.dtype, scale_shapes: float = 1.0):
    g = torch.Generator(device=device).manual_seed(0)
    weights = []
    for _ in range(layers):
        for n, k in SHAPES:
            n, k = int(n * scale_shapes), int(k * scale_shapes)
            weights.append((torch.randn(n, k, generator=g, device=device) / k ** 0.5).to(dtype))
    x0 = torch.randn(weights[0].shape[1], generator=g, device=device).to(dtype)
    outs = [torch.empty(w.shape[0], device=device, dtype=dtype) for w in weights]
    return x0, weights, outs


def run_chain(x0, weights, outs, mode: str, cfg: dict) -> torch.Tensor:
    x = x0
    for w, y in zip(weights, outs):
        gemv(x[: w.shape[1]], w, y, mode != "off", mode == "pdl", **cfg)
        x = y
    return x


def time_graph(graph: torch.cuda.CUDAGraph, replays: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(replays):
        graph.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / replays * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--block-n", type=int, default=8)
    ap.add_argument("--block-k", type=int, default=512)
    ap.add_argument("--num-warps", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds of each mode; medians")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--bandwidth", type=float, default=4.8e12, help="bytes/s of the floor (H200 HBM3e)")
    ap.add_argument("--dry", action="store_true", help="tiny shapes under Triton's interpreter: the sums only")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    cfg = dict(block_n=args.block_n, block_k=args.block_k, num_warps=args.num_warps)
    if args.dry:
        if os.environ.get("TRITON_INTERPRET") != "1":
            os.environ["TRITON_INTERPRET"] = "1"
            os.execv(sys.executable, [sys.executable, *sys.argv])
        x0, weights, outs = build_chain(1, "cpu", torch.float32, scale_shapes=1 / 64)
        got = run_chain(x0, weights, outs, "pdl_code", dict(cfg, block_k=32))
        want = x0
        for w in weights:
            want = w @ want[: w.shape[1]]
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        print("dry: the chain's sums match torch")
        return
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU (or --dry)")
    x0, weights, outs = build_chain(args.layers, "cuda", torch.bfloat16)
    weight_bytes = sum(w.numel() * w.element_size() for w in weights)
    graphs, results = {}, {}
    for mode in ("off", "pdl_code", "pdl"):
        try:
            run_chain(x0, weights, outs, mode, cfg)  # compiles outside the capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                last = run_chain(x0, weights, outs, mode, cfg)
            graph.replay()
            torch.cuda.synchronize()
            results[mode] = last.clone()
            graphs[mode] = graph
        except Exception as e:  # noqa: BLE001 - reported: a Triton or driver without PDL in graphs
            print(f"{mode}: {type(e).__name__}: {e}"[:400], flush=True)
    times: dict[str, list[float]] = {m: [] for m in graphs}
    for _ in range(args.rounds):
        for mode, graph in graphs.items():
            times[mode].append(time_graph(graph, args.replays))
    floor_us = weight_bytes / args.bandwidth * 1e6
    kernels = len(weights)
    rows = {}
    for mode, ts in times.items():
        med = statistics.median(ts)
        rows[mode] = {"chain_us": med, "us_per_kernel": med / kernels, "over_floor": med / floor_us,
                      "same_output_as_off": bool(torch.equal(results[mode], results["off"])) if "off" in results
                      else None, "runs_us": ts}
        print(f"{mode:9s} chain {med:9.1f} us  {med / kernels:6.2f} us/kernel  {med / floor_us:5.2f}x floor  "
              f"same output {rows[mode]['same_output_as_off']}", flush=True)
    if "off" in rows and "pdl" in rows:
        saved = rows["off"]["chain_us"] - rows["pdl"]["chain_us"]
        print(f"pdl saves {saved:.1f} us a chain ({saved / kernels:.2f} us a kernel boundary); "
              f"pdl / off {rows['pdl']['chain_us'] / rows['off']['chain_us']:.3f}", flush=True)
    report = {"benchmark": "a decode step's GEMV chain with and without programmatic dependent launch",
              "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "command": " ".join(sys.argv), "layers": args.layers, "kernels": kernels, "config": cfg,
              "weight_bytes": weight_bytes, "floor_us": floor_us, "modes": rows}
    out = Path(args.out) / "pdl_chain.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
