"""Tunes the quantized few-row kernels (kernels/quant/fp8_gemv.py: FP8 per-channel and 128x128 blocks, weight-only;
int4_skinny.py: W4A16 group 128) on Llama-3.1-8B's four GEMM shapes at 1, 2, 4, 8, 16 rows, in one device call:
each candidate config is checked against kernels/quant/reference.py first, then timed as CUDA-graph replays over
distinct weight copies (benchmarks/lib/gpu_timing.py: no L2 hits, no launch gaps), beside the format's default path
(kernels.quant.fp8_linear / int4_linear without a table: W8A8 Triton + activation quantization, the INT4 GEMV or
tensor-core kernels), bf16 (the faster of cuBLAS and the skinny Triton kernels) and the bytes floor at 4.8 TB/s.
The few-row kernels take 1-4 rows; at 8 and 16 rows only the defaults and bf16 are timed (for the table beside them).

Writes $OUT/quant_gemv_sweep.json (every cell, the best per shape and row count) and $OUT/quant_gemv_<GPU>.json: the
tuned table, ready to commit as radixlm/runtime/kernels/gemm/tuned/quant_gemv_<GPU>.json (kernels/quant/
quant_tuned.py reads it; an entry only where the best candidate beat the default path by MARGIN).

    python3 benchmarks/kernels/quant_gemv_sweep.py --out $OUT          # ~5-7 min on an H200 (bash
                                                                       # benchmarks/lease/quant_gemv_lease.sh)
    TRITON_INTERPRET=1 python benchmarks/kernels/quant_gemv_sweep.py --dry --out /tmp/qg   # the logic on the CPU
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.lib.gpu_timing import SHAPES, graph_us, within_budget  # noqa: E402
from benchmarks.kernels.quant_gemm import floor_us, rel_err, tree, wall_us  # noqa: E402
from radixlm.runtime.kernels import quant  # noqa: E402
from radixlm.runtime.kernels.quant import reference as ref  # noqa: E402
from radixlm.runtime.kernels.quant.fp8_gemv import Fp8GemvConfig, fp8_gemv_linear  # noqa: E402
from radixlm.runtime.kernels.quant.int4_skinny import Int4GemvConfig, w4a16_skinny_linear  # noqa: E402

LAYER = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
FORMATS = ("fp8_channel", "fp8_block", "w4a16")
ROWS = (1, 2, 4, 8, 16)
KERNEL_ROWS = 4  # the few-row kernels' most rows
GROUP = 128
BLOCK = (128, 128)
MARGIN = 1.03  # a table entry only where the candidate beats the default path by this much
TOLERANCE = 2e-2
PROGRAMS_PER_SM = 4  # the split-K candidates bring N's programs up to this many an SM


def fp8_candidates(rows: int) -> list[tuple[int, int]]:
    """(BLOCK_N, num_warps); BLOCK_K is 256 x num_warps: the weight words' layout then matches x's 16-byte loads
    (fp8_gemv._fp8_gemv_kernel), no shared-memory conversion in the K loop."""
    return {1: [(4, 4), (8, 4), (4, 8), (8, 2)], 2: [(4, 4), (8, 4), (4, 8)], 4: [(2, 4), (4, 4), (2, 8)]}[rows]


def int4_candidates(rows: int) -> list[tuple[int, int, int]]:
    """(BLOCK_N, BLOCK_K, num_warps): 4 words (16 bytes) a thread along N. BLOCK_N = 128 x num_warps puts every warp
    along N, so that the scales' and zeros' loads share the words' layout (otherwise converted through shared memory
    each tile: the (256, 64, 4) candidate)."""
    return {1: [(512, 32, 4), (512, 64, 4), (1024, 32, 8), (256, 32, 2), (256, 64, 4)],
            2: [(512, 32, 4), (1024, 32, 8), (256, 32, 2)],
            4: [(512, 32, 4), (256, 32, 2), (1024, 32, 8)]}[rows]


def splits(n: int, k: int, block_n: int, block_k: int, sms: int) -> list[int]:
    """No split, and the split that brings N's programs to PROGRAMS_PER_SM an SM (at least two tiles each)."""
    programs = -(-n // block_n)
    k_tiles = -(-k // block_k)
    want = min(16, max(1, (PROGRAMS_PER_SM * sms) // programs), max(1, k_tiles // 2))
    return sorted({1, want})


def configs(fmt: str, rows: int, n: int, k: int, sms: int, dry: bool) -> list:
    if rows > KERNEL_ROWS:
        return []
    out = []
    if fmt.startswith("fp8"):
        for bn, warps in fp8_candidates(rows):
            bk = 256 * warps if not dry else 64
            out += [Fp8GemvConfig(bn, bk, s, warps if not dry else 1, 1) for s in splits(n, k, bn, bk, sms)]
    else:
        for bn, bk, warps in int4_candidates(rows):
            bn = bn if not dry else 16
            out += [Int4GemvConfig(bn, bk, s, warps if not dry else 1, 1) for s in splits(n, k, bn, bk, sms)]
    return list(dict.fromkeys(out))


def make_weights(fmt: str, n: int, k: int, device: str, copies: int) -> list:
    made = []
    for _ in range(copies):
        w = torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02
        if fmt == "bf16":
            made.append(w if device == "cuda" else w.float())  # (--dry: float32 activations)
        elif fmt == "fp8_channel":
            made.append(ref.quant_fp8(w, per_channel=True))
        elif fmt == "fp8_block":
            made.append(ref.quant_fp8(w, block=BLOCK))
        else:
            made.append(ref.quant_int4(w, GROUP, dtype=torch.bfloat16))
    return made


def run(fmt: str, x: torch.Tensor, weight, cfg=None) -> torch.Tensor:
    """cfg None: the format's default path (no tuned table: the sweep's process never installs one)."""
    block = BLOCK if fmt == "fp8_block" else None
    if fmt == "bf16":
        return F.linear(x, weight)
    if fmt.startswith("fp8"):
        if cfg is None:
            return quant.fp8_linear(x, *weight, block)
        return fp8_gemv_linear(x, *weight, block, None, cfg)
    if cfg is None:
        return quant.int4_linear(x, *weight, GROUP)
    return w4a16_skinny_linear(x, *weight, GROUP, None, None, cfg)


def want(fmt: str, x: torch.Tensor, weight) -> torch.Tensor:
    if fmt.startswith("fp8"):
        return ref.fp8_linear(x.float(), *weight, BLOCK if fmt == "fp8_block" else None)
    return ref.int4_linear(x.float(), *[t.float() if t.is_floating_point() else t for t in weight], GROUP)


def bf16_kernels(m: int):
    """The bf16 candidates at m rows: cuBLAS, and the skinny Triton kernels where they take m rows."""
    out = {"cublas": lambda x, w: F.linear(x, w)}
    if not torch.cuda.is_available():
        return out
    from radixlm.runtime.kernels.gemm import skinny_gemm, skinny_mma

    if m <= skinny_gemm.SKINNY_MAX_M:
        out["skinny"] = lambda x, w: skinny_gemm.skinny_linear(x, w)
    if skinny_mma.MMA_MIN_M <= m <= skinny_mma.MMA_MAX_M:
        out["skinny_mma"] = lambda x, w: skinny_mma.skinny_mma_linear(x, w)
    return out


def table_entry(fmt: str, n: int, k: int, m: int, best: dict, default_us: float, floor: float) -> dict:
    group = {"fp8_channel": 0, "fp8_block": BLOCK[1]}.get(fmt, GROUP)
    return {"kernel": fmt, "n": n, "k": k, "rows": m, "group": group,
            "config": best["config"], "us": round(best["us"], 2), "default_us": round(default_us, 2),
            "floor_us": round(floor, 2)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, nargs="+", default=list(ROWS))
    p.add_argument("--shapes", nargs="+", default=list(LAYER), choices=list(LAYER))
    p.add_argument("--formats", nargs="+", default=list(FORMATS), choices=list(FORMATS))
    p.add_argument("--budget-s", type=float, default=400.0, help="stop starting (format, shape) pairs after this")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--dry", action="store_true", help="on the CPU under TRITON_INTERPRET=1: tiny shapes, wall clock")
    args = p.parse_args()
    import dataclasses

    import triton

    t0 = time.perf_counter()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    device = "cpu" if args.dry else "cuda"
    gpu = "cpu (dry)" if args.dry else torch.cuda.get_device_name()
    sms = 132 if args.dry else torch.cuda.get_device_properties(0).multi_processor_count
    timer = wall_us if args.dry else graph_us
    result = {"benchmark": "quant_gemv_sweep", "gpu": gpu, "torch": torch.__version__, "triton": triton.__version__,
              "command": " ".join(sys.argv), "tree": tree(), "cells": [], "best": []}
    table = {"gpu": gpu, "torch": torch.__version__, "triton": triton.__version__, "margin": MARGIN,
             "commands": [" ".join(["benchmarks/kernels/quant_gemv_sweep.py", *sys.argv[1:]])], "tree": tree(),
             "entries": []}
    bf16_us: dict[tuple[str, int], tuple[str, float]] = {}
    pairs = [(fmt, name) for name in args.shapes for fmt in ("bf16", *args.formats)]
    for fmt, name in within_budget(pairs, t0, args.budget_s):
        n, k = SHAPES[name]
        if args.dry:
            n, k = n // 64, k // 32
        weight_bytes = 2 * n * k if fmt == "bf16" else (n * k if fmt.startswith("fp8") else n * k // 2)
        copies = 2 if args.dry else max(2, min(16, -(-600_000_000 // weight_bytes)))
        ws = make_weights(fmt, n, k, device, copies)
        for m in args.rows:
            x = torch.randn(m, k, device=device, dtype=torch.float32 if args.dry else torch.bfloat16)
            floor = floor_us(fmt, n, k, m)
            if fmt == "bf16":
                times = {kn: timer(lambda i, f=f: f(x, ws[i]), copies) for kn, f in bf16_kernels(m).items()}
                kn = min(times, key=times.get)
                bf16_us[(name, m)] = (kn, times[kn])
                result["cells"] += [{"format": "bf16", "shape": name, "rows": m, "kernel": kern, "us": us,
                                     "floor_us": floor} for kern, us in times.items()]
                continue
            default_us = timer(lambda i: run(fmt, x, ws[i]), copies)
            result["cells"].append({"format": fmt, "shape": name, "rows": m, "kernel": "default", "us": default_us,
                                    "floor_us": floor, "rel_err": rel_err(run(fmt, x, ws[0]), want(fmt, x, ws[0]))})
            best = None
            for cfg in configs(fmt, m, n, k, sms, args.dry):
                cell = {"format": fmt, "shape": name, "rows": m, "kernel": "gemv", "config": dataclasses.asdict(cfg),
                        "floor_us": floor}
                try:
                    cell["rel_err"] = rel_err(run(fmt, x, ws[0], cfg), want(fmt, x, ws[0]))
                    if cell["rel_err"] > TOLERANCE:
                        cell["error"] = "wrong result"
                    else:
                        cell["us"] = timer(lambda i, cfg=cfg: run(fmt, x, ws[i], cfg), copies)
                except Exception as e:  # noqa: BLE001 - a config that does not build or launch here is skipped
                    cell["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                result["cells"].append(cell)
                if "us" in cell and (best is None or cell["us"] < best["us"]):
                    best = cell
            b_kernel, b_us = bf16_us.get((name, m), ("-", float("nan")))
            summary = {"format": fmt, "shape": name, "rows": m, "default_us": default_us, "floor_us": floor,
                       "bf16_kernel": b_kernel, "bf16_us": b_us, "best_us": best["us"] if best else None,
                       "best_config": best["config"] if best else None}
            result["best"].append(summary)
            if best is not None and best["us"] * MARGIN < default_us:
                table["entries"].append(table_entry(fmt, n, k, m, best, default_us, floor))
            print(f"{fmt:>11} {name:>12} rows {m:>2}: default {default_us:7.1f} us, "
                  + (f"best {best['us']:7.1f} {best['config']}" if best else "no few-row candidate")
                  + f"; bf16 {b_kernel} {b_us:.1f}; floor {floor:.1f}", flush=True)
        ws = None  # (frees the copies before the next pair)
        if not args.dry:
            torch.cuda.empty_cache()
        (out_dir / "quant_gemv_sweep.json").write_text(json.dumps(result, indent=1) + "\n")
    result["wall_s"] = time.perf_counter() - t0
    result["layer"] = layer_sums(result["best"], args.rows)
    (out_dir / "quant_gemv_sweep.json").write_text(json.dumps(result, indent=1) + "\n")
    from radixlm.runtime.kernels.gemm.cublaslt import table_path

    table_file = out_dir / table_path(gpu if not args.dry else "cpu dry", "quant_gemv").name
    table_file.write_text(json.dumps(table, indent=1) + "\n")
    print("\none layer's four GEMMs (us): rows, bf16 best | per format: default -> tuned (floor), vs bf16")
    for row in result["layer"]:
        print(f"rows {row['rows']:>2}: bf16 {row['bf16_us']:.1f} | " + " | ".join(
            f"{fmt} {row[fmt]['default_us']:.1f} -> {row[fmt]['tuned_us']:.1f} ({row[fmt]['floor_us']:.1f}), "
            f"{row[fmt]['tuned_us'] / row['bf16_us']:.2f}x" for fmt in args.formats if fmt in row))
    print(f"\n{len(table['entries'])} table entries -> {table_file} (install: cp it to "
          f"radixlm/runtime/kernels/gemm/tuned/{table_file.name}); {result['wall_s']:.0f} s")


def layer_sums(best: list[dict], rows: list[int]) -> list[dict]:
    """Per row count, the four shapes summed: bf16's best, and per format its default and the tuned choice (the
    faster of the default and the best candidate, as the table would dispatch)."""
    out = []
    for m in rows:
        cells = [b for b in best if b["rows"] == m]
        shapes = {b["shape"] for b in cells}
        if len(shapes) < len(LAYER):
            continue
        row = {"rows": m, "bf16_us": sum({b["shape"]: b["bf16_us"] for b in cells}.values())}
        for fmt in FORMATS:
            mine = [b for b in cells if b["format"] == fmt]
            if len(mine) == len(LAYER):
                row[fmt] = {"default_us": sum(b["default_us"] for b in mine),
                            "tuned_us": sum(min(b["default_us"], b["best_us"] or float("inf")) for b in mine),
                            "floor_us": sum(b["floor_us"] for b in mine)}
        out.append(row)
    return out


if __name__ == "__main__":
    main()
