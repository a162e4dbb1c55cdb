"""Extend (prefill) attention alone (issue 20: the prefill passes of random 1024/512 and the shared-prefix workload):
the serving kernel against launch and loop variants, Llama-3.1-8B attention shapes (32 query heads, 8 kv heads, head
dim 128, bfloat16), keys gathered through req_to_token as served.

Variants (this file's kernel over the package's _attend_block step, so only the launch and the loop differ; no tree
masks):
  order  "req": grid (request, query block, head) as served; "head": (head, query block, request), so the query
         heads of one kv head run together and share its K/V blocks in L2;
  split  the key loop in two: blocks wholly before the query block's first position without the causal mask, then
         the diagonal blocks with it;
  BLOCK_M, BLOCK_N, num_warps, num_stages.
Workloads: "random" (8 prompts of 1024 new tokens, no prefix), "prefix" (64 requests of 128 new tokens over a
2048-token prefix), "sharegpt" (48 requests of 60-400 new tokens, no prefix).

    python benchmarks/extend_attention_sweep.py --out $OUT/extend_attention_sweep.json     # on a GPU
"""
from __future__ import annotations

import argparse
import itertools
import random
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gemv_sweep import write_cells  # noqa: E402
from radixlm.runtime.layers.attention.triton_ops.extend_attention import _attend_block, extend_attention  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128


@triton.jit
def _extend_variant(
    Q, K_buf, V_buf, O, Req_to_token, Req_pool_indices, Prefix_lens, Extend_lens, Extend_starts, sm_scale,
    stride_qt, stride_qh, stride_kbs, stride_kh, stride_vbs, stride_vh, stride_ot, stride_oh, stride_rt,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HEAD_FIRST: tl.constexpr, SPLIT: tl.constexpr,
):
    if HEAD_FIRST:
        h = tl.program_id(0)
        b = tl.program_id(2)
    else:
        b = tl.program_id(0)
        h = tl.program_id(2)
    mblock = tl.program_id(1)
    ext = tl.load(Extend_lens + b)
    if mblock * BLOCK_M >= ext:
        return
    prefix = tl.load(Prefix_lens + b)
    start = tl.load(Extend_starts + b)
    row = tl.load(Req_pool_indices + b)
    kvh = h // GROUP
    offs_m = mblock * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    m_mask = offs_m < ext
    q = tl.load(Q + (start + offs_m)[:, None] * stride_qt + h * stride_qh + offs_d[None, :], mask=m_mask[:, None],
                other=0.0)
    q_pos = prefix + offs_m
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    key_end = prefix + tl.minimum((mblock + 1) * BLOCK_M, ext)
    table = Req_to_token + row * stride_rt
    d_all = offs_d < HEAD_DIM
    first = key_end * 0
    if SPLIT:  # keys before the block's first query position: every query row sees all of them
        first = (prefix + mblock * BLOCK_M) // BLOCK_N * BLOCK_N
        for n0 in range(0, first, BLOCK_N):
            slots = tl.load(table + n0 + tl.arange(0, BLOCK_N))
            acc, m_i, l_i = _attend_block(q, acc, m_i, l_i, K_buf, V_buf, slots, d_all[None, :], None, kvh, sm_scale,
                                          stride_kbs, stride_kh, stride_vbs, stride_vh, offs_d, PRECISION="tf32",
                                          MASKED=False)
    for n0 in range(first, key_end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < key_end
        slots = tl.load(table + offs_n, mask=n_mask, other=0)
        acc, m_i, l_i = _attend_block(q, acc, m_i, l_i, K_buf, V_buf, slots, n_mask[:, None] & d_all[None, :],
                                      n_mask[None, :] & (offs_n[None, :] <= q_pos[:, None]), kvh, sm_scale,
                                      stride_kbs, stride_kh, stride_vbs, stride_vh, offs_d, PRECISION="tf32",
                                      MASKED=True)
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(O + (start + offs_m)[:, None] * stride_ot + h * stride_oh + offs_d[None, :], out.to(O.dtype.element_ty),
             mask=m_mask[:, None])


def variant(q, k_buf, v_buf, table, rows, prefix, ext, starts, scale, max_ext, order, split, block_m, block_n,
            warps, stages):
    out = torch.empty_like(q)
    bs = rows.shape[0]
    nblocks = triton.cdiv(max_ext, block_m)
    grid = (HEADS, nblocks, bs) if order == "head" else (bs, nblocks, HEADS)
    _extend_variant[grid](
        q, k_buf, v_buf, out, table, rows, prefix, ext, starts, scale,
        q.stride(0), q.stride(1), k_buf.stride(0), k_buf.stride(1), v_buf.stride(0), v_buf.stride(1),
        out.stride(0), out.stride(1), table.stride(0),
        GROUP=HEADS // KV_HEADS, HEAD_DIM=HEAD_DIM, BLOCK_M=block_m, BLOCK_N=block_n, HEAD_FIRST=order == "head",
        SPLIT=split, num_warps=warps, num_stages=stages)
    return out


WORKLOADS = {
    "random": lambda rng: [(0, 1024)] * 8,
    "prefix": lambda rng: [(2048, 128)] * 64,
    "sharegpt": lambda rng: [(0, rng.randrange(60, 400)) for _ in range(48)],
}


def make_inputs(lens, seed=0):
    """lens: [(prefix, extend)]: one slot per position, requests' slots shuffled in pages of 1 over the pool."""
    dev = "cuda"
    total = sum(p + e for p, e in lens)
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(total, generator=g)
    width = max(p + e for p, e in lens)
    table = torch.zeros(len(lens), width, dtype=torch.int32)
    at = 0
    for i, (p, e) in enumerate(lens):
        table[i, : p + e] = perm[at : at + p + e]
        at += p + e
    n = sum(e for _, e in lens)
    k_buf = torch.randn(total, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16, device=dev)
    v_buf = torch.randn(total, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16, device=dev)
    q = torch.randn(n, HEADS, HEAD_DIM, dtype=torch.bfloat16, device=dev)
    prefix = torch.tensor([p for p, _ in lens], device=dev)
    ext = torch.tensor([e for _, e in lens], device=dev)
    starts = torch.tensor([sum(e for _, e in lens[:i]) for i in range(len(lens))], device=dev)
    rows = torch.arange(len(lens), device=dev)
    flops = sum(4 * HEADS * HEAD_DIM * e * (p + (e + 1) / 2) for p, e in lens)
    return q, k_buf, v_buf, table.to(dev), rows, prefix, ext, starts, max(e for _, e in lens), flops


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    p.add_argument("--budget-s", type=float, default=240)
    p.add_argument("--out", default="extend_attention_sweep.json")
    args = p.parse_args()
    t_start = time.perf_counter()
    scale = HEAD_DIM ** -0.5
    configs = [c for c in itertools.product(["req", "head"], [False, True], [64, 128], [32, 64, 128], [4, 8], [2, 3])
               if not (c[2] == 128 and c[3] == 128) and not (c[2] == 128 and c[4] == 4)]
    cells = []
    for name in args.workloads:
        q, k_buf, v_buf, table, rows, prefix, ext, starts, max_ext, flops = make_inputs(
            WORKLOADS[name](random.Random(0)))
        ref = extend_attention(q, k_buf, v_buf, table, rows, prefix, ext, starts, scale, max_ext)
        base_us = triton.testing.do_bench(
            lambda: extend_attention(q, k_buf, v_buf, table, rows, prefix, ext, starts, scale, max_ext), rep=100) * 1e3
        cell = {"workload": name, "flops": flops, "serving_us": base_us, "serving_tflops": flops / base_us / 1e6,
                "variants": []}
        print(f"{name:9s}: serving {base_us:8.1f} us {cell['serving_tflops']:.0f} TFLOP/s", flush=True)
        for order, split, bm, bn, warps, stages in configs:
            if time.perf_counter() - t_start > args.budget_s:
                break
            row = {"order": order, "split": split, "block_m": bm, "block_n": bn, "warps": warps, "stages": stages}
            try:
                fn = lambda: variant(q, k_buf, v_buf, table, rows, prefix, ext, starts, scale, max_ext,  # noqa: E731
                                     order, split, bm, bn, warps, stages)
                row["max_abs_diff"] = (fn().float() - ref.float()).abs().max().item()
                row["us"] = triton.testing.do_bench(fn, rep=100) * 1e3
                row["tflops"] = flops / row["us"] / 1e6
                row["vs_serving"] = base_us / row["us"]
            except Exception as exc:  # a config that does not fit (shared memory) is reported, not fatal
                row["error"] = repr(exc)[:200]
            cell["variants"].append(row)
        ok = sorted((v for v in cell["variants"] if "us" in v), key=lambda v: v["us"])
        for v in ok[:6]:
            print(f"    {v['order']:4s} split {int(v['split'])} M{v['block_m']:<3d} N{v['block_n']:<3d} w{v['warps']} "
                  f"s{v['stages']}: {v['us']:8.1f} us {v['tflops']:4.0f} TFLOP/s x{v['vs_serving']:.3f} "
                  f"(diff {v['max_abs_diff']:.1e})", flush=True)
        cells.append(cell)
        write_cells(args.out, "extend_attention_sweep", cells)
    print(f"wrote {args.out} after {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    main()
