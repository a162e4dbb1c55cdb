"""Does prefetching a weight into L2 while the device waits on small kernels make the next GEMV faster? (issue 20:
at batch 1 the decode step is a chain of weight reads; between qkv_proj and o_proj, rotary, the KV store and decode
attention leave the memory bus idle for ~11 us a layer.)

Each case is a CUDA graph: an L2 flush (a 256 MiB copy), then optionally a prefetch of W (4096 x 4096 bf16, o_proj's
shape), then `gap` tiny kernels (~2 us each), then the skinny GEMV over W; the same graph without the GEMV is the
baseline, so GEMV time = case - baseline. Prefetch kinds: "bulk" (cp.async.bulk.prefetch.L2 over CHUNK-byte ranges,
fire-and-forget), "lines" (prefetch.global.L2 per 128-byte line).

    python benchmarks/l2_prefetch_probe.py --out $OUT/l2_prefetch_probe.json
    python benchmarks/l2_prefetch_probe.py --side --gaps 3 6 9 --shapes o_proj qkv_proj --out $OUT/l2_side.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from radixlm.runtime.layers import skinny_gemm  # noqa: E402


@triton.jit
def _bulk_prefetch(W, n_bytes, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    offs = (tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)).to(tl.int64) * CHUNK
    live = (offs < n_bytes).to(tl.int32)
    size = tl.minimum(n_bytes - offs, CHUNK).to(tl.int32)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $3, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r,r", [W + offs, size, live], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _line_prefetch(W, n_bytes, BLOCK: tl.constexpr):
    offs = (tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)).to(tl.int64) * 128
    live = (offs < n_bytes).to(tl.int32)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0; }",
        "=r,l,r", [W + offs, live], dtype=tl.int32, is_pure=False, pack=1)


def prefetch(kind: str, w: torch.Tensor, chunk: int) -> None:
    b = w.view(-1).view(torch.uint8)
    n = b.numel()
    if kind == "bulk":
        block = 128
        _bulk_prefetch[(triton.cdiv(triton.cdiv(n, chunk), block),)](b, n, CHUNK=chunk, BLOCK=block, num_warps=4)
    elif kind == "lines":
        block = 1024
        _line_prefetch[(triton.cdiv(triton.cdiv(n, 128), block),)](b, n, BLOCK=block, num_warps=4)


def graph_time_us(fn, reps: int = 200) -> float:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    times = []
    for _ in range(5):
        g.replay()
    for _ in range(7):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps // 7):
            g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / (reps // 7))
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="/tmp/l2_prefetch_probe.json")
    p.add_argument("--side", action="store_true", help="prefetch on a second stream, joined before the GEMV")
    p.add_argument("--gaps", type=int, nargs="+", default=[0, 3, 6])
    p.add_argument("--shapes", nargs="+", default=["o_proj", "qkv_proj", "down_proj_half"])
    args = p.parse_args()
    dev = "cuda"
    flush_src = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    flush_dst = torch.empty_like(flush_src)
    tiny = torch.zeros(64, device=dev)
    side = torch.cuda.Stream()
    shapes = {"o_proj": (4096, 4096), "qkv_proj": (6144, 4096), "down_proj_half": (4096, 7168)}
    rows = []
    for name, (n, k) in ((s, shapes[s]) for s in args.shapes):
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
        x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
        for _ in range(3):
            skinny_gemm.skinny_linear(x, w)  # autotune outside the graphs
        torch.cuda.synchronize()
        for gap in args.gaps:
            def body(kind: str | None, chunk: int, gemv: bool, gap=gap, w=w, x=x):
                def fn():
                    flush_dst.copy_(flush_src)
                    main = torch.cuda.current_stream()
                    if kind is not None:
                        side.wait_stream(main)
                        with torch.cuda.stream(side if args.side else main):
                            prefetch(kind, w, chunk)
                    for _ in range(gap):
                        tiny.add_(1.0)
                    if kind is not None:
                        main.wait_stream(side)
                    if gemv:
                        skinny_gemm.skinny_linear(x, w)
                return fn
            base = graph_time_us(body(None, 0, False))
            for kind, chunk in ((None, 0), ("bulk", 4096), ("bulk", 16384), ("bulk", 65536), ("lines", 0)):
                with_gemv = graph_time_us(body(kind, chunk, True))
                without = graph_time_us(body(kind, chunk, False))
                row = {"weight": name, "shape": [n, k], "gap_kernels": gap, "prefetch": kind, "chunk": chunk,
                       "gemv_us": with_gemv - without, "graph_us": with_gemv, "graph_no_gemv_us": without,
                       "graph_base_us": base}
                rows.append(row)
                print(f"{name:15s} gap {gap}: prefetch {str(kind):5s} chunk {chunk:6d}: gemv {row['gemv_us']:6.2f} us "
                      f"(graph {with_gemv:7.2f}, without gemv {without:7.2f}, flush+gap only {base:7.2f})",
                      flush=True)
    Path(args.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "side_stream": args.side,
                                          "command": " ".join(["python", *sys.argv]), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
