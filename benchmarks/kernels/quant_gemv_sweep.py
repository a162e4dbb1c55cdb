"""Tunes the quantized few-row GEMM kernels on Llama-3.1-8B's four GEMM shapes, in one device call, and writes their
tuned table (radixlm/runtime/kernels/gemm/tuned/quant_gemv_<GPU>.json, read by kernels/quant/quant_tuned.py):

- --kind gemv (the default): the CUDA-core kernels (kernels/quant/fp8_gemv.py: FP8 per-channel and 128x128 blocks,
  weight-only; int4_skinny.py: W4A16 group 128) at 1, 2, 4, 8, 16 rows beside the format's default path
  (kernels.quant.fp8_linear / int4_linear without a table: W8A8 Triton + activation quantization, the INT4 GEMV or
  tensor-core kernels). The kernels take 1-4 rows; at 8 and 16 rows only the defaults and bf16 are timed (for the
  table beside them). An entry per (format, shape, rows) where the best candidate beat the default by MARGIN.
- --kind mma: the W4A16 tensor-core kernel (kernels/quant/int4_mma.py, group 128) at 8, 16, 32, 64, 128, 256 rows
  beside the default W4A16 path (int4_gemm.w4a16_linear with its row bucket's INT4_CONFIGS tile). An entry per row
  bucket (tiles.ROW_BUCKETS 8, 16, 64, 256: rows 32 and 64 share bucket 64, 128 and 256 share 256): the config with
  the least summed quick time over the bucket's row counts, timed again as the default was, written where that sum
  beats the default's by MARGIN (benchmarks/lib/quant_sweep.sweep_buckets).
- --kind fp8mma: the same for the FP8 W8A8 tensor-core kernel (kernels/quant/fp8_mma.py; table kind fp8_mma) on
  per-channel weights (its group-0 entries serve per-tensor weights too) and 128x128 blocks (fused activation
  quantization or fp8_act's launch), beside today's FP8 path at these rows (fp8_gemm.fp8_scaled_linear: fp8_act +
  the W8A8 Triton kernel below 33 rows, torch._scaled_mm from 33; fp8_block_linear), checked against
  reference.fp8_linear_w8a8.

Each candidate is checked against kernels/quant/reference.py first, then timed as CUDA-graph replays over distinct
weight copies (benchmarks/lib/gpu_timing.py: no L2 hits, no launch gaps), beside bf16 (the faster of cuBLAS and the
skinny Triton kernels) and the bytes floor at 4.8 TB/s. Writes $OUT/quant_gemv_sweep.json (gemv),
$OUT/w4a16_mma_sweep.json (mma) or $OUT/fp8_mma_sweep.json (fp8mma): every cell and the layer's sums per row count;
and $OUT/quant_gemv_<GPU>.json: the committed table with the swept (kernel, shape, rows, group) entries replaced,
ready to commit in its place.

    python3 benchmarks/kernels/quant_gemv_sweep.py --out $OUT              # ~5-7 min on an H200 (bash
                                                                           # benchmarks/lease/quant_lease.sh gemv)
    python3 benchmarks/kernels/quant_gemv_sweep.py --kind mma --out $OUT   # ~4-5 min (lease/quant_lease.sh mma)
    python3 benchmarks/kernels/quant_gemv_sweep.py --kind fp8mma --out $OUT   # ~5-6 min (quant_lease.sh fp8mma)
    python3 benchmarks/kernels/quant_gemv_sweep.py --kind fp8mma --rows 8 64 --vary split_k=1,2,4,8 num_stages=3,4 \
        --out $OUT                                                         # the table's configs, one field changed
    TRITON_INTERPRET=1 python benchmarks/kernels/quant_gemv_sweep.py [--kind mma] --dry --out /tmp/qg   # on the CPU
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from enum import Enum
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.lib.gpu_timing import SHAPES, graph_us, quick_us, tree, wall_us, within_budget  # noqa: E402
from benchmarks.lib.quant_sweep import (  # noqa: E402
    BLOCK, GROUP, KERNEL_ROWS, LAYER, MARGIN, BucketFormat, Setup, bf16_best, floor_us, gemv_configs, parse_vary,
    rel_err, sweep_buckets, try_candidate, vary_buckets, write_table)
from radixlm.runtime.kernels import quant  # noqa: E402
from radixlm.runtime.kernels.quant import fp8_gemm, reference as ref, tiles  # noqa: E402
from radixlm.runtime.kernels.quant.fp8_gemv import fp8_gemv_linear  # noqa: E402
from radixlm.runtime.kernels.quant.fp8_mma import Fp8MmaConfig, fp8_mma_linear  # noqa: E402
from radixlm.runtime.kernels.quant.int4_mma import Int4MmaConfig, XLoad, takes, w4a16_mma_linear  # noqa: E402
from radixlm.runtime.kernels.quant.int4_skinny import w4a16_skinny_linear  # noqa: E402


class Kind(str, Enum):
    GEMV = "gemv"
    MMA = "mma"
    FP8MMA = "fp8mma"


FORMATS = ("fp8_channel", "fp8_block", "w4a16")
ROWS = {Kind.GEMV: (1, 2, 4, 8, 16), Kind.MMA: (8, 16, 32, 64, 128, 256), Kind.FP8MMA: (8, 16, 32, 64, 128, 256)}
BUDGET_S = {Kind.GEMV: 400.0, Kind.MMA: 240.0, Kind.FP8MMA: 300.0}
_S, _G = XLoad.SPLIT, XLoad.GATHERED
# (block_m, block_n, block_k, num_warps, num_stages, x_load, asm) by row bucket: the split and gathered x loads without
# asm on one tile, then the packed asm dequantization on wider tiles (sm_90 SASS of the K loop with Triton 3.9,
# instructions a weight: 16 x 64 x 128 gathered 7.0, with asm 5.8; 16 x 128 x 128 asm 4.3; 16 x 128 x 256 asm 3.6;
# 64 x 128 x 256 asm 3.4; the strided load 7-10 and 256 x 64 tiles on four warps (spilled) were dropped: the retired
# kernels/w4a16_mma_sass.py, benchmarks/RETIRED.md).
MMA_CANDIDATES = {
    16: [(16, 64, 128, 4, 4, _S, False), (16, 128, 256, 4, 4, _S, True), (16, 64, 128, 4, 4, _G, False),
         (16, 64, 128, 4, 4, _G, True), (16, 128, 128, 4, 4, _G, True), (16, 128, 128, 4, 4, _S, True),
         (16, 128, 256, 4, 3, _G, True), (16, 64, 256, 4, 3, _G, True), (16, 128, 128, 8, 3, _S, False)],
    64: [(64, 64, 128, 4, 3, _S, False), (64, 128, 256, 4, 3, _G, True), (64, 64, 128, 4, 3, _G, False),
         (64, 64, 128, 4, 3, _G, True), (64, 128, 128, 4, 3, _G, True), (64, 128, 128, 4, 3, _S, True),
         (64, 128, 128, 8, 3, _G, True), (32, 128, 128, 4, 3, _G, True), (64, 128, 256, 4, 2, _G, True)],
    256: [(128, 128, 128, 8, 2, _S, False), (128, 128, 256, 4, 2, _G, True), (128, 128, 128, 8, 2, _G, False),
          (128, 128, 128, 8, 2, _G, True), (128, 128, 128, 8, 2, _S, True), (128, 128, 128, 4, 2, _G, True),
          (128, 64, 128, 4, 3, _G, True), (256, 128, 128, 8, 2, _G, True), (128, 128, 256, 8, 2, _G, True)],
}


def mma_configs(m: int, dry: bool) -> list[Int4MmaConfig]:
    """The configs timed at m rows (MMA_CANDIDATES of its row bucket; split K: tiles.split_k's)."""
    if dry:
        return [Int4MmaConfig(16, 16, 128, 1, 1, 0, load) for load in XLoad]
    bound = tiles.ROW_BUCKETS[tiles.bucket_of(m)]
    return [Int4MmaConfig(bm, bn, bk, w, st, 0, load, asm)
            for bm, bn, bk, w, st, load, asm in MMA_CANDIDATES[max(bound, 16)]]


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
    if isinstance(cfg, Int4MmaConfig):
        return w4a16_mma_linear(x, *weight, GROUP, None, None, cfg)
    return w4a16_skinny_linear(x, *weight, GROUP, None, None, cfg)


def want(fmt: str, x: torch.Tensor, weight) -> torch.Tensor:
    if fmt.startswith("fp8"):
        return ref.fp8_linear(x.float(), *weight, BLOCK if fmt == "fp8_block" else None)
    return ref.int4_linear(x.float(), *[t.float() if t.is_floating_point() else t for t in weight], GROUP)


def group_of(fmt: str) -> int:
    """The table's group field: 0 per channel, the block's K side, W4A16's group."""
    return {"fp8_channel": 0, "fp8_block": BLOCK[1]}.get(fmt, GROUP)


def table_entry(fmt: str, n: int, k: int, m: int, best: dict, default_us: float, floor: float) -> dict:
    return {"kernel": fmt, "n": n, "k": k, "rows": m, "group": group_of(fmt),
            "config": best["config"], "us": round(best["us"], 2), "default_us": round(default_us, 2),
            "floor_us": round(floor, 2)}


def sweep_gemv(args, setup: Setup, result: dict, save) -> tuple[list[dict], set[tuple]]:
    """--kind gemv: per (format, shape) the default path and each candidate at every row count."""
    entries, swept = [], set()
    bf16_us: dict[tuple[str, int], tuple[str, float]] = {}
    result["best"] = []
    pairs = [(fmt, name) for name in args.shapes for fmt in ("bf16", *args.formats)]
    for fmt, name in within_budget(pairs, args.t0, args.budget_s):
        n, k = SHAPES[name]
        if setup.dry:
            n, k = n // 64, k // 32
        weight_bytes = 2 * n * k if fmt == "bf16" else (n * k if fmt.startswith("fp8") else n * k // 2)
        copies = 2 if setup.dry else max(2, min(16, -(-600_000_000 // weight_bytes)))
        ws = make_weights(fmt, n, k, setup.device, copies)
        for m in args.rows:
            x = torch.randn(m, k, device=setup.device, dtype=setup.dtype)
            floor = floor_us(fmt, n, k, m)
            if fmt == "bf16":
                times = bf16_best(x, ws, m, setup)
                kn = min(times, key=times.get)
                bf16_us[(name, m)] = (kn, times[kn])
                result["cells"] += [{"format": "bf16", "shape": name, "rows": m, "kernel": kern, "us": us,
                                     "floor_us": floor} for kern, us in times.items()]
                continue
            default_us = setup.timer(lambda i: run(fmt, x, ws[i]), copies)
            result["cells"].append({"format": fmt, "shape": name, "rows": m, "kernel": "default", "us": default_us,
                                    "floor_us": floor, "rel_err": rel_err(run(fmt, x, ws[0]), want(fmt, x, ws[0]))})
            best = None
            for cfg in gemv_configs(fmt, m, n, k, setup.sms, setup.dry):
                cell = {"format": fmt, "shape": name, "rows": m, "kernel": "gemv",
                        **try_candidate(lambda x, w, c: run(fmt, x, w, c), lambda x, w: want(fmt, x, w), x, ws, cfg,
                                        setup.timer), "floor_us": floor}
                result["cells"].append(cell)
                if "us" in cell and (best is None or cell["us"] < best["us"]):
                    best = cell
            if m <= KERNEL_ROWS:
                swept.add((fmt, n, k, m, group_of(fmt)))
            b_kernel, b_us = bf16_us.get((name, m), ("-", float("nan")))
            result["best"].append({"format": fmt, "shape": name, "rows": m, "default_us": default_us,
                                   "floor_us": floor, "bf16_kernel": b_kernel, "bf16_us": b_us,
                                   "best_us": best["us"] if best else None,
                                   "best_config": best["config"] if best else None})
            if best is not None and best["us"] * MARGIN < default_us:
                entries.append(table_entry(fmt, n, k, m, best, default_us, floor))
            print(f"{fmt:>11} {name:>12} rows {m:>2}: default {default_us:7.1f} us, "
                  + (f"best {best['us']:7.1f} {best['config']}" if best else "no few-row candidate")
                  + f"; bf16 {b_kernel} {b_us:.1f}; floor {floor:.1f}", flush=True)
        ws = None  # (frees the copies before the next pair)
        save()
    result["layer"] = layer_sums(Kind.GEMV, result["best"], args.rows)
    return entries, swept


def mma_format() -> BucketFormat:
    """--kind mma's one format: W4A16 group 128, default int4_gemm.w4a16_linear with its bucket's INT4_CONFIGS."""
    from radixlm.runtime.kernels.quant.int4_gemm import INT4_CONFIGS, w4a16_linear

    def configs(m: int, k: int, dry: bool) -> list:
        dtype = torch.float32 if dry else torch.bfloat16
        return [c for c in mma_configs(m, dry) if takes(m, k, GROUP, dtype, c)]

    return BucketFormat(
        "w4a16", "w4a16_mma", GROUP, lambda w: ref.quant_int4(w, GROUP, dtype=w.dtype),
        lambda x, w: w4a16_linear(x, *w, GROUP, cfg=INT4_CONFIGS[tiles.bucket_of(x.shape[0])]),
        lambda x, w, cfg: w4a16_mma_linear(x, *w, GROUP, None, None, cfg), lambda x, w: want("w4a16", x, w), configs)


# (block_m, block_n, block_k, num_warps, num_stages) by row bucket; the block weights' take block_k 128, each with
# the activations quantized by fp8_act's launch and (where x's float32 tile is at most 64 registers a thread) in the
# kernel. Built for sm_90 on the CPU (Triton 3.9): all wgmma, shared memory up to 192 KB (128 x 128 x 256, 3 stages),
# no spills (256 x 128 and 128 x 256 tiles on eight warps spilled: two float32 accumulators, 125-268 LDL/STL).
FP8_MMA_CANDIDATES = {
    16: [(16, 64, 128, 4, 4), (16, 128, 128, 4, 4), (16, 64, 256, 4, 3), (16, 128, 256, 4, 3), (16, 128, 128, 8, 4),
         (16, 64, 128, 4, 6)],
    64: [(64, 64, 128, 4, 4), (64, 128, 128, 4, 3), (64, 128, 256, 4, 3), (32, 128, 128, 4, 4), (64, 128, 128, 8, 3),
         (64, 256, 128, 8, 3)],
    256: [(128, 128, 128, 8, 3), (128, 128, 256, 8, 3), (128, 64, 128, 4, 4), (64, 128, 128, 4, 4),
          (128, 128, 128, 8, 4), (64, 128, 256, 4, 3)],
}


def fp8_mma_configs(m: int, block: tuple[int, int] | None, dry: bool) -> list[Fp8MmaConfig]:
    shapes = [(16, 16, 128, 1, 1)] if dry else FP8_MMA_CANDIDATES[max(tiles.ROW_BUCKETS[tiles.bucket_of(m)], 16)]
    if block is None:
        return [Fp8MmaConfig(*c) for c in shapes]
    return [Fp8MmaConfig(*c, fused_act=f) for c in shapes if c[2] == block[1]
            for f in (False, True) if not f or dry or c[0] * c[2] <= 64 * 32 * c[3]]


def fp8_formats(names: list[str]) -> list[BucketFormat]:
    """--kind fp8mma's formats: today's path is fp8_gemm's without a table (5..256 rows: no tuned lookup)."""
    def one(name: str) -> BucketFormat:
        block = BLOCK if name == "fp8_block" else None
        if block is None:
            default = lambda x, w: fp8_gemm.fp8_scaled_linear(x, *w, None, None)  # noqa: E731
        else:
            default = lambda x, w: fp8_gemm.fp8_block_linear(x, *w, block, None)  # noqa: E731
        return BucketFormat(
            name, "fp8_mma", group_of(name), lambda w: ref.quant_fp8(w, block=block, per_channel=block is None),
            default, lambda x, w, cfg: fp8_mma_linear(x, *w, block, None, None, cfg),
            lambda x, w: ref.fp8_linear_w8a8(x.float(), *w, block).to(x.dtype),
            lambda m, k, dry: fp8_mma_configs(m, block, dry), {"block": list(block)} if block else {})

    return [one(name) for name in names]


def sweep_mma(args, setup: Setup, result: dict, save) -> tuple[list[dict], set[tuple]]:
    """--kind mma / fp8mma: sweep_buckets over the kind's formats, then the layer's sums per format."""
    if args.kind is Kind.MMA:
        result["group"] = GROUP
        formats = [mma_format()]
    else:
        formats = fp8_formats([f for f in args.formats if f.startswith("fp8")])
    entries, swept = sweep_buckets(args, setup, result, save, formats)
    if args.kind is Kind.MMA:
        result["layer"] = layer_sums(Kind.MMA, result["cells"], args.rows)
    else:
        result["layer"] = {f.name: layer_sums(Kind.MMA, [c for c in result["cells"] if c["format"] == f.name],
                                              args.rows) for f in formats}
    return entries, swept


def _summed(cells: list[dict]) -> tuple[float, float, float]:
    """The cells' default, tuned (the faster of the default and the best candidate, as the table would dispatch) and
    floor times, summed."""
    return (sum(c["default_us"] for c in cells), sum(min(c["default_us"], c["best_us"] or float("inf")) for c in cells),
            sum(c["floor_us"] for c in cells))


def layer_sums(kind: Kind, cells: list[dict], rows: list[int]) -> list[dict]:
    """Per row count with all four shapes measured, the layer's sums: bf16's best, and per format (gemv) or for the
    W4A16 kernel (mma) the default path, the tuned choice and the floor."""
    out = []
    for m in rows:
        mine = [c for c in cells if c["rows"] == m]
        if len({c["shape"] for c in mine}) < len(LAYER):
            continue
        row = {"rows": m, "bf16_us": sum({c["shape"]: c["bf16_us"] for c in mine}.values())}
        if kind is Kind.MMA:
            row["default_us"], row["mma_us"], row["floor_us"] = _summed(mine)
        for fmt in FORMATS if kind is Kind.GEMV else ():
            per_fmt = [c for c in mine if c["format"] == fmt]
            if len(per_fmt) == len(LAYER):
                row[fmt] = dict(zip(("default_us", "tuned_us", "floor_us"), _summed(per_fmt)))
        out.append(row)
    return out


def print_layer(kind: Kind, result: dict, formats: list[str]) -> None:
    if kind is Kind.GEMV:
        print("\none layer's four GEMMs (us): rows, bf16 best | per format: default -> tuned (floor), vs bf16")
        for row in result["layer"]:
            print(f"rows {row['rows']:>2}: bf16 {row['bf16_us']:.1f} | " + " | ".join(
                f"{fmt} {row[fmt]['default_us']:.1f} -> {row[fmt]['tuned_us']:.1f} ({row[fmt]['floor_us']:.1f}), "
                f"{row[fmt]['tuned_us'] / row['bf16_us']:.2f}x" for fmt in formats if fmt in row))
        return
    layers = {"w4a16": result["layer"]} if kind is Kind.MMA else result["layer"]
    for fmt, rows in layers.items():
        print(f"\none layer's four GEMMs (us): rows | bf16 | {fmt} default | {fmt} mma (best per row count) | floor")
        for row in rows:
            print(f"rows {row['rows']:>3} | {row['bf16_us']:7.1f} | {row['default_us']:7.1f} | {row['mma_us']:7.1f} "
                  f"({row['mma_us'] / row['bf16_us']:.2f}x bf16) | {row['floor_us']:.1f}")


def vary_table(args, setup: Setup, result: dict, save) -> tuple[list[dict], set[tuple]]:
    """--kind mma / fp8mma --vary: quant_sweep.vary_buckets over the kind's formats."""
    formats = [mma_format()] if args.kind is Kind.MMA else fp8_formats([f for f in args.formats if f.startswith("fp8")])
    vary_buckets(args, setup, result, save, formats)
    return [], set()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kind", type=Kind, default=Kind.GEMV, choices=list(Kind),
                   help="gemv: the CUDA-core kernels at 1-16 rows; mma / fp8mma: the W4A16 / FP8 tensor-core kernels "
                        "at 8-256 rows")
    p.add_argument("--rows", type=int, nargs="+", default=None, help="default: the kind's ROWS")
    p.add_argument("--shapes", nargs="+", default=list(LAYER), choices=list(LAYER))
    p.add_argument("--formats", nargs="+", default=list(FORMATS), choices=list(FORMATS),
                   help="--kind gemv's (fp8mma: its fp8 ones)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="stop starting (format, shape) pairs (gemv) or shapes (mma, fp8mma) after this; default "
                        "400 / 240 / 300")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--dry", action="store_true", help="on the CPU under TRITON_INTERPRET=1: tiny shapes, wall clock")
    p.add_argument("--vary", nargs="+", default=None, metavar="FIELD=V1,V2",
                   help="mma / fp8mma: time the tuned table's configs as they are and with each field changed "
                        "(e.g. split_k=1,2,4 num_stages=3,4), instead of sweeping; writes no table")
    args = p.parse_args()
    args.rows = args.rows or list(ROWS[args.kind])
    args.budget_s = BUDGET_S[args.kind] if args.budget_s is None else args.budget_s
    if any(m < 1 for m in args.rows):
        p.error("--rows: positive row counts")
    try:
        args.vary = parse_vary(args.vary) if args.vary else None
    except ValueError as e:
        p.error(str(e))
    if args.vary and args.kind is Kind.GEMV:
        p.error("--vary: the tensor-core kinds (mma, fp8mma)")
    import triton

    args.t0 = time.perf_counter()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    gpu = "cpu (dry)" if args.dry else torch.cuda.get_device_name()
    setup = Setup(args.dry, "cpu" if args.dry else "cuda", torch.float32 if args.dry else torch.bfloat16,
                  132 if args.dry else torch.cuda.get_device_properties(0).multi_processor_count,
                  wall_us if args.dry else graph_us, wall_us if args.dry else quick_us)
    benchmark = {Kind.GEMV: "quant_gemv_sweep", Kind.MMA: "w4a16_mma_sweep", Kind.FP8MMA: "fp8_mma_sweep"}[args.kind]
    result = {"benchmark": benchmark, "gpu": gpu, "torch": torch.__version__, "triton": triton.__version__,
              "command": " ".join(sys.argv), "tree": tree(), "cells": []}
    out_file = out_dir / f"{benchmark}.json"

    def save() -> None:
        out_file.write_text(json.dumps(result, indent=1, default=str) + "\n")
        if not args.dry:
            torch.cuda.empty_cache()

    sweep = sweep_gemv if args.kind is Kind.GEMV else vary_table if args.vary else sweep_mma
    entries, swept = sweep(args, setup, result, save)
    result["wall_s"] = time.perf_counter() - args.t0
    save()
    if args.vary:
        print(f"{result['wall_s']:.0f} s")
        return
    table_file = write_table(out_dir, setup, gpu, entries, swept)
    print_layer(args.kind, result, args.formats)
    print(f"\n{len(entries)} table entries -> {table_file} (install: cp it to "
          f"radixlm/runtime/kernels/gemm/tuned/{table_file.name}); {result['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
