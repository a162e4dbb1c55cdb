"""Which steps the FP8 few-row kernel (kernels/quant/fp8_gemv.py) should fuse at one row, and at which launch: on
Llama-3.1-8B's decode shapes, each step a one-row pass hands a GEMM (the norm and the rotary epilogue of qkv_proj, the
add-and-norm of gate_up_proj, SiLU-and-mul of down_proj) timed unfused (the step's own kernel, then the kernel at the
tuned table's one-row config, then the rotary kernel) against the kernel with the step fused, at every candidate
launch (BLOCK_N, BLOCK_K, warps; unsplit). Each fused prologue recomputes the row's norm (or reads gate and up) in
every program, so the fused launch's best tile is not the plain one's.

Writes $OUT/fp8_gemv_fused_sweep.json (every cell) and $OUT/quant_gemv_<GPU>.json: the committed table with one entry
(kind fp8_channel / fp8_block, rows 1, "step" naming the fused steps) per shape and step where the best fused launch
beat the unfused steps by the table's margin (quant_tuned.py reads them; a step with no entry runs unfused).

    python3 benchmarks/kernels/fp8_gemv_fused_sweep.py --out $OUT     # ~2-3 min on an H200 (quant_lease.sh fused)
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.lib.gpu_timing import SHAPES, graph_us, within_budget  # noqa: E402
from benchmarks.lib.quant_sweep import BLOCK, MARGIN, Setup, floor_us, rel_err, write_table  # noqa: E402
from radixlm.runtime.kernels.gemm.epilogue import RotaryStore  # noqa: E402
from radixlm.runtime.kernels.quant import quant_tuned, reference as ref  # noqa: E402
from radixlm.runtime.kernels.quant.fp8_gemv import Fp8GemvConfig, fp8_gemv_linear, step_name  # noqa: E402

# (shape, prologue kind or None, rotary epilogue): the one-row steps of a Llama layer (RMSNORM: layer 0's qkv only)
CASES = (("qkv_proj", "rmsnorm", True), ("qkv_proj", "add_rmsnorm", True), ("qkv_proj", None, True),
         ("gate_up_proj", "add_rmsnorm", False), ("down_proj", "silu_mul", False))
CANDIDATES = [(bn, bk, w) for bn in (8, 16, 32) for bk in (512, 1024) for w in (2, 4)]
HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128


def step_inputs(shape: str, kind: str | None, k: int, device: str):
    """x (the step's input), and a fresh-prologue factory (None: no prologue)."""
    from radixlm.runtime.layers.activation import SiluAndMul
    from radixlm.runtime.layers.norm import RMSNorm

    if kind == "silu_mul":
        return torch.randn(1, 2 * k, device=device, dtype=torch.bfloat16), lambda: SiluAndMul().prologue()
    x = torch.randn(1, k, device=device, dtype=torch.bfloat16)
    if kind is None:
        return x, None
    norm = RMSNorm(k, 1e-5).to(device)
    norm.weight.data = (1 + 0.1 * torch.randn(k, device=device)).to(torch.bfloat16)
    res = torch.randn(1, k, device=device, dtype=torch.bfloat16) if kind == "add_rmsnorm" else None
    return x, lambda: norm.prologue(res)


def rotary_store(device: str) -> RotaryStore:
    from radixlm.runtime.cache.memory_pool import TokenToKVPool
    from radixlm.runtime.layers.rotary import get_rope

    pool = TokenToKVPool(64, 1, torch.bfloat16, 1, KV_HEADS, HEAD_DIM, device)
    return RotaryStore(get_rope(HEAD_DIM, 8192, 500000.0), torch.tensor([1000], device=device),
                       torch.tensor([7], device=device), pool.k_buffer[0], pool.v_buffer[0], HEADS * HEAD_DIM,
                       KV_HEADS * HEAD_DIM)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--formats", nargs="*", default=["fp8_channel", "fp8_block"])
    ap.add_argument("--budget-s", type=float, default=240.0)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device, t0 = "cuda", time.perf_counter()
    gpu = torch.cuda.get_device_name()
    setup = Setup(False, device, torch.bfloat16, torch.cuda.get_device_properties(0).multi_processor_count, graph_us,
                  graph_us)
    cells, entries, swept = [], [], set()
    for fmt in args.formats:
        block = BLOCK if fmt == "fp8_block" else None
        for shape, kind, epi in within_budget(CASES, t0, args.budget_s):
            n, k = SHAPES[shape]
            copies = max(2, min(16, -(-600_000_000 // (n * k))))
            ws = [ref.quant_fp8(torch.randn(n, k, device=device) * 0.02, block=block, per_channel=block is None)
                  for _ in range(copies)]
            plain_cfg = quant_tuned.lookup(torch.device(device), fmt, n, k, 1, block[1] if block else 0)
            if plain_cfg is None:
                print(f"{fmt} {shape}: no one-row table entry, skipped", flush=True)
                continue
            x, fresh = step_inputs(shape, kind, k, device)
            store = rotary_store(device) if epi else None

            def unfused(i, x=x, fresh=fresh, store=store, cfg=plain_cfg):
                y = fp8_gemv_linear(fresh().apply(x) if fresh else x, *ws[i], block, None, cfg)
                if store is not None:
                    store.unfused(y)
                return y

            def fused(i, cfg, x=x, fresh=fresh, store=store):
                epilogue = dataclasses.replace(store) if store is not None else None
                return fp8_gemv_linear(x, *ws[i], block, None, cfg, fresh() if fresh else None, epilogue)

            want = unfused(0).clone()
            base_us = graph_us(unfused, copies)
            step = step_name(kind, epi)
            cell = {"format": fmt, "shape": shape, "n": n, "k": k, "step": step, "unfused_us": base_us,
                    "plain_config": dataclasses.asdict(plain_cfg), "floor_us": floor_us(fmt, n, k, 1), "fused": []}
            for bn, bk, w in CANDIDATES:
                cfg = Fp8GemvConfig(bn, bk, 1, w, 1)
                try:
                    err = rel_err(fused(0, cfg), want)
                    row = {"config": dataclasses.asdict(cfg), "rel_err": err}
                    if err > 2e-2:
                        row["error"] = f"rel err {err:.3g}"
                    else:
                        row["us"] = graph_us(lambda i, cfg=cfg: fused(i, cfg), copies)
                except Exception as e:  # noqa: BLE001 - a candidate the kernel refuses is reported, not fatal
                    row = {"config": dataclasses.asdict(cfg), "error": f"{type(e).__name__}: {e}"[:200]}
                cell["fused"].append(row)
            timed = [r for r in cell["fused"] if "us" in r]
            best = min(timed, key=lambda r: r["us"]) if timed else None
            cells.append(cell)
            print(f"{fmt:>11} {shape:>12} {step:>18}: unfused {base_us:7.2f} us, best fused "
                  f"{best['us'] if best else float('nan'):7.2f} at {best['config'] if best else None}", flush=True)
            swept.add((fmt, n, k, 1, block[1] if block else 0, step))
            if best is not None and best["us"] * MARGIN <= base_us:
                entries.append({"kernel": fmt, "n": n, "k": k, "rows": 1, "group": block[1] if block else 0,
                                "step": step, "config": best["config"], "us": round(best["us"], 2),
                                "default_us": round(base_us, 2), "floor_us": round(cell["floor_us"], 2)})
            (out / "fp8_gemv_fused_sweep.json").write_text(json.dumps(
                {"benchmark": "fp8_gemv fused steps at one row", "gpu": gpu, "cells": cells}, indent=1))
    table = write_table(out, setup, gpu, entries, swept, script="benchmarks/kernels/fp8_gemv_fused_sweep.py")
    print(f"{len(entries)} fused entries; wrote {table}", flush=True)


if __name__ == "__main__":
    main()
