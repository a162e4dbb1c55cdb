"""The skinny (M <= 4) decode GEMM against cuBLAS (F.linear) on Llama-3.1-8B's shapes: time per call and the
weight-read bandwidth, bf16.

    python benchmarks/skinny_gemm_gpu.py --out $OUT/skinny_gemm_gpu.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from radixlm.runtime.layers.skinny_gemm import skinny_linear

SHAPES = {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up_proj": (28672, 4096), "down_proj": (4096, 14336),
          "lm_head": (128256, 4096)}


def bench(fn, reps: int = 200) -> float:
    for _ in range(10):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps * 1e3  # us


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="benchmarks/results/skinny_gemm_gpu.json")
    args = p.parse_args()
    rows = []
    for name, (n, k) in SHAPES.items():
        torch.cuda.empty_cache()
        # Enough copies of W that cycling through them never hits in the 50 MB L2 (as in a model's forward).
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(max(2, -(-400_000_000 // (n * k * 2))))]
        for m in (1, 2, 4):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            torch.testing.assert_close(skinny_linear(x, ws[0]), F.linear(x, ws[0]), rtol=2e-2, atol=2e-2)
            it = iter(range(10**9))
            ours = bench(lambda: skinny_linear(x, ws[next(it) % len(ws)]))
            cublas = bench(lambda: F.linear(x, ws[next(it) % len(ws)]))
            gbytes = n * k * 2 / 1e9
            rows.append({"shape": name, "n": n, "k": k, "m": m, "skinny_us": ours, "cublas_us": cublas,
                         "skinny_TBps": gbytes / ours * 1e3, "cublas_TBps": gbytes / cublas * 1e3})
            print(f"{name:13} m={m}: skinny {ours:8.1f} us ({rows[-1]['skinny_TBps']:.2f} TB/s)  "
                  f"cuBLAS {cublas:8.1f} us ({rows[-1]['cublas_TBps']:.2f} TB/s)", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "command": " ".join(["python", *sys.argv]),
                                          "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
