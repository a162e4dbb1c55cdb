"""The grouped quantized MoE kernels (radixlm/runtime/kernels/moe/quant_moe.py) against the bf16 grouped GEMM on
Qwen3-30B-A3B's MoE layer (128 experts, top-8, hidden 2048, moe_intermediate 768), one device call: bf16
(fused_moe.fused_experts_triton) vs FP8 per-channel vs FP8 128x128 blocks vs W4A16 (INT4, group 128) at 1, 8, 64,
256 and 1024 tokens, each figure the device time of one whole layer call (routing sort, both GEMMs, SiLU-and-mul,
activation quantization where w8a8, split-K sums, the top-k sum) from CUDA-graph replays over distinct weight copies
and routings (benchmarks/lib/gpu_timing.py: no L2 hits, no launch gaps), beside the bytes floor of the experts that
call's routing touches (their weights and scales + the input and output activations, at 4.8 TB/s). The default picks
(weight-only up to W8A8_MIN_PAIRS_PER_EXPERT pairs an expert, w8a8 past it; K split in the decode config) are timed
beside forced ones: *_w8a8 (w8a8 at every token count), *_nosplit (no K split at decode) and w4a16_fold (INT4
codes multiplied as 16-bit floats at decode, quant_moe.INT4_FOLD_MAX_BLOCK_M 32; off by default). Each format's output is
checked against kernels/moe/quant_moe_ref.py (max |error| / max |reference|).

    python3 benchmarks/kernels/quant_moe.py --out $OUT        # writes $OUT/quant_moe.json, ~2-3 min on an H200
    TRITON_INTERPRET=1 python benchmarks/kernels/quant_moe.py --dry --out /tmp   # the logic on the CPU: tiny
                                                              # shapes, float16, wall-clock times, w8a8 unchecked
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.lib.gpu_timing import graph_us, tree, wall_us, within_budget  # noqa: E402
from benchmarks.lib.quant_sweep import BLOCK, GROUP, HBM_TB_S, TOLERANCE, rel_err  # noqa: E402

EXPERTS, TOP_K, HIDDEN, INTER = 128, 8, 2048, 768
DRY = (8, 2, 256, 128)
COPIES = 4  # weight copies (layers) and routings per graph: each call reads its own experts from HBM
# w8a8: an intermediate one bf16 rounding apart from the reference's can round to the neighbouring FP8 value
W8A8_TOLERANCE = 6e-2
# format -> (quantized format of quant_moe_ref.quantize_experts or None for bf16, forced w8a8, forced split)
FORMATS = {
    "bf16": (None, None, None),
    "fp8_channel": ("fp8_channel", None, None),
    "fp8_block": ("fp8_block", None, None),
    "w4a16": ("int4", None, None),
    "fp8_channel_w8a8": ("fp8_channel", True, None),
    "fp8_block_w8a8": ("fp8_block", True, None),
    "fp8_channel_nosplit": ("fp8_channel", None, False),
    "w4a16_nosplit": ("int4", None, False),
    "w4a16_fold": ("int4", None, None),  # the INT4 codes multiplied as 16-bit floats at decode (INT4_FOLD on)
}
NOSPLIT_MAX_TOKENS = 8  # the forced no-split variants only where the default splits
FOLD_MAX_TOKENS = 256  # and the no-fold one where the decode config runs


def expert_bytes(fmt: str, h: int, i: int) -> int:
    """One expert's weight bytes (w13 (2i, h) + w2 (h, i)) with its scales."""
    base = FORMATS[fmt][0]
    n_w = 3 * i * h
    if base is None:
        return 2 * n_w
    if base == "fp8_channel":
        return n_w + 4 * (2 * i + h)
    if base == "fp8_block":
        cd = lambda a, b: -(-a // b)  # noqa: E731
        return n_w + 4 * (cd(2 * i, BLOCK[0]) * cd(h, BLOCK[1]) + cd(h, BLOCK[0]) * cd(i, BLOCK[1]))
    return n_w // 2 + 2 * 2 * (h // GROUP * 2 * i + i // GROUP * h)  # packed INT4 + bf16 scales and zeros


def make_weights(e: int, h: int, i: int, device: str, dtype: torch.dtype, copies: int) -> dict[str, list]:
    from radixlm.runtime.kernels.moe.quant_moe_ref import quantize_experts

    made: dict[str, list] = {"bf16": [], "fp8_channel": [], "fp8_block": [], "int4": []}
    for c in range(copies):
        g = torch.Generator(device=device).manual_seed(c)
        w13 = torch.randn(e, 2 * i, h, device=device, generator=g, dtype=dtype) * h**-0.5
        w2 = torch.randn(e, h, i, device=device, generator=g, dtype=dtype) * i**-0.5
        made["bf16"].append((w13, w2))
        for base in ("fp8_channel", "fp8_block", "int4"):
            made[base].append((quantize_experts(w13, base, BLOCK, GROUP, dtype),
                               quantize_experts(w2, base, BLOCK, GROUP, dtype)))
    return made


def routings(t: int, e: int, k: int, h: int, device: str, dtype: torch.dtype, copies: int) -> list[tuple]:
    from radixlm.runtime.kernels.moe import select_experts

    out = []
    for c in range(copies):
        g = torch.Generator(device=device).manual_seed(1000 * t + c)
        x = torch.randn(t, h, device=device, generator=g).to(dtype)
        weights, ids = select_experts(torch.randn(t, e, device=device, generator=g), k, renormalize=True)
        out.append((x, weights, ids))
    return out


def call(fmt: str, weights, route, config=None):
    from radixlm.runtime.kernels.moe.fused_moe import fused_experts_triton
    from radixlm.runtime.kernels.moe.quant_moe import fused_experts_quant

    x, tw, ids = route
    _, w8a8, split = FORMATS[fmt]
    if FORMATS[fmt][0] is None:
        return fused_experts_triton(x, *weights, tw, ids, config=config)
    if fmt.endswith("_fold"):
        from radixlm.runtime.kernels.moe import quant_moe

        fold, quant_moe.INT4_FOLD_MAX_BLOCK_M = quant_moe.INT4_FOLD_MAX_BLOCK_M, 32
        try:
            return fused_experts_quant(x, *weights, tw, ids, config=config, w8a8=w8a8, split=split)
        finally:
            quant_moe.INT4_FOLD_MAX_BLOCK_M = fold
    return fused_experts_quant(x, *weights, tw, ids, config=config, w8a8=w8a8, split=split)


def chosen(fmt: str, t: int, k: int, e: int, dtype: torch.dtype) -> dict:
    """The launch's config and w8a8 as the pass picks them (or the format forces w8a8)."""
    import dataclasses

    from radixlm.runtime.kernels.moe.fused_moe import pick_config
    from radixlm.runtime.kernels.moe.quant_moe import uses_w8a8

    w8a8 = FORMATS[fmt][1]
    if FORMATS[fmt][0] is None or not FORMATS[fmt][0].startswith("fp8"):
        w8a8 = False
    elif w8a8 is None:
        w8a8 = uses_w8a8(t * k, e)
    return {"config": dataclasses.asdict(pick_config(t * k, e, dtype)), "w8a8": w8a8}


def sweep_configs() -> list:
    """Decode tile configs around fused_moe.pick_config's (16, 64, 128, 4 warps, 4 stages), for the sweep cells."""
    from radixlm.runtime.kernels.moe.fused_moe import GemmConfig

    return [GemmConfig(16, 32, 128, 4, 4), GemmConfig(16, 128, 128, 4, 4), GemmConfig(16, 64, 128, 4, 2),
            GemmConfig(16, 64, 64, 4, 4), GemmConfig(16, 64, 128, 8, 4)]


def reference(fmt: str, weights, route):
    from radixlm.runtime.kernels.moe.fused_moe import fused_experts_torch
    from radixlm.runtime.kernels.moe.quant_moe import uses_w8a8
    from radixlm.runtime.kernels.moe.quant_moe_ref import fused_experts_quant_reference

    x, tw, ids = route
    if FORMATS[fmt][0] is None:
        return fused_experts_torch(x.float(), weights[0].float(), weights[1].float(), tw, ids)
    w8a8 = FORMATS[fmt][1]
    if w8a8 is None:
        w8a8 = uses_w8a8(ids.numel(), weights[0].shape[0])
    return fused_experts_quant_reference(x, *weights, tw, ids, 0, w8a8)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 64, 256, 1024])
    p.add_argument("--formats", nargs="+", default=list(FORMATS), choices=list(FORMATS))
    p.add_argument("--budget-s", type=float, default=170.0, help="stop starting token counts after this many seconds")
    p.add_argument("--out", default=os.environ.get("OUT", "."), help="directory of quant_moe.json")
    p.add_argument("--dry", action="store_true", help="on the CPU under TRITON_INTERPRET=1: tiny shapes, float16")
    args = p.parse_args()
    import triton

    from radixlm.runtime.kernels.moe.quant_moe import W8A8_MIN_PAIRS_PER_EXPERT

    t0 = time.perf_counter()
    device, dtype = ("cpu", torch.float16) if args.dry else ("cuda", torch.bfloat16)
    e, k, h, i = DRY if args.dry else (EXPERTS, TOP_K, HIDDEN, INTER)
    copies = 2 if args.dry else COPIES
    timer = wall_us if args.dry else graph_us
    out = Path(args.out) / "quant_moe.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"benchmark": "quant_moe", "gpu": "cpu (dry)" if args.dry else torch.cuda.get_device_name(),
              "torch": torch.__version__, "triton": triton.__version__, "command": " ".join(sys.argv),
              "tree": tree(), "hbm_tb_s": HBM_TB_S,
              "shape": {"experts": e, "top_k": k, "hidden": h, "moe_intermediate": i, "copies": copies},
              "w8a8_min_pairs_per_expert": W8A8_MIN_PAIRS_PER_EXPERT,
              "formats": {f: {"weights": v[0] or "bf16", "w8a8": v[1], "split": v[2]} for f, v in FORMATS.items()},
              "cells": [], "correctness": []}
    torch.manual_seed(0)
    made = make_weights(e, h, i, device, dtype, copies)
    print(f"weights made at {time.perf_counter() - t0:.0f} s", flush=True)
    for t in within_budget(args.tokens, t0, args.budget_s):
        routes = routings(t, e, k, h, device, dtype, copies)
        touched = sum(torch.unique(r[2]).numel() for r in routes) / copies
        for fmt in args.formats:
            if (fmt.endswith("_nosplit") and t > NOSPLIT_MAX_TOKENS) or (fmt.endswith("_fold")
                                                                        and t > FOLD_MAX_TOKENS):
                continue
            ws = made[FORMATS[fmt][0] or "bf16"]
            us = timer(lambda c, fmt=fmt: call(fmt, ws[c], routes[c]), copies)
            floor = (touched * expert_bytes(fmt, h, i) + 2 * 2 * t * h) / (HBM_TB_S * 1e12) * 1e6
            result["cells"].append({"tokens": t, "format": fmt, "us": us, "floor_us": floor, "of_floor": floor / us,
                                    "experts_touched": touched, "expert_bytes": expert_bytes(fmt, h, i),
                                    **chosen(fmt, t, k, e, dtype)})
            if t in (args.tokens[0], args.tokens[-1]) or fmt.endswith("_w8a8"):
                err = rel_err(call(fmt, ws[0], routes[0]), reference(fmt, ws[0], routes[0]))
                w8a8 = chosen(fmt, t, k, e, dtype)["w8a8"]
                tol = W8A8_TOLERANCE if w8a8 else TOLERANCE
                # --dry: Triton's interpreter rounds float32 -> FP8 half up, the GPU to nearest even, so the w8a8
                # activations are not checked there (the interpreted kernel tests patch the conversion and check them).
                result["correctness"].append({"tokens": t, "format": fmt, "rel_err": err, "tolerance": tol,
                                              "ok": None if args.dry and w8a8 else err <= tol})
        print(f"{t} tokens done at {time.perf_counter() - t0:.0f} s", flush=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
    # With the budget left: decode tile configs other than pick_config's, at 1 and 8 tokens (tuning leads).
    result["sweep"] = []
    for t, fmt, cfg in within_budget([(t, f, c) for t in (1, 8) for f in ("bf16", "fp8_channel", "w4a16")
                                      for c in sweep_configs()], t0, args.budget_s):
        import dataclasses

        routes = routings(t, e, k, h, device, dtype, copies)
        ws = made[FORMATS[fmt][0] or "bf16"]
        us = timer(lambda c, fmt=fmt, cfg=cfg: call(fmt, ws[c], routes[c], cfg), copies)
        err = rel_err(call(fmt, ws[0], routes[0], cfg), reference(fmt, ws[0], routes[0]))
        result["sweep"].append({"tokens": t, "format": fmt, "config": dataclasses.asdict(cfg), "us": us,
                                "rel_err": err})
        out.write_text(json.dumps(result, indent=1) + "\n")
    by = {(c["tokens"], c["format"]): c for c in result["cells"]}
    for c in result["cells"]:
        if (c["tokens"], "bf16") in by:
            c["vs_bf16"] = c["us"] / by[(c["tokens"], "bf16")]["us"]
    result["wall_s"] = time.perf_counter() - t0
    out.write_text(json.dumps(result, indent=1) + "\n")
    print_table(result, args.formats)


def print_table(result: dict, formats: list[str]) -> None:
    print(f"\n{result['gpu']}: device us per MoE layer call (floor us of the touched experts at {HBM_TB_S} TB/s; "
          f"ratio to bf16)")
    print(f"{'tokens':>6} " + " ".join(f"{f[:24]:>26}" for f in formats))
    by = {(c["tokens"], c["format"]): c for c in result["cells"]}
    for t in sorted({c["tokens"] for c in result["cells"]}):
        cells = [by.get((t, f)) for f in formats]
        print(f"{t:>6} " + " ".join(
            f"{c['us']:>8.1f} ({c['floor_us']:>6.1f}) {c.get('vs_bf16', 0):>5.2f}x" if c else f"{'-':>26}"
            for c in cells))
    if result.get("sweep"):
        print("\ndecode tile configs (block_m, block_n, block_k, warps, stages): us (default's us)")
        for c in result["sweep"]:
            default = by.get((c["tokens"], c["format"]))
            print(f"  {c['format']:>12} {c['tokens']:>2} tokens {tuple(c['config'].values())}: {c['us']:8.1f} "
                  f"({default['us'] if default else float('nan'):8.1f}) err {c['rel_err']:.3g}")
    bad = [c for c in result["correctness"] if c["ok"] is False]
    unchecked = sum(c["ok"] is None for c in result["correctness"])
    print(f"\ncorrectness against the reference: {len(result['correctness']) - len(bad) - unchecked} of "
          f"{len(result['correctness'])} within {TOLERANCE} ({W8A8_TOLERANCE} w8a8)"
          + (f", {unchecked} w8a8 not checked (--dry)" if unchecked else "") + "".join(
              f"\n  FAIL {c['format']} {c['tokens']} tokens: {c['rel_err']:.3g}" for c in bad))


if __name__ == "__main__":
    main()
