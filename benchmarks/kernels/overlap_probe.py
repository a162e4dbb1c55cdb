"""Can a decode pass's memory-bound attention run beside the compute-bound GEMMs of another micro-batch on one GPU?
(issue 56: the random 1024/512 workload's decode passes of ~500 rows spend ~18.8 ms in decode attention, at its bytes
floor, and ~11 ms in GEMMs, compute-bound, one after the other: docs/performance.md, "Where the throughput workloads
go". Two micro-batches of half the rows each, one's attention on one stream beside the other's GEMMs on a second,
could hide the shorter of the two if the GPU runs them side by side.)

Llama-3.1-8B's layer shapes (32 query heads, 8 kv heads, 128 dims, hidden 4096, intermediate 14336), bf16, --layers
distinct copies of the weights and the KV pool (no L2 reuse between layers). Half A: --rows requests of --context
tokens through the Triton decode attention; half B: --rows rows through the layer's four GEMMs (cuBLAS) and
SiLU-and-mul. Each case is a CUDA graph over the layers, replayed --reps times (median):

  attn     A's attention alone              gemm     B's GEMMs alone
  serial   both on one stream, per layer    overlap  A on one stream, B on another (fork and join in the graph)
  overlap_attn_first  the same with the attention's stream at high priority
  gemm_cN / overlap_cN  with cuBLAS held to all but N SMs (torch._C._set_sm_carveout_experimental, --carveouts) and
                        the GEMMs' stream at high priority, so that the attention's programs get the N SMs left over

It prints a table and writes overlap_probe.json: each case's ms per layer, serial / overlap (what overlapping gains)
and serial / max(attn, gemm) (what it could gain at best).

    python benchmarks/kernels/overlap_probe.py [--rows 250] [--context 1280] [--layers 8] [--out DIR]
    python benchmarks/kernels/overlap_probe.py --dry     # tiny shapes on the CPU, Triton's interpreter, no graphs
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

FULL = {"heads": 32, "kv_heads": 8, "head_dim": 128, "hidden": 4096, "inter": 14336}
TINY = {"heads": 4, "kv_heads": 2, "head_dim": 16, "hidden": 64, "inter": 128}


def build_layers(args, shape: dict, device: str):
    """Per layer copy: A's attention inputs (q, pools, the request table) and B's GEMM weights."""
    import torch

    dt = torch.bfloat16
    h, kvh, d = shape["heads"], shape["kv_heads"], shape["head_dim"]
    hidden, inter = shape["hidden"], shape["inter"]
    rows, ctx = args.rows, args.context
    req_to_token = (torch.arange(rows * ctx, device=device, dtype=torch.int64) + 1).view(rows, ctx)
    common = {"req_to_token": req_to_token, "rows": torch.arange(rows, device=device),
              "lens": torch.full((rows,), ctx, device=device, dtype=torch.int64),
              "q": torch.randn(rows, h, d, device=device, dtype=dt),
              "x": torch.randn(rows, hidden, device=device, dtype=dt)}
    layers = []
    for _ in range(args.layers):
        pool = torch.randn(2, rows * ctx + 1, kvh, d, device=device, dtype=dt)
        layers.append({"k": pool[0], "v": pool[1],
                       "qkv": torch.randn((h + 2 * kvh) * d, hidden, device=device, dtype=dt) * 0.02,
                       "o": torch.randn(hidden, h * d, device=device, dtype=dt) * 0.02,
                       "gate_up": torch.randn(2 * inter, hidden, device=device, dtype=dt) * 0.02,
                       "down": torch.randn(hidden, inter, device=device, dtype=dt) * 0.02})
    return common, layers


def attention(common: dict, layer: dict, head_dim: int, ctx: int):
    from radixlm.runtime.kernels.attention import decode_attention

    return decode_attention(common["q"], layer["k"], layer["v"], common["req_to_token"], common["rows"],
                            common["lens"], head_dim ** -0.5, ctx)


def gemms(common: dict, layer: dict):
    import torch.nn.functional as F

    from radixlm.runtime.kernels.elementwise.fused_kernels import silu_and_mul

    x = common["x"]
    F.linear(x, layer["qkv"])
    y = F.linear(x, layer["o"])
    return F.linear(silu_and_mul(F.linear(y, layer["gate_up"])), layer["down"])


def carved(fn, sms: int):
    """fn run with cuBLAS told to leave sms SMs free (read when each GEMM is launched, so a graph keeps it)."""
    import torch

    def run():
        torch._C._set_sm_carveout_experimental(sms)
        try:
            return fn()
        finally:
            torch._C._set_sm_carveout_experimental(None)

    return run


def timed_graph(run_a, run_b, reps: int, streams: str) -> float:
    """ms of one replay of a graph of the layers: run_a(i) / run_b(i) per layer (None: left out); streams 'one'
    (a then b per layer), 'two' (a's chain beside b's), 'two_a_first' or 'two_b_first' (that one's stream at high
    priority)."""
    import torch

    n = len(run_a) if run_a else len(run_b)
    main = torch.cuda.Stream()
    side = torch.cuda.Stream(priority=-1 if streams == "two_a_first" else 0)
    if streams == "two_b_first":
        main = torch.cuda.Stream(priority=-1)
    first = torch.cuda.Stream(priority=-1) if streams == "two_a_first" else main

    def body():
        if streams == "one":
            for i in range(n):
                if run_a:
                    run_a[i]()
                if run_b:
                    run_b[i]()
            return
        start = torch.cuda.current_stream()
        a_stream = first if streams == "two_a_first" else side
        b_stream = main if streams in ("two_a_first", "two_b_first") else torch.cuda.current_stream()
        a_stream.wait_stream(start)
        b_stream.wait_stream(start)
        with torch.cuda.stream(a_stream):
            for i in range(n):
                run_a[i]()
        with torch.cuda.stream(b_stream):
            for i in range(n):
                run_b[i]()
        start.wait_stream(a_stream)
        start.wait_stream(b_stream)

    capture = torch.cuda.Stream()
    capture.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(capture):
        body()  # builds and tunes outside the capture
    torch.cuda.current_stream().wait_stream(capture)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=capture):
        body()
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        graph.replay()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return sorted(times)[len(times) // 2]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=250, help="rows (requests) of each micro-batch")
    p.add_argument("--context", type=int, default=1280, help="tokens of each of A's requests")
    p.add_argument("--layers", type=int, default=8, help="distinct layer copies a graph runs")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--carveouts", default="16,32,48,66", help="SMs kept from cuBLAS in the gemm_cN / overlap_cN cases")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--dry", action="store_true", help="tiny shapes on the CPU (Triton's interpreter), no graphs")
    args = p.parse_args()
    if args.dry:
        os.environ["TRITON_INTERPRET"] = "1"
        args.rows, args.context, args.layers, args.reps = 4, 32, 2, 1
    import torch

    shape = TINY if args.dry else FULL
    device = "cpu" if args.dry else "cuda"
    common, layers = build_layers(args, shape, device)
    run_a = [lambda layer=layer: attention(common, layer, shape["head_dim"], args.context) for layer in layers]
    run_b = [lambda layer=layer: gemms(common, layer) for layer in layers]
    cases = {"attn": (run_a, None, "one"), "gemm": (None, run_b, "one"), "serial": (run_a, run_b, "one"),
             "overlap": (run_a, run_b, "two"), "overlap_attn_first": (run_a, run_b, "two_a_first")}
    carveouts = [int(c) for c in args.carveouts.split(",") if c] if not args.dry else []
    for sms in carveouts:
        run_c = [carved(fn, sms) for fn in run_b]
        cases[f"gemm_c{sms}"] = (None, run_c, "one")
        cases[f"overlap_c{sms}"] = (run_a, run_c, "two_b_first")
    result = {"benchmark": "overlap_probe", "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
              "torch": torch.__version__, "command": " ".join(["python", *sys.argv]), "rows": args.rows,
              "context": args.context, "layers": args.layers, "shape": shape, "ms_per_layer": {}}
    for name, (a, b, streams) in cases.items():
        if args.dry:
            t0 = time.perf_counter()
            for fn in (a or []) + (b or []):
                fn()
            ms = (time.perf_counter() - t0) * 1e3
        else:
            ms = timed_graph(a, b, args.reps, streams)
        result["ms_per_layer"][name] = ms / args.layers
        print(f"{name:20s} {ms / args.layers:8.3f} ms a layer", flush=True)
    t = result["ms_per_layer"]
    result["best_case"] = min((n for n in t if n.startswith("overlap")), key=t.get)
    best = t[result["best_case"]]
    result["gain"] = t["serial"] / best
    result["gain_at_best"] = t["serial"] / max(t["attn"], t["gemm"])
    print(f"serial / {result['best_case']} {result['gain']:.3f}x "
          f"(at best {result['gain_at_best']:.3f}x: serial / max(attn, gemm))")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "overlap_probe.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
