"""Where a decode step's time goes on the GPU: per-kernel device time per step and the idle gap, for Llama-3.1-8B
(bf16, dummy weights) with the default CUDA setup (Triton attention, CUDA graphs, overlap).

For each batch size, B fresh 512-token prompts are generated for 1 token and B others for 1 + STEPS tokens under
torch.profiler; the difference of the two runs, divided by STEPS, is one decode step (prefill cancels out).

    python benchmarks/profiling/profile_gpu_step.py --batches 1 64 --out $OUT/profile_gpu_step.json
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.lib.engine import close, force_choices, greedy, make_engine  # noqa: E402
from benchmarks.lib.models import model_dir  # noqa: E402
from benchmarks.lib.profiling import step_kernels  # noqa: E402
from radixlm.bench.datasets import PromptSource  # noqa: E402
from radixlm.runtime.kernels.gemm import format_gemm_choices  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--top", type=int, default=14)
    p.add_argument("--out", default="benchmarks/results/profiling/profile_gpu_step.json")
    p.add_argument("--force", nargs="*", default=[], metavar="GEMM=skinny|cublas", help="start-up takes this kernel for these GEMMs instead of measuring (lib.engine.force_choices)")
    args = p.parse_args()
    if args.force:
        force_choices(dict(f.split("=") for f in args.force))
    path = model_dir()
    from transformers import AutoTokenizer

    src = PromptSource(AutoTokenizer.from_pretrained(path), random.Random(0))
    engine = make_engine(path, max_running_requests=max(args.batches))
    result = {"model": "Llama-3.1-8B bf16 dummy", "gpu": torch.cuda.get_device_name(), "steps": args.steps,
              "command": " ".join(["python", *sys.argv]), "forced": args.force, "batches": []}
    try:
        engine.generate(input_ids=[src.ids(512) for _ in range(8)], sampling_params=greedy(8))
        result["gemm_choices"] = engine.runner.gemm_choice_counts()
        print("few-row GEMMs (rows or padded rows: kernel layers):", format_gemm_choices(result["gemm_choices"]))
        for b in args.batches:
            row = step_kernels(engine, src, b, args.steps, args.top)
            result["batches"].append(row)
            print(f"batch {b}: wall {row['wall_us_per_step']:8.1f} us/step, GPU busy "
                  f"{row['gpu_busy_us_per_step']:8.1f} us, idle {row['idle_us_per_step']:7.1f} us")
            for k in row["kernels"]:
                print(f"   {k['us_per_step']:8.1f} us  x{k['launches_per_step']:5.1f}  {k['name'][:100]}")
    finally:
        close(engine)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
