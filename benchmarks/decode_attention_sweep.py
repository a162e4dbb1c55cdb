"""Decode attention alone (issue 20: the decode step at batch 256, where _decode_stage1 takes about half the step):
achieved KV bandwidth of the serving kernel against launch variants of its stage 1, Llama-3.1-8B attention shapes
(32 query heads, 8 kv heads, head dim 128, bfloat16), every row one new query token over `ctx` cached positions.

Variants of stage 1 (this file's kernel, over the package's attend_span walk, so only the launch differs):
  order   "req": grid (request, kv head, split) as served; "head": (kv head, request, split), so the programs that
          run together read the same slots' rows of neighbouring kv heads (one pool row holds every kv head);
  direct  with one split, stage 1 writes the normalized output itself (no stage 2, no partials);
  BLOCK_N, num_warps, num_stages.
KV layouts: "fresh" (each request's prompt contiguous, its decoded tokens interleaved across the batch, as a fresh
decode batch allocates them) and "shuffled" (a random permutation of the pool: after much churn).

    python benchmarks/decode_attention_sweep.py --out $OUT/decode_attention_sweep.json     # on a GPU
    python benchmarks/decode_attention_sweep.py --quick                                     # fewer variants
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

from benchmarks.gemv_sweep import within_budget, write_cells  # noqa: E402
from radixlm.runtime.layers.attention.triton_ops.decode_attention import decode_attention  # noqa: E402
from radixlm.runtime.layers.attention.triton_ops.decode_splits import decode_num_splits  # noqa: E402
from radixlm.runtime.layers.attention.triton_ops.span_attention import attend_span  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128


@triton.jit(do_not_specialize=["num_splits"])
def _stage1_variant(
    Q, K_buf, V_buf, Req_to_token, Req_pool_indices, Seq_lens, Mid_o, Mid_lse, O, sm_scale,
    stride_qb, stride_qh, stride_kbs, stride_kh, stride_vbs, stride_vh, stride_rt,
    stride_mob, stride_moh, stride_mos, stride_mlb, stride_mlh, stride_ob, stride_oh, num_splits,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    HEAD_FIRST: tl.constexpr, DIRECT: tl.constexpr,
):
    if HEAD_FIRST:
        kvh = tl.program_id(0)
        b = tl.program_id(1)
    else:
        b = tl.program_id(0)
        kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(Seq_lens + b)
    row = tl.load(Req_pool_indices + b)
    per_split = tl.cdiv(seq_len.to(tl.int32), num_splits).to(seq_len.dtype)
    start = split * per_split
    end = tl.minimum(start + per_split, seq_len)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, HEAD_DIM)
    h_mask = offs_h < GROUP
    d_mask = offs_d < HEAD_DIM
    heads = kvh * GROUP + offs_h
    q = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :], mask=h_mask[:, None], other=0.0)
    out, lse = attend_span(q, K_buf, V_buf, Req_to_token + row * stride_rt, start, end, kvh, sm_scale,
                           stride_kbs, stride_kh, stride_vbs, stride_vh, offs_d, d_mask,
                           BLOCK_ROWS=BLOCK_H, BLOCK_D=HEAD_DIM, BLOCK_N=BLOCK_N, PRECISION="tf32")
    if DIRECT:
        tl.store(O + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :], out.to(O.dtype.element_ty),
                 mask=h_mask[:, None])
    else:
        tl.store(Mid_o + b * stride_mob + heads[:, None] * stride_moh + split * stride_mos + offs_d[None, :], out,
                 mask=h_mask[:, None])
        tl.store(Mid_lse + b * stride_mlb + heads * stride_mlh + split, lse, mask=h_mask)


def variant(q, k_buf, v_buf, table, rows, lens, scale, splits: int, order: str, direct: bool, block_n: int,
            warps: int, stages: int):
    bs = q.shape[0]
    out = torch.empty_like(q)
    mid_o = torch.empty(bs, HEADS, splits, HEAD_DIM, dtype=torch.float32, device=q.device)
    mid_lse = torch.empty(bs, HEADS, splits, dtype=torch.float32, device=q.device)
    grid = (KV_HEADS, bs, splits) if order == "head" else (bs, KV_HEADS, splits)
    _stage1_variant[grid](
        q, k_buf, v_buf, table, rows, lens, mid_o, mid_lse, out, scale,
        q.stride(0), q.stride(1), k_buf.stride(0), k_buf.stride(1), v_buf.stride(0), v_buf.stride(1), table.stride(0),
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        out.stride(0), out.stride(1), splits,
        GROUP=HEADS // KV_HEADS, HEAD_DIM=HEAD_DIM, BLOCK_H=16, BLOCK_N=block_n, HEAD_FIRST=order == "head",
        DIRECT=direct, num_warps=warps, num_stages=stages)
    if direct:
        return out
    from radixlm.runtime.layers.attention.triton_ops.decode_attention import _decode_stage2

    _decode_stage2[(bs, HEADS)](
        mid_o, mid_lse, out, mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        out.stride(0), out.stride(1), splits, HEAD_DIM=HEAD_DIM, BLOCK_D=HEAD_DIM,
        BLOCK_S=triton.next_power_of_2(splits), num_warps=4)
    return out


def make_inputs(bs: int, ctx: int, layout: str, prompt: int, seed: int = 0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    slots = bs * ctx
    if layout == "shuffled":
        perm = torch.randperm(slots, generator=g)
        table = perm.view(bs, ctx)
    else:  # fresh: prompts contiguous, then one slot per request per step across the batch
        prompt = min(prompt, ctx)
        head = torch.arange(bs * prompt).view(bs, prompt)
        tail = bs * prompt + torch.arange(ctx - prompt).view(-1, 1) * bs + torch.arange(bs).view(1, -1)
        table = torch.cat([head, tail.t()], 1)
    dev = "cuda"
    k_buf = torch.randn(slots, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16, device=dev, generator=None)
    v_buf = torch.randn(slots, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16, device=dev)
    req_to_token = table.to(dev, torch.int32 if slots < 2**31 else torch.int64).contiguous()
    q = torch.randn(bs, HEADS, HEAD_DIM, dtype=torch.bfloat16, device=dev)
    rows = torch.arange(bs, device=dev)
    lens = torch.full((bs,), ctx, dtype=torch.int64, device=dev)
    return q, k_buf, v_buf, req_to_token, rows, lens


def bench_us(fn) -> float:
    return triton.testing.do_bench_cudagraph(fn, rep=60) * 1e3


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256])
    p.add_argument("--ctx", type=int, nargs="+", default=[640, 1280])
    p.add_argument("--layouts", nargs="+", default=["fresh", "shuffled"])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--budget-s", type=float, default=300)
    p.add_argument("--out", default="decode_attention_sweep.json")
    args = p.parse_args()
    t_start = time.perf_counter()
    scale = HEAD_DIM ** -0.5
    configs = list(itertools.product(["req", "head"], [32, 64, 128], [4, 8], [2, 3, 4]))
    if args.quick:
        configs = [c for c in configs if c[1] == 64 and c[2] == 4]
    rows_out = []
    for layout, ctx, bs in within_budget(itertools.product(args.layouts, args.ctx, args.batches), t_start,
                                         args.budget_s):
        q, k_buf, v_buf, table, rows, lens = make_inputs(bs, ctx, layout, 512)
        kv_bytes = bs * ctx * KV_HEADS * HEAD_DIM * 2 * k_buf.element_size()
        graph_splits = decode_num_splits(131072, bs, KV_HEADS)  # CUDA graphs size splits for the context length
        eager_splits = decode_num_splits(ctx, bs, KV_HEADS)
        ref = decode_attention(q, k_buf, v_buf, table, rows, lens, scale, ctx, graph_splits)
        cell = {"layout": layout, "ctx": ctx, "batch": bs, "kv_bytes": kv_bytes, "graph_splits": graph_splits,
                "eager_splits": eager_splits, "variants": []}
        base_us = bench_us(lambda: decode_attention(q, k_buf, v_buf, table, rows, lens, scale, ctx, graph_splits))
        cell["serving_us"] = base_us
        cell["serving_tb_s"] = kv_bytes / base_us / 1e6
        print(f"{layout:8s} ctx {ctx:5d} bs {bs:4d} splits {graph_splits:2d}: serving {base_us:8.1f} us "
              f"{cell['serving_tb_s']:.2f} TB/s", flush=True)
        split_choices = sorted({graph_splits, eager_splits, max(1, graph_splits // 2), graph_splits * 2} & set(range(1, 33)))
        for (order, block_n, warps, stages), splits in itertools.product(configs, split_choices):
            for direct in ([False, True] if splits == 1 else [False]):
                try:
                    fn = lambda: variant(q, k_buf, v_buf, table, rows, lens, scale, splits, order, direct,  # noqa: E731
                                         block_n, warps, stages)
                    err = (fn().float() - ref.float()).abs().max().item()
                    us = bench_us(fn)
                except Exception as exc:  # a config that does not fit (shared memory) is reported, not fatal
                    cell["variants"].append({"order": order, "block_n": block_n, "warps": warps, "stages": stages,
                                             "splits": splits, "direct": direct, "error": repr(exc)[:200]})
                    continue
                cell["variants"].append({"order": order, "block_n": block_n, "warps": warps, "stages": stages,
                                         "splits": splits, "direct": direct, "us": us,
                                         "tb_s": kv_bytes / us / 1e6, "vs_serving": base_us / us,
                                         "max_abs_diff": err})
        ok = [v for v in cell["variants"] if "us" in v]
        ok.sort(key=lambda v: v["us"])
        for v in ok[:5]:
            print(f"    {v['order']:4s} N{v['block_n']:<3d} w{v['warps']} s{v['stages']} splits {v['splits']:2d} "
                  f"direct {int(v['direct'])}: {v['us']:8.1f} us {v['tb_s']:.2f} TB/s x{v['vs_serving']:.3f} "
                  f"(diff {v['max_abs_diff']:.1e})", flush=True)
        rows_out.append(cell)
        del q, k_buf, v_buf
        torch.cuda.empty_cache()
        write_cells(args.out, "decode_attention_sweep", rows_out)
    print(f"wrote {args.out} after {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    main()
