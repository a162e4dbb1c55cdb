"""Where ShareGPT-like's wall time goes by batch size (issue 20: at 726b0a8 the decode steps of 5-32 requests got
0.26-0.37 ms faster, and the no-idle model of the run, benchmarks/sharegpt_model.py, gave 0.16 s less over its
tail, where the run measured 0.02 s less).

One engine (the side-by-side's: Llama-3.1-8B shapes, dummy bf16 weights, defaults), the peer workload (1000 requests,
seed 1) run --runs times with lib.profiling.PassClock attached: CUDA events around each pass's launch. Per bucket of
decode passes by row count it prints and writes the passes, their device time (mean), the device's idle time before
them (mean gap) and the bucket's share of the run; prefill passes likewise. A tail that the host holds up shows as
gaps; one dearer than the decode curve, as pass time. --exclude leaves GEMM kernels out of start-up's few-row choice
(gemm.GemmKernel names), for an A/B against the default in one call.

    python benchmarks/peers/sharegpt_passes.py --runs 2 --out $OUT/sharegpt_passes_default.json
    python benchmarks/peers/sharegpt_passes.py --runs 2 --exclude skinny_mma --out $OUT/sharegpt_passes_nomma.json
    python benchmarks/peers/sharegpt_passes.py --runs 2 --engine-args '{"mixed_chunk": "on"}' --out $OUT/sp_mixed.json
    python benchmarks/peers/sharegpt_passes.py --runs 2 --no-chunked --out $OUT/sp_split.json   # decode attention splits
    python benchmarks/peers/sharegpt_passes.py --tiny --runs 1   # here, on the CPU (no device events: walls only)
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.lib.engine import PEER_SIZES, close, log, make_engine, offline_run  # noqa: E402
from benchmarks.lib.profiling import PassClock  # noqa: E402
from radixlm.bench.datasets import PromptSource, sharegpt_like_dataset  # noqa: E402

BUCKETS = (4, 8, 16, 32, 64, 128, 256, 512, 1024)  # decode passes by rows: up to each bound


def exclude_kernels(names: list[str]) -> None:
    """Start-up's few-row GEMM choice leaves these kernels out (their GEMMs take the others or cuBLAS)."""
    from radixlm.runtime.kernels.gemm import dispatch as gemm

    excluded = {gemm.GemmKernel[n.upper()] for n in names}
    fastest = gemm._fastest

    def without(kernels, *rest):
        kept = {k: fn for k, fn in kernels.items() if k not in excluded}
        return fastest(kept, *rest) if kept else gemm.GemmKernel.CUBLAS

    gemm._fastest = without


def buckets(passes: list[dict]) -> list[dict]:
    rows = []
    groups: dict[str, list[dict]] = {}
    for p in passes:
        key = "prefill" if p["prefill"] else f"<= {next((b for b in BUCKETS if p['rows'] <= b), 'more')}"
        groups.setdefault(key, []).append(p)
    total = sum(p["pass_us"] + (p["gap_us"] or 0.0) for p in passes) or 1.0
    for key in ["prefill"] + [f"<= {b}" for b in BUCKETS] + ["<= more"]:
        ps = groups.get(key)
        if not ps:
            continue
        gaps = [p["gap_us"] for p in ps if p["gap_us"] is not None]
        busy = sum(p["pass_us"] for p in ps)
        idle = sum(gaps)
        rows.append({"bucket": key, "passes": len(ps), "pass_us_mean": busy / len(ps),
                     "gap_us_mean": idle / len(gaps) if gaps else None, "busy_s": busy / 1e6, "idle_s": idle / 1e6,
                     "share": (busy + idle) / total})
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--exclude", nargs="*", default=[], metavar="KERNEL", help="skinny, skinny_mma")
    p.add_argument("--tiny", action="store_true", help="CPU dry run: tiny random Llama, float32, 24 requests")
    p.add_argument("--engine-args", default="{}", help="JSON: server arguments on top of the defaults")
    p.add_argument("--no-chunked", action="store_true", help="decode attention splits at every batch size (A/B)")
    p.add_argument("--out", default="/tmp/sharegpt_passes.json")
    args = p.parse_args()
    engine_args = json.loads(args.engine_args)
    from transformers import AutoTokenizer

    if args.exclude:
        exclude_kernels(args.exclude)
    if args.no_chunked:
        from radixlm.runtime.kernels.attention import decode_splits

        decode_splits.DECODE_CHUNK_MAX_ROWS = 0  # decode_chunk_capacity: 0 at every batch size
    if args.tiny:
        from benchmarks.lib.models import tiny_model_dir
        from radixlm import Engine

        path = tiny_model_dir()
        engine = Engine(path, load_format="dummy", dtype="float32", device="cpu", context_length=4096,
                        random_seed=0, max_total_tokens=16384, **engine_args)
        n, max_in, max_out = 24, 96, 12
    else:
        from benchmarks.lib.models import model_dir

        path = model_dir()
        engine = make_engine(path, **engine_args)
        n, max_in, max_out = PEER_SIZES["sharegpt"]
    result = {"benchmark": "sharegpt_passes", "command": " ".join(["python", *sys.argv]), "excluded": args.exclude,
              "chunked": not args.no_chunked, "engine_args": engine_args,
              "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
              "gemm_choices": engine.runner.gemm_choice_counts(), "runs": []}
    try:
        src = PromptSource(AutoTokenizer.from_pretrained(path), random.Random(0))
        for i in range(args.runs):
            reqs = sharegpt_like_dataset(src, n, seed=1, max_input_len=max_in, max_output_len=max_out)
            clock = PassClock(engine)
            try:
                row = offline_run(engine, reqs, f"sharegpt-like run {i + 1}", mfu=not args.tiny)
            finally:
                clock.detach()
            row["buckets"] = buckets(clock.passes())
            for b in row["buckets"]:
                gap = "-" if b["gap_us_mean"] is None else f"{b['gap_us_mean']:7.1f}"
                log(f"  {b['bucket']:>8}: {b['passes']:5d} passes, pass {b['pass_us_mean']:9.1f} us, gap {gap} us, "
                    f"busy {b['busy_s']:6.2f} s, idle {b['idle_s']:5.2f} s, {b['share']:6.1%} of the device's span")
            result["runs"].append(row)
            Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    finally:
        close(engine)
        if args.tiny:
            shutil.rmtree(path, ignore_errors=True)
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
