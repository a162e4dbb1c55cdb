"""Decode attention over ShareGPT-like contexts (issue 20): the workload's decode passes of 256-1000 requests read
~200-position contexts with a few of 2048, where the serving kernel was profiled at ~1.8 TB/s of KV (14.3 ms a pass
of 1000 requests at 33b68b2) against ~3 TB/s on the uniform 640-position batches it was tuned on.

Cells: the running requests of the peer workload (seed 1) after `t` decode steps (every request with more than t
output tokens, context = prompt + t), slots laid out as a fresh batch allocates them (each prompt contiguous).
Timed with CUDA graphs, one layer's attention (Llama-3.1-8B: 32 query heads, 8 kv heads, head dim 128, bfloat16):
  serving   decode_attention as served (graph splits);
  grid      decode_attention_sweep's stage-1 variant over BLOCK_N, warps, stages (one split, direct);
  sorted    the same with the requests ordered longest first (programs of long contexts start first);
  splits    the serving kernel at 1-32 splits;
  chunks    a work list: program (kv head, chunk) over chunks of at most CHUNK positions of one request, partials
            merged per request by a second stage (every program does about the same work).

    python benchmarks/decode_ragged_probe.py --out $OUT/decode_ragged.json

--chunked-ab times the serving kernel as it launches now (chunked passes at small batches: decode_chunk_capacity, the
work list built once beforehand, as a pass builds it once for its layers) against its split launch (chunked=False,
the graphs' split count) over the workload's tail and over uniform batches (2-31 requests x 640 positions, the decode
step's):

    python benchmarks/decode_ragged_probe.py --chunked-ab --steps 500 600 700 800 900 950 --out $OUT/chunked_ab.json
"""
from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.decode_attention_sweep import HEAD_DIM, HEADS, KV_HEADS, bench_us, variant  # noqa: E402
from benchmarks.gemv_sweep import within_budget, write_cells  # noqa: E402
from benchmarks.sharegpt_model import lengths  # noqa: E402
from radixlm.runtime.layers.attention.triton_ops.decode_attention import decode_attention  # noqa: E402
from radixlm.runtime.layers.attention.triton_ops.decode_splits import (  # noqa: E402
    decode_chunk_capacity, decode_num_splits)
from radixlm.runtime.layers.attention.triton_ops.decode_work import decode_work_list  # noqa: E402
from radixlm.runtime.layers.attention.triton_ops.span_attention import attend_span  # noqa: E402


@triton.jit
def _chunk_stage1(Q, K_buf, V_buf, Req_to_token, Req_pool_indices, Chunk_req, Chunk_start, Chunk_end, Mid_o, Mid_lse,
                  sm_scale, stride_qb, stride_qh, stride_kbs, stride_kh, stride_vbs, stride_vh, stride_rt,
                  GROUP: tl.constexpr, NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr,
                  BLOCK_N: tl.constexpr):
    kvh = tl.program_id(0)
    c = tl.program_id(1)
    b = tl.load(Chunk_req + c)
    start = tl.load(Chunk_start + c)
    end = tl.load(Chunk_end + c)
    row = tl.load(Req_pool_indices + b)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, HEAD_DIM)
    h_mask = offs_h < GROUP
    heads = kvh * GROUP + offs_h
    q = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :], mask=h_mask[:, None], other=0.0)
    out, lse = attend_span(q, K_buf, V_buf, Req_to_token + row * stride_rt, start, end, kvh, sm_scale,
                           stride_kbs, stride_kh, stride_vbs, stride_vh, offs_d, offs_d < HEAD_DIM,
                           BLOCK_ROWS=BLOCK_H, BLOCK_D=HEAD_DIM, BLOCK_N=BLOCK_N, PRECISION="tf32")
    tl.store(Mid_o + (c * NUM_HEADS + heads[:, None]) * HEAD_DIM + offs_d[None, :], out, mask=h_mask[:, None])
    tl.store(Mid_lse + c * NUM_HEADS + heads, lse, mask=h_mask)


@triton.jit
def _chunk_stage2(Mid_o, Mid_lse, First_chunk, O, stride_ob, stride_oh, NUM_HEADS: tl.constexpr,
                  HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    c0 = tl.load(First_chunk + b)
    c1 = tl.load(First_chunk + b + 1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, HEAD_DIM)
    s_mask = offs_s < c1 - c0
    lse = tl.load(Mid_lse + (c0 + offs_s) * NUM_HEADS + h, mask=s_mask, other=float("-inf"))
    m = tl.max(lse, 0)
    w = tl.where(s_mask, tl.exp(lse - m), 0.0)
    parts = tl.load(Mid_o + ((c0 + offs_s) * NUM_HEADS + h)[:, None] * HEAD_DIM + offs_d[None, :],
                    mask=s_mask[:, None], other=0.0)
    out = tl.sum(parts * w[:, None], 0) / tl.sum(w, 0)
    tl.store(O + b * stride_ob + h * stride_oh + offs_d, out.to(O.dtype.element_ty))


def chunk_plan(lens: list[int], chunk: int, dev: str):
    reqs, starts, ends, first = [], [], [], [0]
    for b, n in enumerate(lens):
        for s in range(0, n, chunk):
            reqs.append(b)
            starts.append(s)
            ends.append(min(n, s + chunk))
        first.append(len(reqs))
    mk = lambda v: torch.tensor(v, dtype=torch.int32, device=dev)  # noqa: E731
    return mk(reqs), mk(starts), mk(ends), mk(first), max(b - a for a, b in zip(first, first[1:]))


def chunked(q, k_buf, v_buf, table, rows, plan, scale, block_n: int, warps: int, stages: int):
    creq, cstart, cend, first, most = plan
    n = creq.shape[0]
    mid_o = torch.empty(n, HEADS, HEAD_DIM, dtype=torch.float32, device=q.device)
    mid_lse = torch.empty(n, HEADS, dtype=torch.float32, device=q.device)
    _chunk_stage1[(KV_HEADS, n)](
        q, k_buf, v_buf, table, rows, creq, cstart, cend, mid_o, mid_lse, scale,
        q.stride(0), q.stride(1), k_buf.stride(0), k_buf.stride(1), v_buf.stride(0), v_buf.stride(1), table.stride(0),
        GROUP=HEADS // KV_HEADS, NUM_HEADS=HEADS, HEAD_DIM=HEAD_DIM, BLOCK_H=16, BLOCK_N=block_n, num_warps=warps,
        num_stages=stages)
    out = torch.empty_like(q)
    _chunk_stage2[(q.shape[0], HEADS)](mid_o, mid_lse, first, out, out.stride(0), out.stride(1), NUM_HEADS=HEADS,
                                       HEAD_DIM=HEAD_DIM, BLOCK_S=triton.next_power_of_2(most), num_warps=4)
    return out


def kv_pools(lens: list[int], dev: str = "cuda"):
    """(k_buf, v_buf, req_to_token): request b's positions in slots of its own, contiguous, after request b - 1's."""
    width = max(lens)
    table = torch.zeros(len(lens), width, dtype=torch.int32)
    off = 0
    for b, n in enumerate(lens):
        table[b, :n] = torch.arange(off, off + n, dtype=torch.int32)
        off += n
    k_buf = torch.randn(off, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16, device=dev)
    v_buf = torch.randn(off, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16, device=dev)
    return k_buf, v_buf, table.to(dev)


def make_inputs(ctx: list[int], dev: str = "cuda"):
    """Each request's prompt contiguous (the decoded positions too: close enough for the read pattern)."""
    k_buf, v_buf, table = kv_pools(ctx, dev)
    q = torch.randn(len(ctx), HEADS, HEAD_DIM, dtype=torch.bfloat16, device=dev)
    rows = torch.arange(len(ctx), device=dev)
    lens = torch.tensor(ctx, dtype=torch.int64, device=dev)
    return q, k_buf, v_buf, table, rows, lens


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, nargs="+", default=[1, 60, 150])
    p.add_argument("--budget-s", type=float, default=200)
    p.add_argument("--out", default="decode_ragged.json")
    p.add_argument("--chunked-ab", action="store_true", help="the chunked launch against the split launch")
    args = p.parse_args()
    t0 = time.perf_counter()
    ins, outs = lengths()
    scale = HEAD_DIM ** -0.5
    if args.chunked_ab:
        chunked_ab(args, ins, outs, scale, t0)
        return
    cells = []
    for t in within_budget(args.steps, t0, args.budget_s):
        ctx = [i + t for i, o in zip(ins, outs) if o > t]
        bs = len(ctx)
        q, k_buf, v_buf, table, rows, lens = make_inputs(ctx)
        kv_bytes = sum(ctx) * KV_HEADS * HEAD_DIM * 2 * k_buf.element_size()
        splits = decode_num_splits(131072, bs, KV_HEADS)
        ref = decode_attention(q, k_buf, v_buf, table, rows, lens, scale, max(ctx), splits).float()
        base = bench_us(lambda: decode_attention(q, k_buf, v_buf, table, rows, lens, scale, max(ctx), splits))
        cell = {"step": t, "batch": bs, "mean_ctx": sum(ctx) / bs, "max_ctx": max(ctx), "kv_bytes": kv_bytes,
                "serving_us": base, "serving_tb_s": kv_bytes / base / 1e6, "variants": []}
        print(f"step {t:4d}: {bs} requests, mean ctx {cell['mean_ctx']:.0f}, max {max(ctx)}: serving {base:8.1f} us "
              f"{cell['serving_tb_s']:.2f} TB/s", flush=True)
        order = sorted(range(bs), key=lambda b: -ctx[b])
        perm = torch.tensor(order, device="cuda")
        s_q, s_rows, s_lens, s_ref = q[perm].contiguous(), rows[perm], lens[perm], ref[perm]
        for kind, block_n, warps, stages in itertools.product(["grid", "sorted"], [32, 64, 128], [4, 8], [2, 3, 4]):
            qq, r, ln, rr = (q, rows, lens, ref) if kind == "grid" else (s_q, s_rows, s_lens, s_ref)
            fn = lambda: variant(qq, k_buf, v_buf, table, r, ln, scale, 1, "head", True,  # noqa: E731
                                 block_n, warps, stages)
            cell["variants"].append(measure(fn, rr, kv_bytes, base,
                                            kind=kind, block_n=block_n, warps=warps, stages=stages))
        for chunk, block_n, warps, stages in itertools.product([128, 256, 512], [64, 128], [4, 8], [2, 3]):
            if block_n > chunk:
                continue
            plan = chunk_plan(ctx, chunk, "cuda")
            fn = lambda: chunked(q, k_buf, v_buf, table, rows, plan, scale, block_n, warps, stages)  # noqa: E731
            cell["variants"].append(measure(fn, ref, kv_bytes, base, kind="chunks", chunk=chunk, block_n=block_n,
                                            warps=warps, stages=stages, programs=plan[0].shape[0] * KV_HEADS))
        for n in (1, 2, 4, 8, 16, 32):  # the serving kernel at other split counts (a tail of few long requests)
            fn = lambda: decode_attention(q, k_buf, v_buf, table, rows, lens, scale, max(ctx), n)  # noqa: E731
            cell["variants"].append(measure(fn, ref, kv_bytes, base, kind="splits", splits=n))
        ok = sorted((v for v in cell["variants"] if "us" in v), key=lambda v: v["us"])
        for kind in ("grid", "sorted", "chunks", "splits"):
            for v in [v for v in ok if v["kind"] == kind][:3]:
                print("    " + " ".join(f"{k} {v[k]}" for k in v if k not in ("us", "tb_s", "vs_serving", "diff"))
                      + f": {v['us']:8.1f} us {v['tb_s']:.2f} TB/s x{v['vs_serving']:.3f} (diff {v['diff']:.1e})",
                      flush=True)
        cells.append(cell)
        del q, k_buf, v_buf
        torch.cuda.empty_cache()
        write_cells(args.out, "decode_ragged_probe", cells)
    print(f"wrote {args.out} after {time.perf_counter() - t0:.0f} s")


def chunked_ab(args, ins: list[int], outs: list[int], scale: float, t0: float) -> None:
    cases = [(f"sharegpt step {t}", [i + t for i, o in zip(ins, outs) if o > t]) for t in args.steps]
    cases += [(f"uniform {bs} x 640", [640] * bs) for bs in (2, 4, 8, 16, 24, 31)]
    cells = []
    for name, ctx in within_budget(cases, t0, args.budget_s):
        bs = len(ctx)
        q, k_buf, v_buf, table, rows, lens = make_inputs(ctx)
        kv_bytes = sum(ctx) * KV_HEADS * HEAD_DIM * 2 * k_buf.element_size()
        splits = decode_num_splits(131072, bs, KV_HEADS)
        ref = dense_reference(q, k_buf, v_buf, table, rows, lens, scale)
        split_fn = lambda: decode_attention(q, k_buf, v_buf, table, rows, lens, scale, max(ctx), splits,  # noqa: E731
                                            chunked=False)
        capacity = decode_chunk_capacity(bs, KV_HEADS)
        work = decode_work_list(lens, rows, bs, capacity) if capacity else None  # built once a pass, as served
        chunk_fn = lambda: decode_attention(q, k_buf, v_buf, table, rows, lens, scale, max(ctx), splits,  # noqa: E731
                                            work=work)
        base = bench_us(split_fn)
        cell = {"case": name, "batch": bs, "mean_ctx": sum(ctx) / bs, "max_ctx": max(ctx), "kv_bytes": kv_bytes,
                "chunks": capacity, "split": measure(split_fn, ref, kv_bytes, base),
                "chunked": measure(chunk_fn, ref, kv_bytes, base)}
        a, b = cell["split"], cell["chunked"]
        print(f"{name:22s} {bs:3d} requests, mean ctx {cell['mean_ctx']:6.0f}, max {max(ctx):5d}, list "
              f"{cell['chunks']:3d}: split {a['us']:7.1f} us {a['tb_s']:.2f} TB/s (diff {a['diff']:.1e}), chunked "
              f"{b['us']:7.1f} us {b['tb_s']:.2f} TB/s (diff {b['diff']:.1e}) x{b['vs_serving']:.3f}", flush=True)
        cells.append(cell)
        del q, k_buf, v_buf
        torch.cuda.empty_cache()
        write_cells(args.out, "decode_chunked_ab", cells)
    print(f"wrote {args.out} after {time.perf_counter() - t0:.0f} s")


def dense_reference(q, k_buf, v_buf, table, rows, lens, scale):
    """Dense float32 attention per request (the accuracy both launches are held to)."""
    out = []
    group = HEADS // KV_HEADS
    for i in range(q.shape[0]):
        slots = table[rows[i], : int(lens[i])].long()
        k = k_buf[slots].float().repeat_interleave(group, dim=1)
        v = v_buf[slots].float().repeat_interleave(group, dim=1)
        s = torch.einsum("hd,nhd->hn", q[i].float(), k) * scale
        out.append(torch.einsum("hn,nhd->hd", s.softmax(-1), v))
    return torch.stack(out)


def measure(fn, ref, kv_bytes: int, base: float, **desc) -> dict:
    try:
        diff = (fn().float() - ref).abs().max().item()
        us = bench_us(fn)
    except Exception as exc:  # a config that does not fit (shared memory) is reported, not fatal
        return {**desc, "error": repr(exc)[:200]}
    return {**desc, "us": us, "tb_s": kv_bytes / us / 1e6, "vs_serving": base / us, "diff": diff}


if __name__ == "__main__":
    main()
