"""The decode kernel's split count (issue 20): the serving decode attention (stage 1 + stage 2) at every split count
over the batches a decode pass meets, Llama-3.1-8B attention shapes (32 query heads, 8 kv heads, head dim 128,
bf16), each figure a CUDA-graph replay.

Cells:
  uniform   B requests of `ctx` positions (the decode-step workload of peer-anchors.md: ~640 on average);
  sharegpt  the requests still running at decode step s of the ShareGPT-like workload (1000 requests, lengths of
            radixlm.bench.datasets.sharegpt_like_dataset, seed 1): batch = those with more than s output tokens,
            each over input + s positions (its tail: few requests, long and uneven sequences).
CUDA graphs size the split count from the batch alone (decode_num_splits over the context length), so the cells
report which count wins per batch, and the serving rule's choice beside it.

    python benchmarks/decode_splits_sweep.py --out $OUT/decode_splits_sweep.json     # on a GPU
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gemv_sweep import within_budget, write_cells  # noqa: E402
from radixlm.runtime.layers.attention.triton_ops.decode_attention import decode_attention  # noqa: E402
from radixlm.runtime.layers.attention.triton_ops.decode_splits import decode_num_splits  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
SPLITS = (1, 2, 3, 4, 6, 8, 12, 16)


def sharegpt_lengths(step: int, seed: int = 1, n: int = 1000) -> list[int]:
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        n_in = min(max(int(rng.lognormvariate(4.9, 0.9)), 4), 2048)
        n_out = min(max(int(rng.lognormvariate(4.8, 0.8)), 4), 1024)
        pairs.append((n_in, n_out))
    return [i + step for i, o in pairs if o > step]


def make_inputs(lens: list[int], device: str = "cuda"):
    bs, total = len(lens), sum(lens)
    width = max(lens)
    table = torch.zeros(bs, width, dtype=torch.int32)
    offset = 0
    for b, n in enumerate(lens):  # each request's slots contiguous, requests one after another
        table[b, :n] = torch.arange(offset, offset + n, dtype=torch.int32)
        offset += n
    k_buf = torch.randn(total, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16, device=device)
    v_buf = torch.randn(total, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16, device=device)
    q = torch.randn(bs, HEADS, HEAD_DIM, dtype=torch.bfloat16, device=device)
    rows = torch.arange(bs, device=device)
    seq = torch.tensor(lens, dtype=torch.int64, device=device)
    return q, k_buf, v_buf, table.to(device), rows, seq


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--uniform-batches", type=int, nargs="+", default=[8, 16, 32, 48, 64, 96, 128, 192])
    p.add_argument("--ctx", type=int, default=640)
    p.add_argument("--sharegpt-steps", type=int, nargs="+", default=[150, 300, 450, 600, 800])
    p.add_argument("--budget-s", type=float, default=200)
    p.add_argument("--out", default="decode_splits_sweep.json")
    args = p.parse_args()
    t0 = time.perf_counter()
    cells_in = [("uniform", b, [args.ctx] * b) for b in args.uniform_batches]
    cells_in += [("sharegpt", s, sharegpt_lengths(s)) for s in args.sharegpt_steps]
    cells = []
    scale = HEAD_DIM ** -0.5
    for kind, arg, lens in within_budget(cells_in, t0, args.budget_s):
        q, k_buf, v_buf, table, rows, seq = make_inputs(lens)
        bs, maxlen = len(lens), max(lens)
        kv_bytes = sum(lens) * KV_HEADS * HEAD_DIM * 2 * k_buf.element_size()
        serving = decode_num_splits(131072, bs, KV_HEADS)
        ref = decode_attention(q, k_buf, v_buf, table, rows, seq, scale, maxlen, 1).float()
        cell = {"kind": kind, "arg": arg, "batch": bs, "max_len": maxlen, "mean_len": sum(lens) / bs,
                "kv_bytes": kv_bytes, "serving_splits": serving, "splits": {}}
        for s in sorted(set(SPLITS) | {serving}):
            fn = lambda s=s: decode_attention(q, k_buf, v_buf, table, rows, seq, scale, maxlen, s)  # noqa: E731
            diff = (fn().float() - ref).abs().max().item()
            us = triton.testing.do_bench_cudagraph(fn, rep=60) * 1e3
            cell["splits"][s] = {"us": us, "tb_s": kv_bytes / us / 1e6, "max_abs_diff": diff}
        best = min(cell["splits"], key=lambda s: cell["splits"][s]["us"])
        cell["best"] = best
        row = " ".join(f"{s}:{v['us']:.0f}" for s, v in cell["splits"].items())
        print(f"{kind:8s} {arg:4d} bs {bs:4d} len {cell['mean_len']:6.0f}/{maxlen:5d} serving {serving:2d} "
              f"({cell['splits'][serving]['us']:.1f} us) best {best:2d} ({cell['splits'][best]['us']:.1f} us, "
              f"{cell['splits'][best]['tb_s']:.2f} TB/s) | {row}", flush=True)
        cells.append(cell)
        del q, k_buf, v_buf
        torch.cuda.empty_cache()
        write_cells(args.out, "decode_splits_sweep", cells)
    print(f"wrote {args.out} after {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
