"""Can a decode pass overlap its compute-bound GEMMs with its memory-bound attention (issue 20)? At 500-1000 rows
ShareGPT-like's decode passes spend ~20 ms in GEMMs at ~700 TFLOP/s and ~9 ms in attention at ~2.9 TB/s, one after
the other. Split into two micro-batches whose layers run on two streams half a layer apart, one micro-batch's
attention could run beside the other's MLP; the price is reading the weights twice.

Llama-3.1-8B layer kernels as served (cuBLAS GEMMs through F.linear, the package's silu_and_mul, rmsnorm and decode
attention over ShareGPT-like contexts or a uniform one), --layers layers, CUDA-graph timed:
  serial   the whole batch, layer after layer (as served);
  halves   two micro-batches one after the other (the cost of splitting alone);
  streams  the two micro-batches on two streams, free-running;
  stagger  the same, micro-batch B's attention of layer i after A's attention of layer i, A's next layer after B's
           attention (their attention and MLP alternate).

    python benchmarks/overlap_probe.py --out $OUT/overlap_probe.json
    python benchmarks/overlap_probe.py --carveouts 0 16 32 48 --out $OUT/overlap_carveout.json

--sm-targets runs the GEMMs through cuBLASLt (layers/cublaslt.py, the heuristic's first algorithm) with its SM count
target at each value (0: the device's count), a kernel that leaves the other SMs to the other stream's attention:

    python benchmarks/overlap_probe.py --steps 1 60 150 --uniform 256 --sm-targets 0 120 104 88 66 \
        --out $OUT/overlap_sm_targets.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.decode_ragged_probe import make_inputs  # noqa: E402
from benchmarks.sharegpt_model import lengths  # noqa: E402
from radixlm.runtime.layers.attention.triton_ops.decode_attention import decode_attention  # noqa: E402
from radixlm.runtime.layers.cublaslt import CublasLt, LtGemm  # noqa: E402
from radixlm.runtime.layers.fused_kernels import rmsnorm, silu_and_mul  # noqa: E402

HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM = 4096, 14336, 32, 8, 128


class Layer:
    def __init__(self, dev: str):
        w = lambda n, k: torch.randn(n, k, dtype=torch.bfloat16, device=dev) * 0.02  # noqa: E731
        self.qkv, self.o = w((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN), w(HIDDEN, HEADS * HEAD_DIM)
        self.gate_up, self.down = w(2 * INTER, HIDDEN), w(HIDDEN, INTER)
        self.norm = torch.ones(HIDDEN, dtype=torch.bfloat16, device=dev)


class LtLinear:
    """F.linear through cuBLASLt with an SM count target: one LtGemm per (rows, weight shape), with no workspace (the
    two streams share them)."""

    def __init__(self, lt: CublasLt, sm_count: int):
        self.lt, self.sm_count, self.gemms = lt, sm_count, {}

    def __call__(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        key = (x.shape[0], *w.shape)
        gemm = self.gemms.get(key)
        if gemm is None:
            gemm = LtGemm(self.lt, x.shape[0], w.shape[0], w.shape[1], w.dtype, sm_count=self.sm_count)
            self.gemms[key] = gemm
            gemm.candidates = gemm.heuristic()
        return gemm(x.contiguous(), w)


class MicroBatch:
    """One micro-batch's rows: hidden states and its attention inputs (rows [lo, hi) of the batch)."""

    def __init__(self, x, q, k_buf, v_buf, table, rows, lens, max_len):
        self.x, self.q, self.kv = x, q, (k_buf, v_buf, table, rows, lens, max_len)
        self.linear = F.linear

    def attn_part(self, layer: Layer):
        h = rmsnorm(self.x, layer.norm, 1e-5)
        self.linear(h, layer.qkv)  # the projection's cost; the probe's q is fixed
        k_buf, v_buf, table, rows, lens, max_len = self.kv
        o = decode_attention(self.q, k_buf, v_buf, table, rows, lens, HEAD_DIM ** -0.5, max_len, 1)
        self.x = self.x + self.linear(o.view(o.shape[0], -1), layer.o)

    def mlp_part(self, layer: Layer):
        h = rmsnorm(self.x, layer.norm, 1e-5)
        self.x = self.x + self.linear(silu_and_mul(self.linear(h, layer.gate_up)), layer.down)


def run_serial(parts: list[MicroBatch], layers: list[Layer]):
    for mb in parts:
        for layer in layers:
            mb.attn_part(layer)
            mb.mlp_part(layer)


def run_streams(a: MicroBatch, b: MicroBatch, layers: list[Layer], side: torch.cuda.Stream, stagger: bool):
    main = torch.cuda.current_stream()
    side.wait_stream(main)
    a_attn = [torch.cuda.Event() for _ in layers]
    b_attn = [torch.cuda.Event() for _ in layers]
    for i, layer in enumerate(layers):
        if stagger and i:
            main.wait_event(b_attn[i - 1])  # A's attention i after B's attention i - 1 (B's MLP i - 1 beside it)
        a.attn_part(layer)
        a_attn[i].record(main)
        with torch.cuda.stream(side):
            if stagger:
                side.wait_event(a_attn[i])  # B's attention i beside A's MLP i
            b.attn_part(layer)
            b_attn[i].record(side)
        a.mlp_part(layer)
        with torch.cuda.stream(side):
            b.mlp_part(layer)
    main.wait_stream(side)


def bench_us(fn) -> float:
    return triton.testing.do_bench_cudagraph(fn, rep=100) * 1e3


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, nargs="+", default=[1, 60, 150, 250],
                   help="ShareGPT-like's running requests after this many decode steps")
    p.add_argument("--uniform", type=int, nargs="*", default=[256], help="batches of 640-position contexts")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--carveouts", type=int, nargs="+", default=[0],
                   help="SMs cuBLAS leaves free (torch._C._set_sm_carveout_experimental), for the other stream")
    p.add_argument("--sm-targets", type=int, nargs="*", default=[],
                   help="GEMMs through cuBLASLt with this SM count target (0: the device's), instead of carveouts")
    p.add_argument("--out", default="overlap_probe.json")
    args = p.parse_args()
    t0 = time.perf_counter()
    lt = CublasLt("cuda") if args.sm_targets else None
    modes = [("lt", t) for t in args.sm_targets] or [("torch", c) for c in args.carveouts]
    ins, outs = lengths()
    layers = [Layer("cuda") for _ in range(args.layers)]
    side = torch.cuda.Stream()
    cases = [(f"sharegpt step {t}", [i + t for i, o in zip(ins, outs) if o > t]) for t in args.steps]
    cases += [(f"uniform {bs} x 640", [640] * bs) for bs in args.uniform]
    cells = []
    for name, ctx in cases:
        bs = len(ctx)
        q, k_buf, v_buf, table, rows, lens = make_inputs(ctx)
        x = torch.randn(bs, HIDDEN, dtype=torch.bfloat16, device="cuda")
        half = bs // 2

        def mb(lo, hi):
            return MicroBatch(x[lo:hi].clone(), q[lo:hi], k_buf, v_buf, table, rows[lo:hi], lens[lo:hi],
                              max(ctx[lo:hi]))

        whole, a, b = mb(0, bs), mb(0, half), mb(half, bs)
        for kind, value in modes:
            linear = F.linear if kind == "torch" else LtLinear(lt, value)
            for part in (whole, a, b):
                part.linear = linear
            carveout = value if kind == "torch" else 0
            torch._C._set_sm_carveout_experimental(carveout or None)
            cell = {"case": name, "batch": bs, "mean_ctx": sum(ctx) / bs, "layers": args.layers, "carveout": carveout,
                    "sm_target": value if kind == "lt" else None}
            run_serial([whole, a, b], layers)  # descriptors and heuristics before any capture
            run_streams(a, b, layers, side, True)
            torch.cuda.synchronize()
            cell["serial_us"] = bench_us(lambda: run_serial([whole], layers))
            cell["halves_us"] = bench_us(lambda: run_serial([a, b], layers))
            cell["streams_us"] = bench_us(lambda: run_streams(a, b, layers, side, False))
            cell["stagger_us"] = bench_us(lambda: run_streams(a, b, layers, side, True))
            # The two parts alone (whole batch): what perfect overlap would approach.
            cell["attn_part_us"] = bench_us(lambda: [whole.attn_part(layer) for layer in layers])
            cell["mlp_part_us"] = bench_us(lambda: [whole.mlp_part(layer) for layer in layers])
            print(f"{name:22s} bs {bs:4d} {kind} {value:3d}: serial {cell['serial_us'] / args.layers:7.1f} "
                  f"us/layer, halves {cell['halves_us'] / args.layers:7.1f}, streams "
                  f"{cell['streams_us'] / args.layers:7.1f}, stagger {cell['stagger_us'] / args.layers:7.1f} (attn "
                  f"part {cell['attn_part_us'] / args.layers:7.1f}, mlp part {cell['mlp_part_us'] / args.layers:7.1f})",
                  flush=True)
            cells.append(cell)
        torch._C._set_sm_carveout_experimental(None)
        Path(args.out).write_text(json.dumps({"benchmark": "overlap_probe", "gpu": torch.cuda.get_device_name(),
                                              "cells": cells}, indent=1))
        del q, k_buf, v_buf
        torch.cuda.empty_cache()
    print(f"wrote {args.out} after {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
