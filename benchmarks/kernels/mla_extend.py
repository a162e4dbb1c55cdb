"""MLA extend attention (radixlm/runtime/kernels/attention/mla_extend.py: absorbed queries over the latent pool) on
DeepSeek-V2-Lite (16 heads) and V3 (128 heads) widths, bf16, each figure beside two floors: bytes (the latents of
every request's prefix and new tokens, read once, at --bandwidth) and compute (the causal scores and values in
absorbed form, (576 + 512) x 2 FLOPs per visible key per head, at --tflops: the H200's dense bf16 peak). Shapes:
a chunk of 512 new tokens over a 4k prefix (chunked prefill), 4 prompts of 1024 tokens without prefix (prefill:
SGLang runs these unabsorbed, the kernel is timed for the comparison), and 32 requests of 4 new tokens over 1k
(speculative verification). Each checks its output against a float32 torch reference (the last request), then the
default launch (mla_extend_config) and the --configs alternatives are timed (CUDA events over graph replays).

    python3 benchmarks/kernels/mla_extend.py --out $OUT/mla_extend.json      # ~1-2 min on an H200
    TRITON_INTERPRET=1 python benchmarks/kernels/mla_extend.py --dry --out /tmp/mla_extend.json   # logic, on the CPU
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

from radixlm.runtime.kernels.attention.mla import (  # noqa: E402
    MlaExtendConfig, mla_extend, mla_extend_blocks, mla_extend_config)

MODELS = {"v2-lite": 16, "v3": 128}
RANK, ROPE = 512, 64
SM_SCALE = 192 ** -0.5
SHAPES = {"chunk512_over4k": (4096, 512, 1), "prefill1k_x4": (0, 1024, 4), "verify4_over1k_x32": (1024, 4, 32)}
# (block_h, block_m, block_n, num_warps, num_stages): 32 rows as the default with longer key blocks, 64 rows (4 tokens
# x 16 heads: half the L2 re-reads, twice the accumulator), 16 rows over 4 warps.
CONFIGS = [(16, 2, 64, 8, 2), (16, 4, 32, 8, 2), (16, 1, 32, 4, 2), (8, 4, 32, 8, 2)]
TOLERANCE = 2e-2


def log(*a) -> None:
    print(*a, flush=True)


def name(c: MlaExtendConfig) -> str:
    return f"h{c.block_h}m{c.block_m}n{c.block_n}w{c.num_warps}s{c.num_stages}"


def run_shape(model: str, heads: int, shape: str, prefix: int, ext: int, nreq: int, args, save) -> None:
    device = "cpu" if args.dry else "cuda"
    dtype = torch.float32 if args.dry else torch.bfloat16
    rank, rope = (32, 16) if args.dry else (RANK, ROPE)
    total = prefix + ext
    g = torch.Generator(device=device).manual_seed(heads + ext)
    kv = torch.randn(nreq * total + 1, 1, rank + rope, generator=g, device=device).to(dtype)
    req_to_token = (torch.arange(nreq * total, device=device) + 1).view(nreq, total)
    rows = torch.arange(nreq, device=device)
    prefix_lens = torch.full((nreq,), prefix, device=device)
    extend_lens = torch.full((nreq,), ext, device=device)
    starts = torch.arange(nreq, device=device) * ext
    q = torch.randn(nreq * ext, heads, rank + rope, generator=g, device=device).to(dtype)
    out = torch.empty(nreq * ext, heads, rank, device=device, dtype=dtype)
    keys = kv[req_to_token[-1], 0].float()
    s = torch.einsum("thd,nd->thn", q[-ext:].float(), keys) * SM_SCALE
    visible = torch.arange(total, device=device)[None, :] <= (prefix + torch.arange(ext, device=device))[:, None]
    ref = torch.einsum("thn,nr->thr", s.masked_fill(~visible[:, None], float("-inf")).softmax(-1), keys[:, :rank])
    nbytes = nreq * total * (rank + rope) * kv.element_size()
    flops = nreq * heads * (rank + rope + rank) * 2 * sum(prefix + j + 1 for j in range(ext))
    floor_bytes_us = nbytes / args.bandwidth * 1e6
    floor_flops_us = flops / (args.tflops * 1e12) * 1e6
    configs = [mla_extend_config(heads)] + ([] if args.dry else [MlaExtendConfig(*c) for c in args.configs])
    for config in dict.fromkeys(configs):
        if time.perf_counter() - args.t0 > args.budget_s:
            log(f"budget of {args.budget_s:.0f} s spent: no {name(config)}")
            return
        blocks = torch.tensor(mla_extend_blocks([ext] * nreq, config), dtype=torch.int64, device=device)

        def call():
            return mla_extend(q, kv, req_to_token, rows, prefix_lens, extend_lens, starts, SM_SCALE, out,
                              blocks=blocks, config=config)

        try:
            err = ((call()[-ext:].float() - ref).abs().max() / ref.abs().max()).item()
            if args.dry:
                t0 = time.perf_counter()
                call()
                us = (time.perf_counter() - t0) * 1e6
            else:
                from benchmarks.lib.gpu_timing import quick_us

                torch.cuda.synchronize()
                us = quick_us(lambda i: call(), 1, args.reps)
        except Exception as e:  # noqa: BLE001 - a config that does not build or fit here: reported
            log(f"  {model} {shape} {name(config)}: {type(e).__name__}: {str(e)[:300]}")
            continue
        floor = max(floor_bytes_us, floor_flops_us)
        cell = {"model": model, "heads": heads, "shape": shape, "prefix": prefix, "extend": ext, "requests": nreq,
                "config": name(config), "default": config == configs[0], "us": us, "floor_bytes_us": floor_bytes_us,
                "floor_flops_us": floor_flops_us, "x_floor": us / floor, "tflops": flops / us / 1e6,
                "rel_err": err, "valid": err < TOLERANCE}
        save(cell)
        log(f"  {model:<8} {shape:<19} {name(config):<13}{'*' if cell['default'] else ' '} {us:10.1f} us  bytes "
            f"floor {floor_bytes_us:8.1f}  compute floor {floor_flops_us:9.1f}  ({cell['x_floor']:5.2f}x)  "
            f"{cell['tflops']:6.1f} TFLOPS  err {err:.1e}{'' if cell['valid'] else '  WRONG'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="v2-lite,v3")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--bandwidth", type=float, default=4.8e12)
    ap.add_argument("--tflops", type=float, default=989.0, help="the compute floor's rate (H200 dense bf16)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--budget-s", type=float, default=150.0)
    ap.add_argument("--dry", action="store_true", help="tiny shapes on the CPU (run with TRITON_INTERPRET=1)")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "mla_extend.json"))
    args = ap.parse_args()
    args.configs = CONFIGS
    args.t0 = time.perf_counter()
    models = [m for m in args.models.split(",") if m]
    shapes = [s for s in args.shapes.split(",") if s]
    unknown = sorted(set(models) - set(MODELS)) + sorted(set(shapes) - set(SHAPES))
    if unknown:
        raise SystemExit(f"unknown {unknown}: models {sorted(MODELS)}, shapes {sorted(SHAPES)}")
    if not args.dry and not torch.cuda.is_available():
        raise SystemExit("needs CUDA (or --dry with TRITON_INTERPRET=1)")
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    result = {"benchmark": "mla_extend", "command": "python " + " ".join(sys.argv),
              "gpu": None if args.dry else torch.cuda.get_device_name(), "torch": torch.__version__,
              "bandwidth": args.bandwidth, "tflops": args.tflops, "cells": []}

    def save(cell: dict) -> None:
        result["cells"].append(cell)
        out_path.write_text(json.dumps(result, indent=1))

    for model in models:
        for shape in shapes:
            prefix, ext, nreq = SHAPES[shape]
            if args.dry:
                prefix, ext, nreq = min(prefix, 40), min(ext, 9), min(nreq, 2)
            heads = MODELS[model] if not args.dry else (4 if model == "v2-lite" else 20)
            run_shape(model, heads, shape, prefix, ext, nreq, args, save)
            if not args.dry:
                torch.cuda.empty_cache()
    out_path.write_text(json.dumps(result, indent=1))
    log(f"wrote {out_path} ({time.perf_counter() - args.t0:.0f} s)")


if __name__ == "__main__":
    main()
