"""The MLA attention kernels (radixlm/runtime/kernels/attention/mla_decode.py and mla_extend.py: absorbed queries over
the latent pool) on DeepSeek shapes, each in one device call.

--kind decode (the default): decode attention, each figure beside its bytes floor (the latent pool bytes the step
reads: batch x context x (512 + 64) x 2 bytes, at --bandwidth; H200 HBM3e 4.8 TB/s):

- cases: DeepSeek-V2-Lite (16 heads) and V3 (128 heads, one GPU, no tensor parallelism), kv_lora_rank 512, rope 64,
  bf16 pool, at batch 1/32/256 x context 1k/4k (every request at the full context, its slots contiguous);
- each case first checks the default launch against a float32 torch reference (three requests: max |error| /
  max |reference|), then times stage 1 + stage 2 as one call: CUDA-graph replays of `copies` calls over distinct
  requests of one pool (at least COPY_BYTES of latents a replay, several times the L2: no hits, no launch gaps),
  and profiles eager calls (torch.profiler: each stage's device time, "kernels_us");
- the sweep (--sweep all, or names of CONFIGS): every launch config at its own split rule (mla_decode_num_splits),
  then the two fastest of the case at --split-factors times that split count; each config's output checked against
  the reference too (a wrong one is reported, never picked).

Prints a table per case (default, best, floor) and the config with the least geometric-mean time over the cases
(per model and overall), to set mla.py's MLA_DECODE_DEFAULT (V2-Lite's 16 heads) and MLA_DECODE_DEFAULT_MANY_HEADS
(V3's 128) from one device run; writes the JSON to --out (rewritten after
each cell: a run stopped by its budget keeps what it measured). --kv fp8_e4m3: the same over a float8 pool (read as
stored x 0.5; its floor half bf16's).

--kind extend: extend attention on V2-Lite (16 heads) and V3 (128 heads) widths, bf16, each figure beside two
floors: bytes (the latents of every request's prefix and new tokens, read once, at --bandwidth) and compute (the
causal scores and values in absorbed form, (576 + 512) x 2 FLOPs per visible key per head, at --tflops: the H200's
dense bf16 peak). Shapes: a chunk of 512 new tokens over a 4k prefix (chunked prefill), 4 prompts of 1024 tokens
without prefix (prefill: SGLang runs these unabsorbed, the kernel is timed for the comparison), and 32 requests of 4
new tokens over 1k (speculative verification). Each checks its output against a float32 torch reference (the last
request), then the default launch (mla_extend_config) and the EXTEND_CONFIGS alternatives are timed (graph replays).

    python3 benchmarks/kernels/mla_decode.py --sweep all --out $OUT/mla_decode.json   # ~4-6 min on an H200
    python3 benchmarks/kernels/mla_decode.py --kind extend --out $OUT/mla_extend.json  # ~1-2 min
    TRITON_INTERPRET=1 python benchmarks/kernels/mla_decode.py [--kind extend] --dry --sweep all --out /tmp/mla.json
        # the script's logic on the CPU: tiny shapes (R 32, P 16), wall-clock times, no graphs"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from enum import Enum
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.lib.mla_cases import SM_SCALE, TOLERANCE, Case, kernel_us, log, summarize, time_us  # noqa: E402
from radixlm.runtime.kernels.attention.mla import (  # noqa: E402
    MLA_DECODE_DEFAULT, MLA_DECODE_DEFAULT_MANY_HEADS, MLA_MAX_SPLITS, MlaDecodeConfig, MlaExtendConfig,
    mla_decode_config, mla_decode_num_splits, mla_extend, mla_extend_blocks, mla_extend_config)


class Kind(str, Enum):
    DECODE = "decode"
    EXTEND = "extend"


MODELS = {"v2-lite": 16, "v3": 128}  # query heads (DeepSeek-V2-Lite, DeepSeek-V3/R1 unsharded)
RANK, ROPE = 512, 64
KV_DTYPES = {"bf16": None, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}  # None: the queries'

# --kind extend: (prefix, new tokens, requests) a shape; the launch configs beside the default (block_h, block_m,
# block_n, num_warps, num_stages): 32 rows as the default with longer key blocks, 64 rows (4 tokens x 16 heads: half
# the L2 re-reads, twice the accumulator), 16 rows over 4 warps.
EXTEND_SHAPES = {"chunk512_over4k": (4096, 512, 1), "prefill1k_x4": (0, 1024, 4), "verify4_over1k_x32": (1024, 4, 32)}
EXTEND_CONFIGS = [(16, 2, 64, 8, 2), (16, 4, 32, 8, 2), (16, 1, 32, 4, 2), (8, 4, 32, 8, 2)]


def config_name(c: MlaDecodeConfig) -> str:
    return f"h{c.block_h}n{c.block_n}w{c.num_warps}s{c.num_stages}{'' if c.inline_cvt else 'p'}"  # p: plain cast


# Around the defaults (mla.py: 16 heads x 32 positions, 4 warps, 3 stages; 32 heads, 8 warps from 32 heads): 2
# stages, 16- and 64-position blocks, 8 warps, 32 and 64 heads a program (fewer re-reads of a request's latents from L2
# at 128 heads: mla.py has the registers of each); a float8 pool (--kv) also times each default's other conversion
# (inline or the plain cast, suffix p).
CONFIGS = {config_name(c): c for c in [
    MLA_DECODE_DEFAULT, MLA_DECODE_DEFAULT_MANY_HEADS,
    MlaDecodeConfig(16, 32, 4, 2), MlaDecodeConfig(16, 16, 4, 3), MlaDecodeConfig(16, 64, 4, 3),
    MlaDecodeConfig(16, 32, 8, 3), MlaDecodeConfig(16, 64, 8, 3), MlaDecodeConfig(32, 16, 8, 3),
    MlaDecodeConfig(32, 64, 8, 3), MlaDecodeConfig(64, 16, 8, 3), MlaDecodeConfig(64, 32, 8, 3),
    MlaDecodeConfig(64, 16, 8, 2), MlaDecodeConfig(16, 32, 4, 3, inline_cvt=False),
    MlaDecodeConfig(32, 32, 8, 3, inline_cvt=True),
]}


def default_name(heads: int) -> str:
    return config_name(mla_decode_config(heads))


def run_cell(case: Case, name: str, splits: int, args, save, profile: bool = False) -> dict | None:
    config = CONFIGS[name]
    t0 = time.perf_counter()
    try:
        err = case.error(config, splits)
        us = case.time_us(config, splits, args.reps)
    except Exception as e:  # noqa: BLE001 - a config that does not build or fit here: reported, never picked
        log(f"  {name}@{splits}: {type(e).__name__}: {str(e)[:300]}")
        return None
    kernels = {}
    if profile and case.device == "cuda":
        try:
            kernels = kernel_us(case, config, splits)
        except Exception as e:  # noqa: BLE001 - the profile is information: its failure stops nothing
            log(f"  profile of {name}@{splits}: {type(e).__name__}: {str(e)[:200]}")
    floor_us = case.bytes / args.bandwidth * 1e6
    cell = {"model": case.model, "heads": case.heads, "kv": str(case.kv.dtype).removeprefix("torch."),
            "batch": case.bs, "context": case.ctx, "config": name, "config_fields": config.__dict__,
            "default": name == default_name(case.heads), "splits": splits,
            "auto_splits": splits == auto_splits(case, config),
            "us": us, "floor_us": floor_us, "of_floor": floor_us / us, "x_floor": us / floor_us,
            "gb_s": case.bytes / us / 1e3, "bytes": case.bytes, "copies": case.copies, "kernels_us": kernels,
            "rel_err": err,
            "valid": err < TOLERANCE, "build_and_time_s": time.perf_counter() - t0}
    save(cell)
    log(f"  {case.model:<8} bs {case.bs:<4} ctx {case.ctx:<5} {name:<11} splits {splits:<3} {us:9.1f} us  floor "
        f"{floor_us:8.1f} us ({us / floor_us:5.2f}x)  {cell['gb_s']:7.0f} GB/s  err {err:.1e}"
        f"{'' if cell['valid'] else '  WRONG'}")
    return cell


def auto_splits(case: Case, config: MlaDecodeConfig) -> int:
    return mla_decode_num_splits(case.bs, case.heads, case.ctx, config)


def run_decode(args, models: list[str], result: dict, save, in_budget) -> None:
    """--kind decode: the default at every case first, then the sweep case by case (the case's pool made again: one
    pool in memory)."""
    sweep = list(CONFIGS) if args.sweep == "all" else [s for s in args.sweep.split(",") if s]
    unknown = sorted(set(sweep) - set(CONFIGS))
    if unknown:
        raise SystemExit(f"--sweep: unknown {unknown}; choose 'all' or from {sorted(CONFIGS)}")
    if KV_DTYPES[args.kv] is None:  # the float8 conversion does not apply: one config per launch shape
        shapes = {}
        for n in sweep:
            shapes.setdefault(tuple(CONFIGS[n].__dict__.values())[:4], n)
        sweep = list(shapes.values())
    factors = [float(f) for f in args.split_factors.split(",") if f]
    batches = [int(b) for b in args.batches.split(",") if b]
    contexts = [int(c) for c in args.contexts.split(",") if c]
    if args.dry:
        batches, contexts, sweep = [min(b, 3) for b in batches[:2]], [64], sweep[:3]
    device = "cpu" if args.dry else "cuda"
    rank, rope = result["kv_lora_rank"], result["rope"]
    result.update(kv=args.kv, defaults={m: default_name(h) for m, h in MODELS.items()})
    specs = [(m, heads_of(m, args.dry), bs, ctx) for m in models for bs in batches for ctx in contexts]
    for phase in ("default", "sweep"):
        if phase == "sweep" and not sweep:
            break
        log(f"== {phase}")
        for model, heads, bs, ctx in specs:
            if not in_budget():
                break
            case = Case(model, heads, bs, ctx, rank, rope, device, args.dry, KV_DTYPES[args.kv])
            default = default_name(heads)
            names = [default] if phase == "default" else [n for n in sweep if n != default]
            timed = []
            for name in names:
                if not in_budget():
                    break
                cell = run_cell(case, name, auto_splits(case, CONFIGS[name]), args, save, profile=phase == "default")
                if cell is not None and cell["valid"]:
                    timed.append(cell)
            if phase == "sweep":
                timed += [c for c in result["cells"] if c["default"] and c["auto_splits"] and c["valid"] and
                          (c["model"], c["batch"], c["context"]) == (model, bs, ctx)]
                for cell in sorted(timed, key=lambda c: c["us"])[:2]:
                    done = {cell["splits"]}
                    for f in factors:
                        splits = max(1, min(MLA_MAX_SPLITS * 2, round(cell["splits"] * f)))
                        if splits not in done and in_budget():
                            done.add(splits)
                            run_cell(case, cell["config"], splits, args, save)
            del case
            if device == "cuda":
                torch.cuda.empty_cache()
    result["summary"] = summarize(result["cells"])
    save(None)
    log(f"\n{'model':<8} {'bs':>4} {'ctx':>5} {'floor us':>9} {'default us':>10} {'x floor':>7}   "
        f"{'best':<16} {'best us':>8} {'x floor':>7}   default's kernels (eager, us)")
    for r in result["summary"]["per_case"]:
        d = f"{r['default_us']:10.1f} {r['default_x_floor']:7.2f}" if r["default_us"] else f"{'-':>10} {'-':>7}"
        stages = "  ".join(f"{k.split('_')[-1]} {v:.1f}" for k, v in sorted((r["default_kernels_us"] or {}).items()))
        log(f"{r['model']:<8} {r['batch']:>4} {r['context']:>5} {r['floor_us']:9.1f} {d}   {r['best']:<16} "
            f"{r['best_us']:8.1f} {r['best_x_floor']:7.2f}   {stages}")
    for model, s in result["summary"]["per_model"].items():
        held = s["default_over_pick"]
        log(f"{model}: fastest config (geometric mean over {s['cases']} cases, each at its split rule) {s['pick']}; "
            + (f"the default takes {held:.3f}x its time" if not math.isnan(held) else "the cases' defaults differ"))
    for model, var in (("v2-lite", "MLA_DECODE_DEFAULT"), ("v3", "MLA_DECODE_DEFAULT_MANY_HEADS")):
        pick = result["summary"]["per_model"].get(model)
        if pick:
            c = CONFIGS[pick["pick"]]
            cvt = "" if c.inline_cvt else ", inline_cvt=False"
            log(f"{var} = MlaDecodeConfig({c.block_h}, {c.block_n}, {c.num_warps}, {c.num_stages}{cvt})  # {model}")


def extend_name(c: MlaExtendConfig) -> str:
    return f"h{c.block_h}m{c.block_m}n{c.block_n}w{c.num_warps}s{c.num_stages}"


def extend_shape(model: str, heads: int, shape: str, prefix: int, ext: int, nreq: int, args, save, in_budget) -> None:
    """One --kind extend shape: the reference of the last request, then each config checked and timed."""
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
    configs = [mla_extend_config(heads)] + ([] if args.dry else [MlaExtendConfig(*c) for c in EXTEND_CONFIGS])
    for config in dict.fromkeys(configs):
        if not in_budget():
            return
        blocks = torch.tensor(mla_extend_blocks([ext] * nreq, config), dtype=torch.int64, device=device)

        def call(_i=0, config=config, blocks=blocks):
            return mla_extend(q, kv, req_to_token, rows, prefix_lens, extend_lens, starts, SM_SCALE, out,
                              blocks=blocks, config=config)

        try:
            err = ((call()[-ext:].float() - ref).abs().max() / ref.abs().max()).item()
            us = time_us(call, 1, args.reps, args.dry)
        except Exception as e:  # noqa: BLE001 - a config that does not build or fit here: reported
            log(f"  {model} {shape} {extend_name(config)}: {type(e).__name__}: {str(e)[:300]}")
            continue
        floor = max(floor_bytes_us, floor_flops_us)
        cell = {"model": model, "heads": heads, "shape": shape, "prefix": prefix, "extend": ext, "requests": nreq,
                "config": extend_name(config), "default": config == configs[0], "us": us,
                "floor_bytes_us": floor_bytes_us, "floor_flops_us": floor_flops_us, "x_floor": us / floor,
                "tflops": flops / us / 1e6, "rel_err": err, "valid": err < TOLERANCE}
        save(cell)
        log(f"  {model:<8} {shape:<19} {extend_name(config):<13}{'*' if cell['default'] else ' '} {us:10.1f} us  "
            f"bytes floor {floor_bytes_us:8.1f}  compute floor {floor_flops_us:9.1f}  ({cell['x_floor']:5.2f}x)  "
            f"{cell['tflops']:6.1f} TFLOPS  err {err:.1e}{'' if cell['valid'] else '  WRONG'}")


def run_extend(args, models: list[str], result: dict, save, in_budget) -> None:
    shapes = [s for s in args.shapes.split(",") if s]
    unknown = sorted(set(shapes) - set(EXTEND_SHAPES))
    if unknown:
        raise SystemExit(f"--shapes: unknown {unknown}; choose from {sorted(EXTEND_SHAPES)}")
    result["tflops"] = args.tflops
    for model in models:
        for shape in shapes:
            prefix, ext, nreq = EXTEND_SHAPES[shape]
            if args.dry:
                prefix, ext, nreq = min(prefix, 40), min(ext, 9), min(nreq, 2)
            extend_shape(model, heads_of(model, args.dry), shape, prefix, ext, nreq, args, save, in_budget)
            if not args.dry:
                torch.cuda.empty_cache()


def heads_of(model: str, dry: bool) -> int:
    return MODELS[model] if not dry else (4 if model == "v2-lite" else 20)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kind", type=Kind, default=Kind.DECODE, choices=list(Kind))
    ap.add_argument("--models", default="v2-lite,v3")
    ap.add_argument("--batches", default="1,32,256", help="decode")
    ap.add_argument("--contexts", default="1024,4096", help="decode")
    ap.add_argument("--sweep", default="", help="decode: 'all' or names of CONFIGS to time beside the default")
    ap.add_argument("--split-factors", default="0.5,2,4", help="decode: the two fastest configs of a case also at "
                    "these multiples of their split count (1..MLA_MAX_SPLITS)")
    ap.add_argument("--kv", default="bf16", choices=sorted(KV_DTYPES), help="decode: the pool's dtype")
    ap.add_argument("--shapes", default=",".join(EXTEND_SHAPES), help="extend: names of EXTEND_SHAPES")
    ap.add_argument("--tflops", type=float, default=989.0, help="extend: the compute floor's rate (H200 dense bf16)")
    ap.add_argument("--bandwidth", type=float, default=4.8e12, help="bytes/s of the floor (H200 HBM3e: 4.8 TB/s)")
    ap.add_argument("--reps", type=int, default=None, help="timed replays (default: decode 20, extend 10)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="no cell starts after it (decode's defaults run first; default: decode 420, extend 150)")
    ap.add_argument("--dry", action="store_true", help="tiny shapes on the CPU (run with TRITON_INTERPRET=1)")
    ap.add_argument("--out", default=None, help="default: $OUT/mla_decode.json or $OUT/mla_extend.json")
    args = ap.parse_args()
    decode = args.kind is Kind.DECODE
    args.reps = 1 if args.dry else args.reps or (20 if decode else 10)
    args.budget_s = args.budget_s if args.budget_s is not None else (420.0 if decode else 150.0)
    models = [m for m in args.models.split(",") if m]
    unknown = sorted(set(models) - set(MODELS))
    if unknown:
        raise SystemExit(f"--models: unknown {unknown}; choose from {sorted(MODELS)}")
    if not args.dry and not torch.cuda.is_available():
        raise SystemExit("needs CUDA (or --dry with TRITON_INTERPRET=1)")
    out_path = Path(args.out or os.path.join(os.environ.get("OUT", "."), f"mla_{args.kind.value}.json"))
    out_path.parent.mkdir(parents=True, exist_ok=True)
    import triton

    rank, rope = (32, 16) if args.dry else (RANK, ROPE)
    result = {"benchmark": f"mla_{args.kind.value}", "command": "python " + " ".join(sys.argv),
              "device": "cpu" if args.dry else "cuda", "gpu": None if args.dry else torch.cuda.get_device_name(),
              "torch": torch.__version__, "triton": triton.__version__, "bandwidth": args.bandwidth,
              "kv_lora_rank": rank, "rope": rope, "cells": []}

    def save(cell: dict | None) -> None:
        if cell is not None:
            result["cells"].append(cell)
        out_path.write_text(json.dumps(result, indent=1))

    t0 = time.perf_counter()

    def in_budget() -> bool:
        if time.perf_counter() - t0 > args.budget_s:
            log(f"budget of {args.budget_s:.0f} s spent: stopping")
            return False
        return True

    (run_decode if decode else run_extend)(args, models, result, save, in_budget)
    save(None)
    log(f"wrote {out_path} ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
