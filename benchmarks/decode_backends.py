"""Decode throughput per attention backend (offline Engine, greedy, EOS ignored):

    python benchmarks/decode_backends.py --model default --device cuda --dtype bfloat16 --backends torch_native triton \\
        --num-prompts 64 --output-len 256 --out benchmarks/results/decode_backends_gpu.json
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import torch

from radixlm import Engine


def run(backend: str, args) -> dict:
    e = Engine(args.model, device=args.device, dtype=args.dtype, attention_backend=backend,
               max_running_requests=args.num_prompts, max_total_tokens=131072, random_seed=0)
    try:
        tok = e.tokenizer
        prompts = [tok.apply_chat_template([{"role": "user", "content": f"Tell me a story about robot number {i}."}],
                                           tokenize=False, add_generation_prompt=True) for i in range(args.num_prompts)]
        e.generate(prompts[:4], {"temperature": 0, "max_new_tokens": 8})
        s0 = dict(e.scheduler.stats)
        t0 = time.perf_counter()
        outs = e.generate(prompts, {"temperature": 0, "max_new_tokens": args.output_len, "ignore_eos": True})
        wall = time.perf_counter() - t0
        passes = e.scheduler.stats["decode_batches"] - s0["decode_batches"]
        tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
        return {"backend": backend, "wall_s": wall, "output_tokens": tokens, "output_tokens_per_s": tokens / wall,
                "decode_passes": passes, "ms_per_decode_pass": 1000 * wall / max(passes, 1),
                "_ids": [o["output_ids"] for o in outs]}
    finally:
        e.shutdown()
        del e
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="default")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--backends", nargs="+", default=["torch_native"])
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--out", default="benchmarks/results/decode_backends.json")
    args = p.parse_args()
    runs = [run(b, args) for b in args.backends]
    for r in runs[1:]:
        r["same_outputs_as_first"] = sum(a == b for a, b in zip(r["_ids"], runs[0]["_ids"]))
        r["speedup_vs_first"] = runs[0]["wall_s"] / r["wall_s"]
    for r in runs:
        r.pop("_ids")
        print(f"{r['backend']:14} {r['wall_s']:7.2f} s {r['output_tokens_per_s']:8.0f} tok/s {r['ms_per_decode_pass']:7.1f} ms/pass "
              f"{r.get('speedup_vs_first', 1.0):5.2f}x same={r.get('same_outputs_as_first', '-')}")
    result = {"benchmark": "decode_backends", "model": args.model, "device": args.device, "dtype": args.dtype,
              "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
              "num_prompts": args.num_prompts, "output_len": args.output_len,
              "command": " ".join(["python", *sys.argv]), "runs": runs}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
