"""Decode attention, radixlm's Triton kernel against FlashInfer's (issue 56's invitation: a well-kept kernel library
may become the default on Hopper where it wins a measured A/B; issue 50's FP8 KV target), Llama-3.1-8B's heads (32
query, 8 kv, 128 dims), a bf16 and a float8 e4m3 pool, each case next to its bytes floor:

- ours: decode_attention at the tree's defaults (DECODE_DEFAULT_VARIANTS, the split rule);
- flashinfer_cuda / flashinfer_tc: BatchDecodeWithPagedKVCacheWrapper over the same pool as pages of one token
  (NHD, the pool's [slots, kv heads, dims] viewed as [slots, 1, kv heads, dims]), on CUDA cores and on tensor cores.

Every kernel runs inside a CUDA graph (gpu_timing.graph_us: no launch gaps, as the runtime replays it); FlashInfer's
plan() runs once per case outside it. Each output is checked against ours (max |diff| over the largest |value|).

    python benchmarks/kernels/flashinfer_decode_ab.py [--cases 64x8192,...] [--out DIR]

FlashInfer is not a dependency: on the device, `. benchmarks/lib/flashinfer_site.sh install` first (its JIT compiles
each kernel on first use: build_s in the rows). Prints a table and writes flashinfer_decode_ab.json to --out."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from benchmarks.lib.gpu_timing import graph_us  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
KV_DTYPES = {"bf16": torch.bfloat16, "fp8_e4m3": torch.float8_e4m3fn}


def flashinfer_call(bs: int, ctx: int, q, k_buf, v_buf, scale: float, tensor_cores: bool):
    import flashinfer

    device = q.device
    workspace = torch.zeros(256 << 20, dtype=torch.uint8, device=device)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=tensor_cores)
    indptr = torch.arange(bs + 1, device=device, dtype=torch.int32) * ctx
    indices = torch.arange(bs * ctx, device=device, dtype=torch.int32) + 1  # slot 0 is the pool's padding slot
    last = torch.ones(bs, device=device, dtype=torch.int32)
    wrapper.plan(indptr, indices, last, HEADS, KV_HEADS, HEAD_DIM, 1, q_data_type=q.dtype,
                 kv_data_type=k_buf.dtype, sm_scale=HEAD_DIM**-0.5)
    cache = (k_buf.unsqueeze(1), v_buf.unsqueeze(1))
    out = torch.empty_like(q)
    scales = {} if k_buf.dtype == q.dtype else {"k_scale": scale, "v_scale": scale}
    return lambda: wrapper.run(q, cache, out=out, **scales)


def ours_call(bs: int, ctx: int, q, k_buf, v_buf, scale: float):
    from radixlm.runtime.kernels.attention import decode_attention

    device = q.device
    req_to_token = (torch.arange(bs * ctx, device=device, dtype=torch.int64) + 1).view(bs, ctx)
    rows = torch.arange(bs, device=device)
    lens = torch.full((bs,), ctx, device=device, dtype=torch.int64)
    return lambda: decode_attention(q, k_buf, v_buf, req_to_token, rows, lens, HEAD_DIM**-0.5, ctx,
                                    k_scale=scale, v_scale=scale)


def run_case(bs: int, ctx: int, kv: str, bandwidth: float, kernels: list[str]) -> list[dict]:
    device = "cuda"
    torch.manual_seed(0)
    dtype = KV_DTYPES[kv]
    q = torch.randn(bs, HEADS, HEAD_DIM, device=device, dtype=torch.bfloat16)
    k_buf = (torch.randn(bs * ctx + 1, KV_HEADS, HEAD_DIM, device=device, dtype=torch.bfloat16)).to(dtype)
    v_buf = (torch.randn(bs * ctx + 1, KV_HEADS, HEAD_DIM, device=device, dtype=torch.bfloat16)).to(dtype)
    scale = 1.0 if kv == "bf16" else 0.5
    nbytes = 2 * k_buf.numel() * k_buf.element_size()
    floor_ms = nbytes / bandwidth * 1e3
    rows, ref = [], None
    for name in kernels:
        t0 = time.perf_counter()
        try:
            if name == "ours":
                fn = ours_call(bs, ctx, q, k_buf, v_buf, scale)
            else:
                fn = flashinfer_call(bs, ctx, q, k_buf, v_buf, scale, tensor_cores=name == "flashinfer_tc")
            got = fn().float()
            torch.cuda.synchronize()
            build_s = time.perf_counter() - t0
            ms = graph_us(lambda i: fn(), 4) / 1e3
        except Exception as e:  # a kernel that does not build or run here: reported, the others go on
            print(f"{name} {kv} bs {bs} ctx {ctx}: {type(e).__name__}: {str(e)[:300]}", flush=True)
            continue
        ref = got if ref is None else ref
        err = ((got - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()
        rows.append({"kernel": name, "kv": kv, "batch": bs, "context": ctx, "ms": ms, "floor_ms": floor_ms,
                     "of_floor": floor_ms / ms, "rel_err_vs_first": err, "build_s": build_s})
        print(f"{name:16s} {kv:9s} bs {bs:<4d} ctx {ctx:<6d} {ms:8.3f} ms  floor {floor_ms:7.3f} "
              f"({floor_ms / ms:.2f} of it)  err {err:.1e}  build {build_s:5.1f} s", flush=True)
    del k_buf, v_buf
    torch.cuda.empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="64x8192,32x1024,256x1024,1x8192", help="BATCHxCONTEXT, comma-separated")
    ap.add_argument("--kv-dtypes", default="fp8_e4m3,bf16")
    ap.add_argument("--kernels", default="ours,flashinfer_cuda,flashinfer_tc")
    ap.add_argument("--bandwidth", type=float, default=4.8e12, help="bytes/s of the floor (H200 HBM3e: 4.8 TB/s)")
    ap.add_argument("--budget-s", type=float, default=400.0, help="no case starts after it")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    import flashinfer
    import triton

    t0 = time.perf_counter()
    result = {"benchmark": "flashinfer_decode_ab", "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": triton.__version__, "flashinfer": flashinfer.__version__, "command": " ".join(sys.argv),
              "bandwidth": args.bandwidth, "rows": []}
    out = Path(args.out) / "flashinfer_decode_ab.json"
    for case in args.cases.split(","):
        bs, ctx = (int(x) for x in case.split("x"))
        for kv in args.kv_dtypes.split(","):
            if time.perf_counter() - t0 > args.budget_s:
                print(f"budget spent: no {kv} {case}", flush=True)
                continue
            result["rows"] += run_case(bs, ctx, kv, args.bandwidth, args.kernels.split(","))
            out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out} ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
