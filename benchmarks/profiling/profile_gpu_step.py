"""Where a decode step's time goes on the GPU: per-kernel device time per step and the idle gap, for Llama-3.1-8B
(bf16, dummy weights) with the default CUDA setup (Triton attention, CUDA graphs, overlap), and with
--deterministic on or both, the same under --enable-deterministic-inference (its batch-invariant GEMM and attention).

For each batch size, B fresh 512-token prompts are generated for 1 token and B others for 1 + STEPS tokens under
torch.profiler; the difference of the two runs, divided by STEPS, is one decode step (prefill cancels out). With
--prefill N, one N-token prompt generated for one token is profiled too (its prefill's kernels).

    python benchmarks/profiling/profile_gpu_step.py --batches 1 64 --out $OUT/profile_gpu_step.json
    python benchmarks/profiling/profile_gpu_step.py --batches 64 256 --prefill 4000 --deterministic both --top 15 \
        --out $OUT/determinism_profile.json

--pdl off (the default) launches every kernel without programmatic dependent launch (RADIXLM_PDL=0,
kernels/pdl.py): with it a kernel's profiled span includes its wait for the kernel before, so the per-kernel times
overlap and do not attribute the step (offline/quant/pdl/profile_with_pdl/: 3,947 us of kernels in a 2,868 us
step); --pdl on profiles the step as served.

--tiny runs the same on the CPU with tiny random-weight shapes (a dry run: the aten ops' CPU time).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.lib.engine import close, force_choices, greedy, make_engine  # noqa: E402
from benchmarks.lib.models import QUANT_FORMATS, quantized_model_dir, tiny_model_dir  # noqa: E402
from benchmarks.lib.profiling import attention_us, kernel_times, pass_clock, step_kernels  # noqa: E402
from radixlm.bench.datasets import PromptSource  # noqa: E402
from radixlm.runtime.kernels.gemm import format_gemm_choices  # noqa: E402


def prefill_kernels(engine, src: PromptSource, tokens: int, top: int) -> dict:
    """One prompt of `tokens` tokens generated for one token: wall, device and attention time, the top kernels."""
    wall, us, calls = kernel_times(engine, [src.ids(tokens)], 1)
    ranked = sorted(us.items(), key=lambda kv: -kv[1])[:top]
    return {"tokens": tokens, "wall_us": wall * 1e6, "gpu_busy_us": sum(us.values()), "attention_us": attention_us(us),
            "kernels": [{"name": n[:120], "us": v, "launches": calls[n]} for n, v in ranked]}


def profile_mode(path: str, src: PromptSource, args, deterministic: bool, quant_args: dict) -> dict:
    kw = {"max_running_requests": args.max_running or max(args.batches),
          "enable_deterministic_inference": deterministic, **quant_args}
    if args.tiny:
        from radixlm import Engine

        engine = Engine(path, load_format="dummy", dtype="bfloat16", device="cpu", random_seed=0, **kw)
    else:
        engine = make_engine(path, **kw)
    mode = {"deterministic": deterministic, "batches": []}
    try:
        engine.generate(input_ids=[src.ids(512) for _ in range(8)], sampling_params=greedy(8))
        if not deterministic:
            mode["gemm_choices"] = engine.runner.gemm_choice_counts()
            print("few-row GEMMs (rows or padded rows: kernel layers):", format_gemm_choices(mode["gemm_choices"]))
        for b in args.batches:
            row = step_kernels(engine, src, b, args.steps, args.top)
            row["pass_clock"] = pc = pass_clock(engine, src, b, args.steps)
            mode["batches"].append(row)
            print(f"deterministic {'on' if deterministic else 'off'}, batch {b}: wall {row['wall_us_per_step']:8.1f} "
                  f"us/step, GPU busy {row['gpu_busy_us_per_step']:8.1f} us (attention "
                  f"{row['attention_us_per_step']:7.1f}), idle {row['idle_us_per_step']:7.1f} us")
            host = {k: round(v, 1) for k, v in pc["host_us_per_step"].items()}
            print(f"   pass clock: {pc['decode_passes']} decode passes, median {pc['pass_us_median']} us, gap before "
                  f"{pc['gap_us_median']} us; host us/step {host}")
            for k in row["kernels"]:
                print(f"   {k['us_per_step']:8.1f} us  x{k['launches_per_step']:5.1f}  {k['name'][:100]}")
        if args.prefill:
            mode["prefill"] = pre = prefill_kernels(engine, src, args.prefill, args.top)
            print(f"deterministic {'on' if deterministic else 'off'}, prefill {args.prefill}: wall "
                  f"{pre['wall_us']:9.1f} us, GPU busy {pre['gpu_busy_us']:9.1f} us (attention "
                  f"{pre['attention_us']:9.1f})")
            for k in pre["kernels"]:
                print(f"   {k['us']:9.1f} us  x{k['launches']:5d}  {k['name'][:100]}")
    finally:
        close(engine)
    return mode


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--max-running", type=int, default=0,
                   help="the engine's max_running_requests (0: the largest of --batches)")
    p.add_argument("--top", type=int, default=14)
    p.add_argument("--prefill", type=int, default=0, metavar="TOKENS", help="also profile one prompt this long")
    p.add_argument("--deterministic", choices=("off", "on", "both"), default="off",
                   help="--enable-deterministic-inference off, on, or both (two engines, off first)")
    p.add_argument("--tiny", action="store_true", help="tiny random shapes on the CPU (a dry run)")
    p.add_argument("--out", default="benchmarks/results/profiling/profile_gpu_step.json")
    p.add_argument("--quant", default="bf16", choices=list(QUANT_FORMATS),
                   help="the weights' (or the KV cache's) format: benchmarks/lib/models.py QUANT_FORMATS")
    p.add_argument("--pdl", choices=("off", "on"), default="off",
                   help="programmatic dependent launch (off: kernel times that add up; on: as served)")
    p.add_argument("--force", nargs="*", default=[], metavar="GEMM=skinny|cublas", help="start-up takes this kernel for these GEMMs instead of measuring (lib.engine.force_choices)")
    args = p.parse_args()
    if min(args.batches) < 1 or args.steps < 1 or args.top < 1 or args.prefill < 0:
        p.error("--batches, --steps and --top must be positive, --prefill at least 0")
    if args.force:
        force_choices(dict(f.split("=") for f in args.force))
    os.environ["RADIXLM_PDL"] = "1" if args.pdl == "on" else "0"  # read at the engine's first launch
    path, quant_args = (tiny_model_dir(), {}) if args.tiny else quantized_model_dir(args.quant)
    from transformers import AutoTokenizer

    src = PromptSource(AutoTokenizer.from_pretrained(path), random.Random(0))
    modes = {"off": [False], "on": [True], "both": [False, True]}[args.deterministic]
    result = {"model": f"Llama-3.1-8B {args.quant} dummy" if not args.tiny else "tiny random Llama (CPU dry run)",
              "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu", "steps": args.steps,
              "command": " ".join(["python", *sys.argv]), "forced": args.force, "pdl": args.pdl,
              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "modes": {}}
    try:
        for deterministic in modes:
            result["modes"]["on" if deterministic else "off"] = profile_mode(path, src, args, deterministic, quant_args)
    finally:
        first = next(iter(result["modes"].values()), {})
        result["batches"] = first.get("batches", [])  # the first mode's steps, where earlier runs put them
        result["gemm_choices"] = first.get("gemm_choices")
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
