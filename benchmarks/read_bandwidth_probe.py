"""The read ceilings under decode attention at batch 256 (issue 20): how fast can a kernel only *read* HBM?

Decode attention at batch 256 reads the KV pool at ~3.0 TB/s (`kernels_h100/decode_attention_sweep_after.json`),
which is what a device-to-device copy moves counting bytes read and written. A copy is not the ceiling of a kernel
that only reads. This probe measures, graph-timed, with no math beyond a running sum:
  contiguous  programs sum BLOCK contiguous bf16 elements each (one block a program, or a persistent grid)
  gather      the decode kernel's access: program (kv head, request) walks its table's slots BLOCK_N at a time and
              reads the 256-byte K row and V row of its kv head at each slot (Llama-3.1-8B: 8 kv heads, head dim 128)
  copy        torch's device-to-device copy (bytes read + written), the reference the README quotes
and the serving decode kernel on the same pool, so the three sit side by side. `--pools slot head` also times the
gather and the serving kernel over a head-major pool ((kv heads, slots, head dim) memory, passed to the kernels as a
(slots, kv heads, head dim) view): a kv head's rows of a request's contiguous slots are then contiguous too.

    python benchmarks/read_bandwidth_probe.py --out $OUT/read_bandwidth_probe.json      # on a GPU, ~2.5 min
    python benchmarks/read_bandwidth_probe.py --skip-contiguous --layouts fresh --pools slot head --budget-s 120
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

from benchmarks.decode_attention_sweep import HEAD_DIM, HEADS, KV_HEADS, make_inputs  # noqa: E402
from benchmarks.gemv_sweep import within_budget, write_cells  # noqa: E402
from radixlm.runtime.layers.attention.triton_ops.decode_attention import decode_attention  # noqa: E402


@triton.jit
def _read_contiguous(X, Out, n, per_prog, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(pid * per_prog, tl.minimum(pid * per_prog + per_prog, n), BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(X + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(Out + pid, tl.sum(acc, 0))


@triton.jit
def _read_gather(K_buf, V_buf, Table, Out, ctx, stride_kbs, stride_kh, stride_rt,
                 HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, STAGES: tl.constexpr):
    kvh = tl.program_id(0)
    b = tl.program_id(1)
    offs_d = tl.arange(0, HEAD_DIM)
    acc = tl.zeros([HEAD_DIM], dtype=tl.float32)
    for n0 in tl.range(0, ctx, BLOCK_N, num_stages=STAGES):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < ctx
        slots = tl.load(Table + b * stride_rt + offs_n, mask=n_mask, other=0)
        ptr = slots[:, None] * stride_kbs + kvh * stride_kh + offs_d[None, :]
        k = tl.load(K_buf + ptr, mask=n_mask[:, None], other=0.0).to(tl.float32)
        v = tl.load(V_buf + ptr, mask=n_mask[:, None], other=0.0).to(tl.float32)
        acc += tl.sum(k, 0) + tl.sum(v, 0)
    tl.store(Out + (b * tl.num_programs(0) + kvh) * HEAD_DIM + offs_d, acc)


def bench_us(fn) -> float:
    return triton.testing.do_bench_cudagraph(fn, rep=100) * 1e3


def contiguous_cells(gib: float, t0: float, budget_s: float) -> list[dict]:
    n = int(gib * 2**30) // 2
    x = torch.randn(n, dtype=torch.bfloat16, device="cuda")
    nbytes = n * 2
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cells = []
    y = torch.empty_like(x)
    us = bench_us(lambda: y.copy_(x))
    cells.append({"kind": "copy", "us": us, "tb_s": 2 * nbytes / us / 1e6})
    del y
    us = bench_us(lambda: torch.amax(x))
    cells.append({"kind": "torch.amax", "us": us, "tb_s": nbytes / us / 1e6})
    for block, warps, waves in within_budget(itertools.product([2048, 4096, 8192], [4, 8, 16], [0, 1, 2, 4, 8]),
                                             t0, budget_s):
        programs = -(-n // block) if waves == 0 else sms * waves
        per_prog = -(-n // programs // block) * block
        programs = -(-n // per_prog)
        out = torch.empty(programs, dtype=torch.float32, device="cuda")
        us = bench_us(lambda: _read_contiguous[(programs,)](x, out, n, per_prog, BLOCK=block, num_warps=warps))
        cells.append({"kind": "contiguous", "block": block, "warps": warps, "waves_per_sm": waves,
                      "programs": programs, "us": us, "tb_s": nbytes / us / 1e6})
    return cells


def gather_cells(bs: int, ctx: int, layout: str, pool: str, t0: float, budget_s: float) -> list[dict]:
    q, k_buf, v_buf, table, rows, lens = make_inputs(bs, ctx, layout, 512)
    if pool == "head":  # the same values, each kv head's slots contiguous; the kernels see (slots, heads, dim) views
        k_buf = k_buf.permute(1, 0, 2).contiguous().permute(1, 0, 2)
        v_buf = v_buf.permute(1, 0, 2).contiguous().permute(1, 0, 2)
    layout = layout if pool == "slot" else f"{layout}/head-major"
    nbytes = bs * ctx * KV_HEADS * HEAD_DIM * 2 * k_buf.element_size()
    us = bench_us(lambda: decode_attention(q, k_buf, v_buf, table, rows, lens, HEAD_DIM ** -0.5, ctx, 1))
    cells = [{"kind": "serving_decode", "layout": layout, "batch": bs, "ctx": ctx, "us": us,
              "tb_s": nbytes / us / 1e6}]
    out = torch.empty(bs * KV_HEADS * HEAD_DIM, dtype=torch.float32, device="cuda")
    for block_n, warps, stages in within_budget(itertools.product([32, 64, 128], [2, 4, 8], [1, 2, 3, 4]),
                                                t0, budget_s):
        try:
            us = bench_us(lambda: _read_gather[(KV_HEADS, bs)](
                k_buf, v_buf, table, out, ctx, k_buf.stride(0), k_buf.stride(1), table.stride(0),
                HEAD_DIM=HEAD_DIM, BLOCK_N=block_n, STAGES=stages, num_warps=warps))
        except Exception as exc:  # a config that does not fit (shared memory) is reported, not fatal
            cells.append({"kind": "gather", "block_n": block_n, "warps": warps, "stages": stages,
                          "error": repr(exc)[:200]})
            continue
        cells.append({"kind": "gather", "layout": layout, "batch": bs, "ctx": ctx, "block_n": block_n,
                      "warps": warps, "stages": stages, "us": us, "tb_s": nbytes / us / 1e6})
    return cells


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--gib", type=float, default=3.0)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--ctx", type=int, default=640)
    p.add_argument("--layouts", nargs="+", default=["fresh", "shuffled"])
    p.add_argument("--pools", nargs="+", choices=["slot", "head"], default=["slot"])
    p.add_argument("--skip-contiguous", action="store_true")
    p.add_argument("--budget-s", type=float, default=200)
    p.add_argument("--out", default="read_bandwidth_probe.json")
    args = p.parse_args()
    t0 = time.perf_counter()
    assert HEADS % KV_HEADS == 0
    cells = [] if args.skip_contiguous else contiguous_cells(args.gib, t0, args.budget_s / 3)
    torch.cuda.empty_cache()
    for layout, pool in itertools.product(args.layouts, args.pools):
        cells += gather_cells(args.batch, args.ctx, layout, pool, t0, args.budget_s)
        torch.cuda.empty_cache()
        write_cells(args.out, "read_bandwidth_probe", cells)
    for kind in ["copy", "torch.amax", "contiguous", "serving_decode", "gather"]:
        for layout in ({c.get("layout") for c in cells if c["kind"] == kind}):
            best = max((c for c in cells if c["kind"] == kind and c.get("layout") == layout and "us" in c),
                       key=lambda c: c["tb_s"], default=None)
            if best:
                cfg = {k: v for k, v in best.items() if k not in ("kind", "us", "tb_s", "layout")}
                print(f"{kind:15s} {layout or '':9s} best {best['tb_s']:.3f} TB/s ({best['us']:.1f} us) {cfg}")
    write_cells(args.out, "read_bandwidth_probe", cells)
    print(f"wrote {args.out} after {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
