"""Where a decode step's wall time goes beyond the device's work (issue 20: batch 1 and 256 miss their targets).

For each batch size, the peer measurement ((t257 - t1) / 256 over fresh 512-token prompts), then the same run with a
CUDA event recorded on the stream before and after each pass's launch (Scheduler.launch_batch) and host clocks
around the scheduler's phases. Per decode pass it reports:
  pass_us   device time from the pass's first enqueued work to its last (inputs, graph, sampling, copies)
  gap_us    device time between one pass's end and the next pass's start (the device waiting for the host)
  host_us   the scheduler thread's time per step in: planning, launch, processing results (with its wait for the
            device: the host is ahead when it dominates)
and the wall-clock share neither explains (the run's start and end, spread over the steps).

    python benchmarks/profiling/decode_gaps_gpu.py --batches 1 64 256 --out $OUT/decode_gaps.json
    python benchmarks/profiling/decode_gaps_gpu.py --batches 4 8 --force o_proj=cublas down_proj=cublas   # choices as given
    python benchmarks/profiling/decode_gaps_gpu.py --tiny --batches 1 4   # here, on the CPU (no device events: host only)
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.lib.engine import close, decode_steps, force_choices, greedy, make_engine, timed  # noqa: E402
from benchmarks.lib.profiling import PassClock  # noqa: E402
from radixlm.runtime.kernels.gemm import format_gemm_choices  # noqa: E402


def measure(engine, src, batch: int, steps: int, prompt_len: int) -> dict:
    step_s = decode_steps(engine, src, batch, prompt_len, steps)
    clock = PassClock(engine)
    try:
        wall, _ = timed(engine, [src.ids(prompt_len) for _ in range(batch)], greedy(steps + 1))
    finally:
        clock.detach()
    passes = clock.passes()
    decode = [p for p in passes if not p["prefill"]][2:]  # the first two follow the prefill's own launch pattern
    med = (lambda k: statistics.median(p[k] for p in decode if p[k] is not None)) if decode else (lambda k: None)
    mean = (lambda k: statistics.fmean(p[k] for p in decode if p[k] is not None)) if decode else (lambda k: None)
    row = {"batch": batch, "step_ms": step_s * 1e3, "instrumented_wall_ms": wall * 1e3, "decode_passes": len(decode),
           "pass_us_median": med("pass_us"), "pass_us_mean": mean("pass_us"), "gap_us_median": med("gap_us"),
           "gap_us_mean": mean("gap_us"), "gap_us_max": max((p["gap_us"] for p in decode), default=None),
           "host_us_per_step": {k: v / (steps + 1) * 1e6 for k, v in clock.host.items()},
           "prefill_passes": [p for p in passes if p["prefill"]]}
    if decode:
        row["device_share_of_step"] = (mean("pass_us") + mean("gap_us")) / (step_s * 1e6)
    return row


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batches", type=int, nargs="+", default=[1, 64, 256])
    p.add_argument("--steps", type=int, default=256)
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--out", default="/tmp/decode_gaps.json")
    p.add_argument("--force", nargs="*", default=[], metavar="GEMM=skinny|skinny_mma|cublas",
                   help="8B GEMM (gemv_sweep.SHAPES) whose few-row choice start-up takes as given, at all row counts")
    args = p.parse_args()
    if args.force:
        force_choices(dict(f.split("=") for f in args.force))
    from transformers import AutoTokenizer

    from radixlm import Engine
    from radixlm.bench.datasets import PromptSource

    if args.tiny:
        from benchmarks.lib.models import tiny_model_dir
        path = tiny_model_dir()
        engine = Engine(path, load_format="dummy", dtype="float32", device="cpu", context_length=4096, random_seed=0,
                        max_total_tokens=16384)
        prompt_len, steps = 32, min(args.steps, 16)
    else:
        from benchmarks.lib.models import model_dir
        path = model_dir()
        engine = make_engine(path)
        prompt_len, steps = 512, args.steps
    src = PromptSource(AutoTokenizer.from_pretrained(path), random.Random(0))
    result = {"benchmark": "decode_gaps", "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
              "command": " ".join(["python", *sys.argv]), "forced": args.force, "rows": []}
    try:
        decode_steps(engine, src, 8, prompt_len, steps=16)  # warm-up
        result["gemm_choices"] = engine.runner.gemm_choice_counts()
        print("few-row GEMMs (rows or padded rows: kernel layers):", format_gemm_choices(result["gemm_choices"]), flush=True)
        for b in args.batches:
            row = measure(engine, src, b, steps, prompt_len)
            result["rows"].append(row)
            h = row["host_us_per_step"]
            print(f"batch {b:4d}: step {row['step_ms']:.3f} ms | device pass {row['pass_us_mean'] or 0:.0f} us "
                  f"(median {row['pass_us_median'] or 0:.0f}), gap {row['gap_us_mean'] or 0:.0f} us (median "
                  f"{row['gap_us_median'] or 0:.0f}, max {row['gap_us_max'] or 0:.0f}) | host/step: "
                  + ", ".join(f"{k} {v:.0f}" for k, v in h.items()) + " us", flush=True)
    finally:
        close(engine)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
