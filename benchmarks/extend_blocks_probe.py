"""The extend kernel's work list against the grid it replaced (issue 20): the serving kernel run over three lists
of (request, query block) entries, Llama-3.1-8B attention shapes (32 query heads, 8 kv heads, head dim 128, bf16),
CUDA-graph timed, one layer:
  grid     what the (head, block, request) grid launched: every request up to the longest prompt's block count,
           request-major; entries past a request's prompt exit at once (the kernel's early return stays for this);
  listed   only the blocks that hold new tokens, request-major (extend_blocks.py, as served);
  heavy    the same, the blocks with the most keys first.
Passes: ShareGPT-like's prefill passes (the peer workload's prompts in order, 8192 tokens a pass), random 1024/512's
(8 prompts of 1024), generated-shared-prefix's (64 requests of 128 new tokens over a 2048-token prefix).

    python benchmarks/extend_blocks_probe.py --out $OUT/extend_blocks.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.decode_ragged_probe import kv_pools  # noqa: E402
from benchmarks.sharegpt_model import lengths  # noqa: E402
from radixlm.runtime.layers.attention.triton_ops.extend_attention import extend_attention  # noqa: E402
from radixlm.runtime.layers.attention.triton_ops.extend_blocks import extend_block_m, extend_blocks  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128


def sharegpt_passes(budget: int = 8192) -> list[list[int]]:
    ins, _ = lengths()
    passes, cur = [], []
    for n in ins:
        if cur and sum(cur) + n > budget:
            passes.append(cur)
            cur = []
        cur.append(n)
    return passes + [cur]


def flops(prefix: list[int], ext: list[int]) -> float:
    return sum(4 * HEAD_DIM * HEADS * (e * p + e * (e + 1) / 2) for p, e in zip(prefix, ext))


def lists(prefix: list[int], ext: list[int]) -> dict[str, list[int]]:
    bm = extend_block_m(max(ext))
    grid = [x for b in range(len(ext)) for m in range(-(-max(ext) // bm)) for x in (b, m)]
    heavy = sorted(((p + min((m + 1) * bm, e), b, m) for b, (p, e) in enumerate(zip(prefix, ext))
                    for m in range(-(-e // bm))), reverse=True)
    return {"grid": grid, "listed": extend_blocks(ext, bm), "heavy": [x for _, b, m in heavy for x in (b, m)]}


def run(name: str, prefix: list[int], ext: list[int]) -> dict:
    dev = "cuda"
    bs, total = len(ext), sum(ext)
    k_buf, v_buf, table = kv_pools([p + e for p, e in zip(prefix, ext)], dev)
    q = torch.randn(total, HEADS, HEAD_DIM, dtype=torch.bfloat16, device=dev)
    rows = torch.arange(bs, device=dev)
    pl = torch.tensor(prefix, device=dev)
    el = torch.tensor(ext, device=dev)
    starts = torch.tensor([sum(ext[:i]) for i in range(bs)], device=dev)
    cell = {"pass": name, "requests": bs, "new_tokens": total, "max_extend": max(ext),
            "tflop": flops(prefix, ext) / 1e12}
    ref = None
    for kind, flat in lists(prefix, ext).items():
        blocks = torch.tensor(flat, dtype=torch.int64, device=dev)
        fn = lambda: extend_attention(q, k_buf, v_buf, table, rows, pl, el, starts, HEAD_DIM ** -0.5,  # noqa: E731
                                      max(ext), blocks=blocks)
        out = fn()
        ref = out if ref is None else ref
        us = triton.testing.do_bench_cudagraph(fn, rep=100) * 1e3
        cell[kind] = {"entries": len(flat) // 2, "us": us, "tflops": cell["tflop"] / us * 1e6,
                      "diff": (out.float() - ref.float()).abs().max().item()}
    print(f"{name:18s} {bs:4d} requests {total:6d} tokens (longest {max(ext):4d}): " + ", ".join(
        f"{k} {cell[k]['us']:7.1f} us ({cell[k]['entries']} entries, {cell[k]['tflops']:.0f} TFLOP/s)"
        for k in ("grid", "listed", "heavy")), flush=True)
    return cell


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="extend_blocks.json")
    args = p.parse_args()
    cells = []
    passes = sharegpt_passes()
    for i in (0, 5, 11, 17, 23):
        if i < len(passes):
            cells.append(run(f"sharegpt pass {i}", [0] * len(passes[i]), passes[i]))
    cells.append(run("random 8 x 1024", [0] * 8, [1024] * 8))
    cells.append(run("prefix 64 x 128", [2048] * 64, [128] * 64))
    sg = [c for c in cells if c["pass"].startswith("sharegpt")]
    if sg:
        base, new = sum(c["grid"]["us"] for c in sg), sum(c["listed"]["us"] for c in sg)
        print(f"ShareGPT passes sampled: grid {base:.0f} us, listed {new:.0f} us a layer: x{base / new:.2f}; "
              f"~{(base - new) * 32 * len(passes) / len(sg) / 1e6:.2f} s over the run's {len(passes)} passes")
    Path(args.out).write_text(json.dumps({"benchmark": "extend_blocks_probe", "gpu": torch.cuda.get_device_name(),
                                          "cells": cells}, indent=1))


if __name__ == "__main__":
    main()
