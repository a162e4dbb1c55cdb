"""The quantized GEMMs (radixlm/runtime/kernels/quant) against bf16 on Llama-3.1-8B's four linear shapes, one device
call: F.linear (cuBLAS) vs FP8 per-channel and 128x128 blocks (up to 16 rows the weight-only kernel fp8_w8a16.py,
past it per-token activations and torch._scaled_mm / Triton W8A8) vs W4A16 (INT4, group 128; Triton GEMV or tensor
cores) at 1, 4, 8, 16, 32, 64, 256 rows, each default beside the kernels it chose against (forced formats; the
last table names each default's path per row bucket and flags a faster forced one). Each figure is the
device time of one whole kernels.quant call (activation quantization and split-K reduction included) from CUDA-graph
replays over distinct weight copies (benchmarks/lib/gpu_timing.py: no L2 hits, no launch gaps), beside its bytes
floor (weight with its scales + input and output activations, at 4.8 TB/s); then one layer's four GEMMs summed per
row count and their ratio to bf16's; and each format's output against kernels/quant/reference.py (max |error| /
max |reference|).

    python3 benchmarks/kernels/quant_gemm.py --out $OUT            # writes $OUT/quant_gemm.json, ~4-6 min on an H200
    python benchmarks/kernels/quant_gemm.py --dry --out /tmp       # the script's logic on the CPU: tiny shapes, the
                                                                   # reference path, wall-clock times
    python3 benchmarks/kernels/quant_gemm.py --sweep --out $OUT    # decode tile configs instead (quant_gemm_sweep.json)
                                                                   # the INT4 GEMV at 1, 4, 8 rows, the FP8 weight-only
                                                                   # kernel (channel, block) at 1, 4, 8 rows; ~3 min
    TRITON_INTERPRET=1 python benchmarks/kernels/quant_gemm.py --sweep --dry --shapes o_proj --out /tmp   # its logic
    python3 benchmarks/kernels/quant_gemm.py --w4a16-dequant --out $OUT   # W4A16 at 128..8192 rows, ~2 min:
                                       # benchmarks/lib/w4a16_dequant.py (its docstring: what it writes)
    TRITON_INTERPRET=1 python benchmarks/kernels/quant_gemm.py --w4a16-dequant --dry --rows 8 16 --out /tmp
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

from benchmarks.lib.gpu_timing import SHAPES, graph_us, tree, wall_us, within_budget  # noqa: E402
from benchmarks.lib.quant_sweep import (  # noqa: E402
    BLOCK, GROUP, HBM_TB_S, TOLERANCE, floor_us, rel_err, weight_bytes)
from radixlm.runtime.kernels import quant  # noqa: E402
from radixlm.runtime.kernels.quant import reference as ref  # noqa: E402
from radixlm.runtime.kernels.quant.tiles import ROW_BUCKETS, bucket_of  # noqa: E402

LAYER = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
# The formats' defaults (fp8_channel, fp8_block, w4a16), then kernels forced, to check the defaults' choices:
# the W8A8 paths where the weight-only FP8 kernel runs (fp8_*_w8a8, up to 16 rows), the Triton per-channel FP8 mode
# or torch._scaled_mm at every row count, the INT4 tensor-core kernel where the GEMV runs and the GEMV where the
# tensor-core kernel runs (up to 16 rows).
FORMATS = ("bf16", "fp8_channel", "fp8_channel_w8a8", "fp8_channel_triton", "fp8_channel_scaled_mm", "fp8_block",
           "fp8_block_w8a8", "w4a16", "w4a16_mma", "w4a16_gemv")
DECODE_ONLY = ("fp8_channel_w8a8", "fp8_block_w8a8", "w4a16_mma", "w4a16_gemv")  # forced up to DECODE_ROWS rows (timed)
DECODE_ROWS = 16
COPY_BYTES = 600_000_000  # weight copies per format and shape: several times the 60 MB L2


def make_formats(n: int, k: int, device: str) -> dict[str, list]:
    """Distinct copies of one random weight per format: each call of the format's GEMM as a closure over one copy."""
    copies = max(2, min(16, -(-COPY_BYTES // (2 * n * k)))) if device == "cuda" else 2
    made: dict[str, list] = {f: [] for f in FORMATS}
    for _ in range(copies):
        w = torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02
        made["bf16"].append(w)
        made["fp8_channel"].append(ref.quant_fp8(w, per_channel=True))
        for fmt in ("fp8_channel_w8a8", "fp8_channel_triton", "fp8_channel_scaled_mm"):
            made[fmt].append(made["fp8_channel"][-1])
        made["fp8_block"].append(ref.quant_fp8(w, block=BLOCK))
        made["fp8_block_w8a8"].append(made["fp8_block"][-1])
        made["w4a16"].append(ref.quant_int4(w, GROUP, dtype=torch.bfloat16))
        made["w4a16_mma"].append(made["w4a16"][-1])
        made["w4a16_gemv"].append(made["w4a16"][-1])
    return made


def call(fmt: str, x: torch.Tensor, weight) -> torch.Tensor:
    if fmt == "bf16":
        return F.linear(x, weight)
    if fmt == "fp8_channel":
        return quant.fp8_linear(x, *weight)
    if fmt in ("fp8_channel_w8a8", "fp8_block_w8a8"):  # the W8A8 paths at every row count
        block = BLOCK if fmt == "fp8_block_w8a8" else None
        if not x.is_cuda:
            return quant.fp8_linear(x, *weight, block)
        return quant.fp8_linear_cuda(x, *weight, block, w8a16_max_rows=0)
    if fmt == "fp8_channel_triton":  # the Triton kernel's per-channel mode at every row count
        if not x.is_cuda:
            return quant.fp8_linear(x, *weight)
        return quant.fp8_scaled_linear(x, *weight, None, None, min_scaled_mm_rows=1 << 30)
    if fmt == "fp8_channel_scaled_mm":
        if not x.is_cuda:
            return quant.fp8_linear(x, *weight)
        return quant.fp8_scaled_linear(x, *weight, None, None, min_scaled_mm_rows=0)
    if fmt == "fp8_block":
        return quant.fp8_linear(x, *weight, BLOCK)
    if fmt == "w4a16_mma" and x.is_cuda:
        return quant.w4a16_linear(x, *weight, GROUP, gemv_max_rows=0)
    if fmt == "w4a16_gemv" and x.is_cuda:
        return quant.w4a16_linear(x, *weight, GROUP, gemv_max_rows=DECODE_ROWS)
    return quant.int4_linear(x, *weight, GROUP)


def reference(fmt: str, x: torch.Tensor, weight) -> torch.Tensor:
    """What the format's call computes (on CPU, --dry, and in the weight-only FP8 kernel: activations not quantized)."""
    block = BLOCK if fmt.startswith("fp8_block") else None
    w8a16 = fmt in ("fp8_channel", "fp8_block") and x.shape[0] <= DECODE_ROWS  # fp8_w8a16.W8A16_MAX_ROWS
    if fmt.startswith("fp8") and (not x.is_cuda or w8a16):
        return ref.fp8_linear(x, *weight, block)
    if fmt.startswith("fp8"):
        return ref.fp8_linear_w8a8(x, *weight, block)
    return ref.int4_linear(x, *weight, GROUP)  # w4a16, w4a16_mma, w4a16_gemv


def shape_of(name: str, dry: bool) -> tuple[int, int]:
    n, k = SHAPES[name]
    return (n // 32, -(-k // 32 // GROUP) * GROUP) if dry else (n, k)


def sweep_variants() -> list[tuple[str, int, object]]:
    """(kernel, rows, config) of --sweep: the decode paths' tile configs around the defaults."""
    from radixlm.runtime.kernels.quant import fp8_w8a16, int4_gemm, int4_gemv

    out: list[tuple[str, int, object]] = []
    for bn in (32, 64, 128):
        for per_sm in (2, 4, 8):
            out.append(("w4a16", 1, int4_gemv.GemvConfig(bn, 128, 4, 1, per_sm, 2)))
        out.append(("w4a16", 1, int4_gemv.GemvConfig(bn, 128, 8, 1, 4, 2)))
        out.append(("w4a16", 4, int4_gemv.GemvConfig(bn, 128, 4, 1, 4, 2)))
        out.append(("w4a16", 8, int4_gemv.GemvConfig(bn, 128, 4, 1, 4, 2)))
    for m, bm in ((8, 16), (64, 64)):  # the tensor-core kernels (nibbles or reshaping)
        for bn, warps, stages, nibbles in ((128, 4, 4, True), (64, 4, 4, True), (256, 8, 3, True), (128, 8, 3, True),
                                           (128, 4, 3, True), (64, 4, 4, False), (128, 4, 3, False)):
            out.append(("w4a16", m, int4_gemm.TileConfig(bm, bn, warps, stages, True, nibbles)))
    for kernel in ("fp8_channel", "fp8_block"):  # (config, the CUDA-core mode's rows)
        for bn, bk, warps, stages in ((16, 512, 1, 4), (16, 256, 1, 6), (16, 512, 2, 3), (32, 256, 2, 4),
                                      (32, 256, 1, 4), (32, 128, 2, 6), (64, 128, 4, 4), (32, 512, 4, 3)):
            cfg = fp8_w8a16.W8A16Config(bn, bk, warps, stages)
            out += [(kernel, 1, (cfg, 0)), (kernel, 8, (cfg, 0))]
        for bn, bk, warps in ((8, 1024, 4), (16, 512, 4), (16, 1024, 8), (32, 256, 4)):
            cfg = fp8_w8a16.W8A16Config(bn, bk, warps, 1)
            out += [(kernel, 1, (cfg, 4)), (kernel, 4, (cfg, 4))]
    return out


def sweep(args, t0: float, device: str, timer) -> dict:
    """--sweep (with --dry: under TRITON_INTERPRET=1 on the CPU, tiny shapes, wall clock)."""
    import dataclasses

    from radixlm.runtime.kernels.quant import fp8_w8a16, int4_gemv

    result = {"benchmark": "quant_gemm_sweep", "gpu": "cpu (dry)" if args.dry else torch.cuda.get_device_name(),
              "command": " ".join(sys.argv), "tree": tree(), "hbm_tb_s": HBM_TB_S, "cells": []}
    variants = sweep_variants()
    for name in within_budget(args.shapes, t0, args.budget_s):
        n, k = shape_of(name, args.dry)
        made = make_formats(n, k, device)
        copies = len(made["bf16"])
        for kernel, m, cfg in variants:
            x = torch.randn(m, k, device=device, dtype=torch.float32 if args.dry else torch.bfloat16)
            ws = made[kernel]
            if kernel == "w4a16":  # a GemvConfig: the GEMV forced at every row count swept; else the tensor cores
                kw = ({"gemv_cfg": cfg, "gemv_max_rows": DECODE_ROWS} if isinstance(cfg, int4_gemv.GemvConfig)
                      else {"cfg": cfg, "gemv_max_rows": 0})
                fn = lambda i, kw=kw: quant.w4a16_linear(x, *ws[i], GROUP, **kw)  # noqa: E731
            else:
                block = BLOCK if kernel == "fp8_block" else None
                wcfg, fma_rows = cfg
                fn = lambda i, wcfg=wcfg, block=block, fma_rows=fma_rows: fp8_w8a16.w8a16_linear(  # noqa: E731
                    x, *ws[i], block, None, wcfg, fma_rows)
            err = rel_err(fn(0), reference(kernel, x, ws[0]))
            us = timer(fn, copies)
            config = (dataclasses.asdict(cfg[0]) | {"fma_max_rows": cfg[1]} if isinstance(cfg, tuple)
                      else dataclasses.asdict(cfg))
            result["cells"].append({"kernel": kernel, "shape": name, "rows": m, "config": config,
                                    "us": us, "floor_us": floor_us(kernel, n, k, m), "rel_err": err})
        del made
        if not args.dry:
            torch.cuda.empty_cache()
        print(f"{name} swept at {time.perf_counter() - t0:.0f} s", flush=True)
    out = Path(args.out) / "quant_gemm_sweep.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    by_cfg: dict = {}
    for c in result["cells"]:
        by_cfg.setdefault((c["kernel"], c["rows"], json.dumps(c["config"])), []).append(c)
    print("\nconfig: us per layer (sum of its shapes' GEMMs; floor), max rel_err")
    for (kernel, m, cfg), cells in sorted(by_cfg.items(), key=lambda kv: (kv[0][:2], sum(c["us"] for c in kv[1]))):
        total, floor = sum(c["us"] for c in cells), sum(c["floor_us"] for c in cells)
        print(f"{kernel:>9} rows {m:>2} {cfg}: {total:8.1f} ({floor:.1f}; {len(cells)} shapes) "
              f"err {max(c['rel_err'] for c in cells):.3g}")
    return result


def w4a16_dequant(args, t0: float, device: str, timer) -> None:
    """--w4a16-dequant (with --dry: under TRITON_INTERPRET=1 on the CPU, tiny shapes, float32, wall clock)."""
    from benchmarks.lib import w4a16_dequant as wd

    shapes = [(name, *shape_of(name, args.dry)) for name in within_budget(args.shapes, t0, args.budget_s)]
    wd.run(shapes, LAYER, args.rows or wd.ROWS, Path(args.out), timer, args.dry, args.install_table,
           COPY_BYTES, " ".join(["benchmarks/kernels/quant_gemm.py", *sys.argv[1:]]), tree(), t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, nargs="+", default=None,
                   help="default 1 4 8 16 32 64 256 (--w4a16-dequant: 128 256 1024 4096 8192)")
    p.add_argument("--shapes", nargs="+", default=list(LAYER), choices=list(LAYER))
    p.add_argument("--budget-s", type=float, default=380.0, help="stop starting shapes after this many seconds")
    p.add_argument("--out", default=os.environ.get("OUT", "."), help="directory of quant_gemm.json")
    p.add_argument("--dry", action="store_true", help="on the CPU: tiny shapes, the reference path, wall clock")
    p.add_argument("--sweep", action="store_true", help="time the decode paths' tile configs instead")
    p.add_argument("--w4a16-dequant", action="store_true", help="W4A16's dequantize-then-GEMM path at many rows")
    p.add_argument("--install-table", action="store_true",
                   help="--w4a16-dequant: also write the table over the engine's (kernels/gemm/tuned/)")
    args = p.parse_args()
    import triton

    device = "cpu" if args.dry else "cuda"
    timer = wall_us if args.dry else graph_us
    if args.sweep or args.w4a16_dequant:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (w4a16_dequant if args.w4a16_dequant else sweep)(args, time.perf_counter(), device, timer)
        return
    args.rows = args.rows or [1, 4, 8, 16, 32, 64, 256]

    t0 = time.perf_counter()
    out = Path(args.out) / "quant_gemm.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"benchmark": "quant_gemm", "gpu": "cpu (dry)" if args.dry else torch.cuda.get_device_name(),
              "torch": torch.__version__, "triton": triton.__version__, "command": " ".join(sys.argv),
              "tree": tree(), "hbm_tb_s": HBM_TB_S,
              "formats": {"fp8_channel": "per-channel weight scales: up to 16 rows the weight-only kernel "
                                         "(fp8_w8a16.py, bf16 activations), past it per-token activations and "
                                         "the Triton W8A8 kernel, torch._scaled_mm from fp8_gemm.SCALED_MM_MIN_ROWS",
                          "fp8_channel_w8a8": "the same, the W8A8 paths at every row count (the previous default: "
                                              "the Triton kernel with split K up to 16 rows)",
                          "fp8_block_w8a8": "fp8_block's W8A8 Triton kernel at every row count",
                          "w4a16_gemv": "w4a16's CUDA-core GEMV forced up to 16 rows",
                          "fp8_channel_triton": "the same, the Triton kernel's per-channel mode at every row count",
                          "fp8_channel_scaled_mm": "the same, torch._scaled_mm (row-wise scales) at every row count",
                          "fp8_block": "128x128 weight blocks: the weight-only kernel up to 16 rows, past it "
                                       "per-token-group activations and the W8A8 Triton kernel",
                          "w4a16": f"INT4 asymmetric, group {GROUP}, bf16 scales/zeros, Triton (the GEMV up to "
                                   f"int4_gemv.GEMV_MAX_ROWS rows, by default none; then the tensor cores)",
                          "w4a16_mma": "the same, the tensor-core kernel where the GEMV runs"},
              "cells": [], "correctness": [], "layer": []}
    torch.manual_seed(0)
    for name in within_budget(args.shapes, t0, args.budget_s):
        n, k = shape_of(name, args.dry)
        made = make_formats(n, k, device)
        copies = len(made["bf16"])
        for m in args.rows:
            x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
            for fmt in FORMATS:
                if not timed(fmt, m, args.dry):
                    continue
                ws = made[fmt]
                us = timer(lambda i, fmt=fmt, ws=ws: call(fmt, x, ws[i]), copies)
                cell = {"shape": name, "n": n, "k": k, "rows": m, "format": fmt, "us": us,
                        "floor_us": floor_us(fmt, n, k, m), "weight_bytes": weight_bytes(fmt, n, k)}
                cell["of_floor"] = cell["floor_us"] / us
                result["cells"].append(cell)
                if fmt != "bf16" and m in (args.rows[0], args.rows[-1]):
                    got = call(fmt, x, ws[0])
                    err = rel_err(got, reference(fmt, x, ws[0]))
                    result["correctness"].append({"shape": name, "rows": m, "format": fmt, "rel_err": err,
                                                  "vs_bf16_rel_err": rel_err(got, F.linear(x, made["bf16"][0])),
                                                  "ok": err <= TOLERANCE})
        del made
        if not args.dry:
            torch.cuda.empty_cache()
        print(f"{name} done at {time.perf_counter() - t0:.0f} s", flush=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
    by = {(c["shape"], c["rows"], c["format"]): c for c in result["cells"]}
    for m in args.rows:
        formats = [f for f in FORMATS if all((s, m, f) in by for s in LAYER)]
        if "bf16" not in formats:
            continue
        row = {"rows": m}
        for fmt in formats:
            row[f"{fmt}_us"] = sum(by[(s, m, fmt)]["us"] for s in LAYER)
            row[f"{fmt}_floor_us"] = sum(by[(s, m, fmt)]["floor_us"] for s in LAYER)
            row[f"{fmt}_vs_bf16"] = row[f"{fmt}_us"] / row["bf16_us"]
        result["layer"].append(row)
    result["wall_s"] = time.perf_counter() - t0
    try:
        result["defaults"] = {m: default_paths(m) for m in args.rows}
    except ImportError:  # --dry without Triton
        pass
    out.write_text(json.dumps(result, indent=1) + "\n")
    print_table(result)
    if "defaults" in result:
        print_defaults(result)


def timed(fmt: str, m: int, dry: bool) -> bool:
    """Whether a forced format is timed at m rows: only where it differs from the default."""
    if fmt not in DECODE_ONLY:
        return True
    if m > DECODE_ROWS:
        return False
    if dry:
        return True
    from radixlm.runtime.kernels.quant import int4_gemv

    gemv = m <= int4_gemv.GEMV_MAX_ROWS
    return (fmt == "w4a16_mma" and gemv) or (fmt == "w4a16_gemv" and not gemv) or fmt.endswith("_w8a8")


def default_paths(m: int) -> dict[str, str]:
    """The kernel each format's default takes at m rows (the modules' thresholds), and the forced formats that time
    the alternative."""
    from radixlm.runtime.kernels.quant import fp8_gemm, fp8_w8a16, int4_gemv

    bound = ROW_BUCKETS[bucket_of(m)]
    if m <= fp8_w8a16.W8A16_MAX_ROWS:
        fp8 = "w8a16 tensor-cores"  # (fp8_w8a16.w8a16_linear's fma_max_rows: 0; --sweep times the CUDA cores)
        channel, block = fp8, fp8
    else:
        channel = "w8a8 _scaled_mm" if m >= fp8_gemm.SCALED_MM_MIN_ROWS else "w8a8 triton"
        block = "w8a8 triton"
    w4 = "gemv" if m <= int4_gemv.GEMV_MAX_ROWS else "tensor-cores (nibbles)"
    return {"bucket": bound or "more", "fp8_channel": channel, "fp8_block": block, "w4a16": w4}


ALTERNATIVES = {"fp8_channel": ("fp8_channel_w8a8", "fp8_channel_triton", "fp8_channel_scaled_mm"),
                "fp8_block": ("fp8_block_w8a8",), "w4a16": ("w4a16_mma", "w4a16_gemv")}


def print_defaults(result: dict) -> None:
    """Per row count: each format's default path and its layer time beside the forced alternatives'."""
    print("\ndefaults by row bucket: one layer's us, default (path) vs forced alternatives")
    for row in result["layer"]:
        m = row["rows"]
        paths = default_paths(m)
        parts = []
        for fmt, alts in ALTERNATIVES.items():
            if f"{fmt}_us" not in row:
                continue
            best = min((a for a in (fmt, *alts) if f"{a}_us" in row), key=lambda a: row[f"{a}_us"])
            parts.append(f"{fmt} [{paths[fmt]}] {row[f'{fmt}_us']:.1f}" + "".join(
                f" | {a} {row[f'{a}_us']:.1f}" for a in alts if f"{a}_us" in row)
                + ("" if best == fmt else f"  <- {best} faster"))
        print(f"rows {m:>4} (bucket {paths['bucket']}): " + ";  ".join(parts))


def print_table(result: dict) -> None:
    print(f"\n{result['gpu']}: device us per GEMM (floor us at {HBM_TB_S} TB/s)")
    print(f"{'shape':>13} {'rows':>5} " + " ".join(f"{f[:20]:>22}" for f in FORMATS))
    by = {(c["shape"], c["rows"], c["format"]): c for c in result["cells"]}
    for shape, m in sorted({(c["shape"], c["rows"]) for c in result["cells"]}, key=lambda t: (LAYER.index(t[0]), t[1])):
        cells = [by.get((shape, m, f)) for f in FORMATS]
        print(f"{shape:>13} {m:>5} " + " ".join(f"{c['us']:>10.1f} ({c['floor_us']:>8.1f})" if c else f"{'-':>22}"
                                                 for c in cells))
    print("\none layer's four GEMMs: us (ratio to bf16)")
    for row in result["layer"]:
        print(f"rows {row['rows']:>4}: " + "  ".join(
            f"{f} {row[f'{f}_us']:.1f} ({row[f'{f}_vs_bf16']:.2f}x; floor {row[f'{f}_floor_us']:.1f})"
            for f in FORMATS if f"{f}_us" in row))
    bad = [c for c in result["correctness"] if not c["ok"]]
    print(f"\ncorrectness against the reference: {len(result['correctness']) - len(bad)} of "
          f"{len(result['correctness'])} within {TOLERANCE}" + "".join(
              f"\n  FAIL {c['format']} {c['shape']} rows {c['rows']}: {c['rel_err']:.3g}" for c in bad))


if __name__ == "__main__":
    main()
