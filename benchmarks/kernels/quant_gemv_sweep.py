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
  beats the default's by MARGIN.

Each candidate is checked against kernels/quant/reference.py first, then timed as CUDA-graph replays over distinct
weight copies (benchmarks/lib/gpu_timing.py: no L2 hits, no launch gaps), beside bf16 (the faster of cuBLAS and the
skinny Triton kernels) and the bytes floor at 4.8 TB/s. Writes $OUT/quant_gemv_sweep.json (gemv) or
$OUT/w4a16_mma_sweep.json (mma): every cell and the layer's sums per row count; and $OUT/quant_gemv_<GPU>.json: the
committed table with the swept (kernel, shape, rows, group) entries replaced, ready to commit in its place.

    python3 benchmarks/kernels/quant_gemv_sweep.py --out $OUT              # ~5-7 min on an H200 (bash
                                                                           # benchmarks/lease/quant_lease.sh gemv)
    python3 benchmarks/kernels/quant_gemv_sweep.py --kind mma --out $OUT   # ~4-5 min (lease/quant_lease.sh mma)
    TRITON_INTERPRET=1 python benchmarks/kernels/quant_gemv_sweep.py [--kind mma] --dry --out /tmp/qg   # on the CPU
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from enum import Enum
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.lib.gpu_timing import SHAPES, graph_us, quick_us, tree, wall_us, within_budget  # noqa: E402
from benchmarks.lib.quant_formats import (BLOCK, GROUP, bf16_kernels, config_dict, floor_us,  # noqa: E402
                                          format_linear, format_reference, make_weights, rel_err, try_candidate)
from radixlm.runtime.kernels.quant import reference as ref, tiles  # noqa: E402
from radixlm.runtime.kernels.quant.fp8_gemv import Fp8GemvConfig  # noqa: E402
from radixlm.runtime.kernels.quant.int4_mma import Int4MmaConfig, XLoad, takes, w4a16_mma_linear  # noqa: E402
from radixlm.runtime.kernels.quant.int4_skinny import Int4GemvConfig  # noqa: E402

class Kind(str, Enum):
    GEMV = "gemv"
    MMA = "mma"


LAYER = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
FORMATS = ("fp8_channel", "fp8_block", "w4a16")
ROWS = {Kind.GEMV: (1, 2, 4, 8, 16), Kind.MMA: (8, 16, 32, 64, 128, 256)}
BUDGET_S = {Kind.GEMV: 400.0, Kind.MMA: 240.0}
KERNEL_ROWS = 4  # the few-row CUDA-core kernels' most rows
MARGIN = 1.03  # a table entry only where the candidate beats the default path by this much
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


@dataclasses.dataclass(frozen=True)
class Setup:
    """What every cell of one run shares."""
    dry: bool
    device: str
    dtype: torch.dtype
    sms: int
    timer: object  # graph_us, or wall_us in a dry run
    quick: object  # quick_us, or wall_us in a dry run


def splits(n: int, k: int, block_n: int, block_k: int, sms: int) -> list[int]:
    """No split, and the split that brings N's programs to PROGRAMS_PER_SM an SM (at least two tiles each)."""
    programs = -(-n // block_n)
    k_tiles = -(-k // block_k)
    want = min(16, max(1, (PROGRAMS_PER_SM * sms) // programs), max(1, k_tiles // 2))
    return sorted({1, want})


def gemv_configs(fmt: str, rows: int, n: int, k: int, sms: int, dry: bool) -> list:
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


def mma_configs(m: int, dry: bool) -> list[Int4MmaConfig]:
    """The configs timed at m rows (MMA_CANDIDATES of its row bucket; split K: tiles.split_k's)."""
    if dry:
        return [Int4MmaConfig(16, 16, 128, 1, 1, 0, load) for load in XLoad]
    bound = tiles.ROW_BUCKETS[tiles.bucket_of(m)]
    return [Int4MmaConfig(bm, bn, bk, w, st, 0, load, asm)
            for bm, bn, bk, w, st, load, asm in MMA_CANDIDATES[max(bound, 16)]]


def bf16_best(x: torch.Tensor, weights: list, m: int, setup: Setup) -> dict[str, float]:
    """Every bf16 candidate's time at m rows (graph-timed)."""
    return {kn: setup.timer(lambda i, f=f: f(x, weights[i]), len(weights)) for kn, f in bf16_kernels(m).items()}


def group_of(fmt: str) -> int:
    """The table's group field: 0 per channel, the block's K side, W4A16's group."""
    return {"fp8_channel": 0, "fp8_block": BLOCK[1]}.get(fmt, GROUP)


def table_entry(fmt: str, n: int, k: int, m: int, best: dict, default_us: float, floor: float) -> dict:
    return {"kernel": fmt, "n": n, "k": k, "rows": m, "group": group_of(fmt),
            "config": best["config"], "us": round(best["us"], 2), "default_us": round(default_us, 2),
            "floor_us": round(floor, 2)}


def merge_entries(old: list[dict], new: list[dict], swept: set[tuple] = frozenset()) -> list[dict]:
    """The committed table's entries with those of the same (kernel, n, k, rows, group) as a new entry, or in
    `swept` (measured again, no longer beating the default), replaced by the new ones."""
    def key(e: dict) -> tuple:
        return e["kernel"], int(e["n"]), int(e["k"]), int(e["rows"]), int(e.get("group", 0))

    gone = {key(e) for e in new} | set(swept)
    return [e for e in old if key(e) not in gone] + list(new)


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
            default_us = setup.timer(lambda i: format_linear(fmt, x, ws[i]), copies)
            err = rel_err(format_linear(fmt, x, ws[0]), format_reference(fmt, x, ws[0]))
            result["cells"].append({"format": fmt, "shape": name, "rows": m, "kernel": "default", "us": default_us,
                                    "floor_us": floor, "rel_err": err})
            best = None
            for cfg in gemv_configs(fmt, m, n, k, setup.sms, setup.dry):
                cell = {"format": fmt, "shape": name, "rows": m, "kernel": "gemv",
                        **try_candidate(fmt, x, ws, cfg, setup.timer), "floor_us": floor}
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


def sweep_mma(args, setup: Setup, result: dict, save) -> tuple[list[dict], set[tuple]]:
    """--kind mma: per shape and row count bf16, the default W4A16 path and each candidate (quick-timed); then per
    row bucket the least summed config timed again as the default was."""
    from radixlm.runtime.kernels.quant.int4_gemm import INT4_CONFIGS, w4a16_linear

    entries, swept = [], set()
    result["group"], result["buckets"] = GROUP, []
    for name in within_budget(args.shapes, args.t0, args.budget_s):
        n, k = SHAPES[name]
        if setup.dry:
            n, k = n // 64, max(GROUP, k // 32 // GROUP * GROUP)
        copies = 2 if setup.dry else max(2, min(16, -(-600_000_000 // (2 * n * k))))
        bf16 = [torch.randn(n, k, device=setup.device, dtype=setup.dtype) * 0.02 for _ in range(copies)]
        int4 = [ref.quant_int4(w, GROUP, dtype=setup.dtype) for w in bf16]
        by_cfg: dict[tuple[int, Int4MmaConfig], dict[int, float]] = {}
        defaults: dict[int, dict[int, float]] = {}
        for m in args.rows:
            x = torch.randn(m, k, device=setup.device, dtype=setup.dtype)
            floor = floor_us("w4a16", n, k, m)
            times = bf16_best(x, bf16, m, setup)
            b_kernel = min(times, key=times.get)
            bucket = tiles.ROW_BUCKETS[tiles.bucket_of(m)]
            default_cfg = INT4_CONFIGS[tiles.bucket_of(m)]
            default_us = setup.timer(lambda i: w4a16_linear(x, *int4[i], GROUP, cfg=default_cfg), copies)
            defaults.setdefault(bucket, {})[m] = default_us
            row = {"shape": name, "n": n, "k": k, "rows": m, "bf16_kernel": b_kernel, "bf16_us": times[b_kernel],
                   "default_us": default_us, "floor_us": floor, "candidates": []}
            for cfg in mma_configs(m, setup.dry):
                if not takes(m, k, GROUP, setup.dtype, cfg):
                    continue
                cell = try_candidate("w4a16", x, int4, cfg, setup.quick)
                if "us" in cell:
                    by_cfg.setdefault((bucket, cfg), {})[m] = cell["us"]
                row["candidates"].append(cell)
            timed = [c for c in row["candidates"] if "us" in c]
            best = min(timed, key=lambda c: c["us"]) if timed else None
            row["best_us"], row["best_config"] = (best["us"], best["config"]) if best else (None, None)
            result["cells"].append(row)
            print(f"{name:>12} rows {m:>3}: bf16 {b_kernel} {times[b_kernel]:7.1f} | default {default_us:7.1f} | mma "
                  + (f"{best['us']:7.1f} {best['config']}" if best else "none") + f" | floor {floor:.1f}", flush=True)
        for bucket, per_m in defaults.items():
            fits = {cfg: t for (b, cfg), t in by_cfg.items() if b == bucket and t.keys() == per_m.keys()}
            swept.add(("w4a16_mma", n, k, bucket, GROUP))
            if not fits:
                continue
            cfg = min(fits, key=lambda c: sum(fits[c].values()))
            timed = {}  # the choice timed again as the default was (graph_us), at each of the bucket's row counts
            for m_b in per_m:
                x = torch.randn(m_b, k, device=setup.device, dtype=setup.dtype)
                timed[m_b] = setup.timer(lambda i, x=x, cfg=cfg: w4a16_mma_linear(x, *int4[i], GROUP, None, None, cfg),
                                         copies)
            result["buckets"].append({"shape": name, "bucket": bucket, "config": config_dict(cfg),
                                      "quick_us_by_rows": fits[cfg], "us_by_rows": timed,
                                      "default_us_by_rows": per_m})
            x_rows = max(per_m)
            if sum(timed.values()) * MARGIN < sum(per_m.values()):
                entries.append({"kernel": "w4a16_mma", "n": n, "k": k, "rows": bucket, "group": GROUP,
                                "config": config_dict(cfg), "us": round(timed[x_rows], 2),
                                "default_us": round(per_m[x_rows], 2),
                                "floor_us": round(floor_us("w4a16", n, k, x_rows), 2)})
        bf16 = int4 = None  # (frees the copies before the next shape)
        save()
    result["layer"] = layer_sums(Kind.MMA, result["cells"], args.rows)
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
    print("\none layer's four GEMMs (us): rows | bf16 | W4A16 default | W4A16 mma (best per row count) | floor")
    for row in result["layer"]:
        print(f"rows {row['rows']:>3} | {row['bf16_us']:7.1f} | {row['default_us']:7.1f} | {row['mma_us']:7.1f} "
              f"({row['mma_us'] / row['bf16_us']:.2f}x bf16) | {row['floor_us']:.1f}")


def write_table(out_dir: Path, setup: Setup, gpu: str, entries: list[dict], swept: set[tuple]) -> Path:
    """The committed table (none in a dry run) with the swept entries replaced; this run's versions and tree, its
    command after the earlier ones."""
    import triton

    from radixlm.runtime.kernels.gemm.cublaslt import load_table, table_path

    committed = [] if setup.dry else load_table(gpu, "quant_gemv")
    old = json.loads(table_path(gpu, "quant_gemv").read_text()) if committed else {}
    table = {"gpu": gpu, "torch": torch.__version__, "triton": triton.__version__, "margin": MARGIN,
             "commands": [*old.get("commands", []),
                          " ".join(["benchmarks/kernels/quant_gemv_sweep.py", *sys.argv[1:]])],
             "tree": tree(), "entries": merge_entries(committed, entries, swept)}
    table_file = out_dir / table_path(gpu if not setup.dry else "cpu dry", "quant_gemv").name
    table_file.write_text(json.dumps(table, indent=1) + "\n")
    return table_file


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kind", type=Kind, default=Kind.GEMV, choices=list(Kind),
                   help="gemv: the CUDA-core kernels at 1-16 rows; mma: the W4A16 tensor-core kernel at 8-256 rows")
    p.add_argument("--rows", type=int, nargs="+", default=None, help="default: the kind's ROWS")
    p.add_argument("--shapes", nargs="+", default=list(LAYER), choices=list(LAYER))
    p.add_argument("--formats", nargs="+", default=list(FORMATS), choices=list(FORMATS), help="--kind gemv's")
    p.add_argument("--budget-s", type=float, default=None,
                   help="stop starting (format, shape) pairs (gemv) or shapes (mma) after this; default 400 / 240")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--dry", action="store_true", help="on the CPU under TRITON_INTERPRET=1: tiny shapes, wall clock")
    args = p.parse_args()
    args.rows = args.rows or list(ROWS[args.kind])
    args.budget_s = BUDGET_S[args.kind] if args.budget_s is None else args.budget_s
    if any(m < 1 for m in args.rows):
        p.error("--rows: positive row counts")
    import triton

    args.t0 = time.perf_counter()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    gpu = "cpu (dry)" if args.dry else torch.cuda.get_device_name()
    setup = Setup(args.dry, "cpu" if args.dry else "cuda", torch.float32 if args.dry else torch.bfloat16,
                  132 if args.dry else torch.cuda.get_device_properties(0).multi_processor_count,
                  wall_us if args.dry else graph_us, wall_us if args.dry else quick_us)
    benchmark = "quant_gemv_sweep" if args.kind is Kind.GEMV else "w4a16_mma_sweep"
    result = {"benchmark": benchmark, "gpu": gpu, "torch": torch.__version__, "triton": triton.__version__,
              "command": " ".join(sys.argv), "tree": tree(), "cells": []}
    out_file = out_dir / f"{benchmark}.json"

    def save() -> None:
        out_file.write_text(json.dumps(result, indent=1, default=str) + "\n")
        if not args.dry:
            torch.cuda.empty_cache()

    sweep = sweep_gemv if args.kind is Kind.GEMV else sweep_mma
    entries, swept = sweep(args, setup, result, save)
    result["wall_s"] = time.perf_counter() - args.t0
    save()
    table_file = write_table(out_dir, setup, gpu, entries, swept)
    print_layer(args.kind, result, args.formats)
    print(f"\n{len(entries)} table entries -> {table_file} (install: cp it to "
          f"radixlm/runtime/kernels/gemm/tuned/{table_file.name}); {result['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
