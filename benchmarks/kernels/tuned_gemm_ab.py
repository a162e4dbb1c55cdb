"""The tuned cuBLASLt GEMMs (layers/tuned_gemm.py) against torch's cuBLAS call, on the 8B model in one process:
engines with and without them alternate (tuned, off, tuned, ...); each measures decode steps as the peer
measurement does ((t257 - t1) / 256 over fresh 512-token prompts) and generates greedy tokens for one fixed set of
prompts, which must be identical across all engines (each tuned entry is bit-identical to cuBLAS's GEMM).

    python benchmarks/kernels/tuned_gemm_ab.py --engines 3 --batches 256 384 --out $OUT/tuned_gemm_ab.json
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.lib.engine import close, decode_steps, greedy, make_engine, timed  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--engines", type=int, default=3, help="engines in turn, tuned first")
    p.add_argument("--batches", type=int, nargs="+", default=[256, 384])
    p.add_argument("--token-rows", type=int, default=320, help="prompts in the token-identity check (one pass size)")
    p.add_argument("--out", default="/tmp/tuned_gemm_ab.json")
    args = p.parse_args()
    from transformers import AutoTokenizer

    from benchmarks.lib.models import model_dir
    from radixlm.bench.datasets import PromptSource

    path = model_dir()
    fixed = PromptSource(AutoTokenizer.from_pretrained(path), random.Random(7))
    token_prompts = [fixed.ids(64) for _ in range(args.token_rows)]
    result = {"benchmark": "tuned_gemm_ab", "gpu": torch.cuda.get_device_name(), "command": " ".join(sys.argv),
              "engines": []}
    reference = None
    for i in range(args.engines):
        tuned = i % 2 == 0
        t0 = time.perf_counter()
        engine = make_engine(path, disable_tuned_gemm=not tuned)
        run = {"tuned": tuned, "startup_s": time.perf_counter() - t0, "steps_ms": {}}
        try:
            src = PromptSource(AutoTokenizer.from_pretrained(path), random.Random(0))
            decode_steps(engine, src, 8, steps=16)  # warm-up
            counts = engine.runner.gemm_choice_counts()
            run["tuned_entries"] = sum(v.get("cublaslt", 0) for keys in counts.values() for v in keys.values())
            _, outs = timed(engine, token_prompts, greedy(32))
            tokens = [o["output_ids"] for o in outs]
            reference = reference or tokens
            run["tokens_identical"] = tokens == reference
            for b in args.batches:
                run["steps_ms"][b] = decode_steps(engine, src, b) * 1e3
        finally:
            close(engine)
        result["engines"].append(run)
        print(f"engine {i} ({'tuned' if tuned else 'cuBLAS'}): start-up {run['startup_s']:.1f} s, tuned layer-GEMMs "
              f"{run['tuned_entries']}, tokens identical {run['tokens_identical']}, steps "
              + ", ".join(f"b{b} {ms:.3f} ms" for b, ms in run["steps_ms"].items()), flush=True)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
