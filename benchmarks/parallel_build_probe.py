"""Do Triton kernel builds run in parallel threads? (issue 20: a cold start-up spends ~20 s building kernels one after
another, and the 45 s target is met with under 1 s to spare.)

Builds 7 of the skinny GEMM's 8 autotune configs each way, into an empty cache directory, through
JITFunction.warmup (compile, no launch): serially for one row, then in a thread pool for two rows (another row count,
so that no build finds the other's kernel in Triton's in-memory cache; config 0 at one row is built first, untimed).
Prints the seconds each way.

    python benchmarks/parallel_build_probe.py --out $OUT/parallel_build_probe.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton_probe_")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from radixlm.runtime.layers.skinny_gemm import _CONFIGS, _skinny_kernel  # noqa: E402


def build(m: int, cfg) -> float:
    t0 = time.perf_counter()
    x = torch.empty(m, 4096, dtype=torch.bfloat16, device="cuda")
    w = torch.empty(6144, 4096, dtype=torch.bfloat16, device="cuda")
    y = torch.empty(m, 6144, dtype=torch.bfloat16, device="cuda")
    _skinny_kernel.fn.warmup(x, w, w, y, 6144, 4096, x.stride(0), w.stride(0), y.stride(0), M=m, HAS_BIAS=False,
                             grid=(1,), num_warps=cfg.num_warps, num_stages=cfg.num_stages, **cfg.kwargs)
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="/tmp/parallel_build_probe.json")
    p.add_argument("--threads", type=int, default=8)
    args = p.parse_args()
    torch.cuda.init()
    torch.empty(1, device="cuda")
    build(1, _CONFIGS[0])  # the launcher stub and the first-use costs, outside the timing
    result = {"gpu": torch.cuda.get_device_name(), "cpus": os.cpu_count(), "kernels_per_mode": len(_CONFIGS) - 1}
    t0 = time.perf_counter()
    each = [build(1, c) for c in _CONFIGS[1:]]
    result["serial_s"] = time.perf_counter() - t0
    result["serial_each_s"] = each
    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.threads) as ex:
        each = list(ex.map(lambda c: build(2, c), _CONFIGS[1:]))
    result["threads_s"] = time.perf_counter() - t0
    result["threads_each_s"] = each
    print(json.dumps(result, indent=1), flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
