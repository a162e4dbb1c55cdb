"""Tunes the W4A16 tensor-core kernel (kernels/quant/int4_mma.py) on Llama-3.1-8B's four GEMM shapes at 8, 16, 32,
64, 128 and 256 rows (group 128, bf16), in one device call (< 6 min on an H200): each candidate config is checked
against kernels/quant/reference.py, then timed as CUDA-graph replays over distinct weight copies (benchmarks/lib/
gpu_timing.py: quick_us for the candidates, graph_us for bf16, the default path and each bucket's choice), beside the
default W4A16 path (int4_gemm.w4a16_linear with its row bucket's INT4_CONFIGS tile), bf16 (the faster of cuBLAS and
the skinny Triton kernels) and the int4 bytes floor at 4.8 TB/s.

A table entry is per row bucket (tiles.ROW_BUCKETS 8, 16, 64, 256: rows 32 and 64 share bucket 64, 128 and 256 share
256): the config with the least summed time over the bucket's measured row counts, timed again as the default was and
written only where that sum beats the default path's by MARGIN. Writes $OUT/w4a16_mma_sweep.json (every cell, per row count the layer's sums) and
$OUT/quant_gemv_<GPU>.json: the committed table (kernels/gemm/tuned/quant_gemv_<GPU>.json) with the swept shapes'
w4a16_mma entries replaced, ready to commit in its place.

    python3 benchmarks/kernels/w4a16_mma_sweep.py --out $OUT            # ~4-5 min on an H200
    TRITON_INTERPRET=1 python benchmarks/kernels/w4a16_mma_sweep.py --dry --out /tmp/wm   # the logic on the CPU
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.kernels.quant_gemm import floor_us, rel_err, tree, wall_us  # noqa: E402
from benchmarks.kernels.quant_gemv_sweep import LAYER, MARGIN, TOLERANCE, bf16_kernels  # noqa: E402
from benchmarks.lib.gpu_timing import SHAPES, graph_us, quick_us, within_budget  # noqa: E402
from radixlm.runtime.kernels.quant import reference as ref, tiles  # noqa: E402
from radixlm.runtime.kernels.quant.int4_mma import Int4MmaConfig, XLoad, takes, w4a16_mma_linear  # noqa: E402

ROWS = (8, 16, 32, 64, 128, 256)
GROUP = 128
ALL_LOADS = tuple(XLoad)


_S, _G = XLoad.SPLIT, XLoad.GATHERED
# (block_m, block_n, block_k, num_warps, num_stages, x_load, asm) by row bucket: the split and gathered x loads without
# asm on one tile, then the packed asm dequantization on wider tiles (w4a16_mma_sass.py, sm_90 SASS of the K loop with
# Triton 3.9, instructions a weight: 16 x 64 x 128 gathered 7.0, with asm 5.8; 16 x 128 x 128 asm 4.3; 16 x 128 x 256
# asm 3.6; 64 x 128 x 256 asm 3.4; the strided load 7-10 and 256 x 64 tiles on four warps (spilled) were dropped).
CANDIDATES = {
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


def candidates(m: int, dry: bool) -> list[Int4MmaConfig]:
    """The configs timed at m rows (CANDIDATES of its row bucket; split K: tiles.split_k's)."""
    if dry:
        return [Int4MmaConfig(16, 16, 128, 1, 1, 0, load) for load in ALL_LOADS]
    bound = tiles.ROW_BUCKETS[tiles.bucket_of(m)]
    return [Int4MmaConfig(bm, bn, bk, w, st, 0, load, asm)
            for bm, bn, bk, w, st, load, asm in CANDIDATES[max(bound, 16)]]


def config_dict(cfg: Int4MmaConfig) -> dict:
    return {**dataclasses.asdict(cfg), "x_load": cfg.x_load.value}


def merge_entries(old: list[dict], new: list[dict], swept: set[tuple] = frozenset()) -> list[dict]:
    """The committed table's entries with those of the same (kernel, n, k, rows, group) as a new entry, or in
    `swept` (measured again, no longer beating the default), replaced by the new ones."""
    def key(e: dict) -> tuple:
        return e["kernel"], int(e["n"]), int(e["k"]), int(e["rows"]), int(e.get("group", 0))

    gone = {key(e) for e in new} | set(swept)
    return [e for e in old if key(e) not in gone] + list(new)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, nargs="+", default=list(ROWS))
    p.add_argument("--shapes", nargs="+", default=list(LAYER), choices=list(LAYER))
    p.add_argument("--budget-s", type=float, default=240.0, help="stop starting shapes after this")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--dry", action="store_true", help="on the CPU under TRITON_INTERPRET=1: tiny shapes, wall clock")
    args = p.parse_args()
    import triton

    from radixlm.runtime.kernels.gemm.cublaslt import load_table, table_path
    from radixlm.runtime.kernels.quant.int4_gemm import INT4_CONFIGS, w4a16_linear

    t0 = time.perf_counter()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    device = "cpu" if args.dry else "cuda"
    gpu = "cpu (dry)" if args.dry else torch.cuda.get_device_name()
    dtype = torch.float32 if args.dry else torch.bfloat16
    timer, quick = (wall_us, wall_us) if args.dry else (graph_us, quick_us)
    result = {"benchmark": "w4a16_mma_sweep", "gpu": gpu, "torch": torch.__version__, "triton": triton.__version__,
              "command": " ".join(sys.argv), "tree": tree(), "group": GROUP, "cells": [], "buckets": []}
    entries, swept = [], set()
    for name in within_budget(args.shapes, t0, args.budget_s):
        n, k = SHAPES[name]
        if args.dry:
            n, k = n // 64, max(GROUP, k // 32 // GROUP * GROUP)
        copies = 2 if args.dry else max(2, min(16, -(-600_000_000 // (2 * n * k))))
        bf16 = [torch.randn(n, k, device=device, dtype=dtype) * 0.02 for _ in range(copies)]
        int4 = [ref.quant_int4(w, GROUP, dtype=dtype) for w in bf16]
        by_cfg: dict[tuple[int, Int4MmaConfig], dict[int, float]] = {}
        defaults: dict[int, dict[int, float]] = {}
        for m in args.rows:
            x = torch.randn(m, k, device=device, dtype=dtype)
            floor = floor_us("w4a16", n, k, m)
            want = ref.int4_linear(x.float(), *[t.float() if t.is_floating_point() else t for t in int4[0]], GROUP)
            times = {kn: timer(lambda i, f=f: f(x, bf16[i]), copies) for kn, f in bf16_kernels(m).items()}
            b_kernel = min(times, key=times.get)
            bucket = tiles.ROW_BUCKETS[tiles.bucket_of(m)]
            default_cfg = INT4_CONFIGS[tiles.bucket_of(m)]
            default_us = timer(lambda i: w4a16_linear(x, *int4[i], GROUP, cfg=default_cfg), copies)
            defaults.setdefault(bucket, {})[m] = default_us
            row = {"shape": name, "n": n, "k": k, "rows": m, "bf16_kernel": b_kernel, "bf16_us": times[b_kernel],
                   "default_us": default_us, "floor_us": floor, "candidates": []}
            for cfg in candidates(m, args.dry):
                cell = {"config": config_dict(cfg)}
                if not takes(m, k, GROUP, dtype, cfg):
                    continue
                try:
                    cell["rel_err"] = rel_err(w4a16_mma_linear(x, *int4[0], GROUP, None, None, cfg), want)
                    if cell["rel_err"] > TOLERANCE:
                        cell["error"] = "wrong result"
                    else:
                        cell["us"] = quick(lambda i, cfg=cfg: w4a16_mma_linear(x, *int4[i], GROUP, None, None, cfg),
                                           copies)
                        by_cfg.setdefault((bucket, cfg), {})[m] = cell["us"]
                except Exception as e:  # noqa: BLE001 - a config that does not build or launch here is skipped
                    cell["error"] = f"{type(e).__name__}: {str(e)[:200]}"
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
                x = torch.randn(m_b, k, device=device, dtype=dtype)
                timed[m_b] = timer(lambda i, x=x, cfg=cfg: w4a16_mma_linear(x, *int4[i], GROUP, None, None, cfg),
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
        if not args.dry:
            torch.cuda.empty_cache()
        (out_dir / "w4a16_mma_sweep.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    result["wall_s"] = time.perf_counter() - t0
    result["layer"] = layer_sums(result["cells"], args.rows)
    (out_dir / "w4a16_mma_sweep.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    committed = [] if args.dry else load_table(gpu, "quant_gemv")
    table_file = out_dir / table_path(gpu if not args.dry else "cpu dry", "quant_gemv").name
    old = json.loads(table_path(gpu, "quant_gemv").read_text()) if committed else {}
    table = {**{k: v for k, v in old.items() if k != "entries"}, "gpu": gpu,
             "commands": [*old.get("commands", []), " ".join(["benchmarks/kernels/w4a16_mma_sweep.py", *sys.argv[1:]])],
             "entries": merge_entries(committed, entries, swept)}
    table_file.write_text(json.dumps(table, indent=1) + "\n")
    print("\none layer's four GEMMs (us): rows | bf16 | W4A16 default | W4A16 mma (best per row count) | floor")
    for row in result["layer"]:
        print(f"rows {row['rows']:>3} | {row['bf16_us']:7.1f} | {row['default_us']:7.1f} | {row['mma_us']:7.1f} "
              f"({row['mma_us'] / row['bf16_us']:.2f}x bf16) | {row['floor_us']:.1f}")
    print(f"\n{len(entries)} w4a16_mma entries -> {table_file} (install: cp it to "
          f"radixlm/runtime/kernels/gemm/tuned/{table_file.name}); {result['wall_s']:.0f} s")


def layer_sums(cells: list[dict], rows: list[int]) -> list[dict]:
    """Per row count with all four shapes measured: bf16's, the default path's, the best candidate's (the default's
    where none ran) and the floor, summed."""
    out = []
    for m in rows:
        mine = [c for c in cells if c["rows"] == m]
        if len({c["shape"] for c in mine}) < len(LAYER):
            continue
        out.append({"rows": m, "bf16_us": sum(c["bf16_us"] for c in mine),
                    "default_us": sum(c["default_us"] for c in mine),
                    "mma_us": sum(min(c["default_us"], c["best_us"] or float("inf")) for c in mine),
                    "floor_us": sum(c["floor_us"] for c in mine)})
    return out


if __name__ == "__main__":
    main()
