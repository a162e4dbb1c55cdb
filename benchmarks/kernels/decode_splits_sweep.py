"""Issue 56: how one layer's decode attention divides its work at batch 16-64 with the decode-step workload's
contexts (512-token prompts, 257 steps: 512-768 tokens), Llama-3.1-8B heads (32 query, 8 kv, 128 dims), bf16 pool.
Per case, the default path (decode_splits' policy) against the split kernel with 1-4 splits and, up to
DECODE_CHUNK_MAX_ROWS rows, the chunked work list with enough entries for --chunk-programs programs; each in a CUDA
graph (a step replays one), checked against the default's output, next to the pool bytes' floor. A difference of
d us a layer is 32 d us a decode step.

    python benchmarks/kernels/decode_splits_sweep.py [--batches 16 32 48 64] [--contexts 640 768] [--out DIR]

Prints a table and writes decode_splits_sweep.json to --out (default $OUT, else the current directory). --dry: tiny
shapes under TRITON_INTERPRET=1 on the CPU (the script's own check)."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from benchmarks.lib.gpu_timing import graph_us, tree, wall_us  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128


def case(bs: int, ctx: int, device: str, chunk_programs: int, bandwidth: float) -> dict:
    from radixlm.runtime.kernels.attention import decode_splits
    from radixlm.runtime.kernels.attention.decode import decode_attention
    from radixlm.runtime.kernels.attention.decode_work import decode_work_list

    g = torch.Generator(device="cpu").manual_seed(bs * 7919 + ctx)
    slots = bs * ctx + 1
    k_buf = torch.randn(slots, KV_HEADS, HEAD_DIM, generator=g).to(device, torch.bfloat16)
    v_buf = torch.randn(slots, KV_HEADS, HEAD_DIM, generator=g).to(device, torch.bfloat16)
    q = torch.randn(bs, HEADS, HEAD_DIM, generator=g).to(device, torch.bfloat16)
    req_to_token = (1 + torch.arange(bs * ctx, dtype=torch.int32)).view(bs, ctx).to(device)
    rows = torch.arange(bs, dtype=torch.int32, device=device)
    seq_lens = torch.full((bs,), ctx, dtype=torch.int32, device=device)
    scale = HEAD_DIM ** -0.5
    max_len = 131072  # a CUDA graph sizes its splits for the model's context (triton_backend.py)

    def run(**kw):
        return decode_attention(q, k_buf, v_buf, req_to_token, rows, seq_lens, scale, max_len, **kw)

    default_capacity = decode_splits.decode_chunk_capacity(bs, KV_HEADS)
    paths = {"default": {"num_splits": decode_splits.decode_num_splits(max_len, bs, KV_HEADS)}}
    if default_capacity:  # a step builds the work list once for its layers: not timed here
        paths["default"]["work"] = decode_work_list(seq_lens, rows, bs, default_capacity)
    want = run(**paths["default"])
    paths.update({f"split{s}": {"num_splits": s, "chunked": False} for s in (1, 2, 3, 4)})
    saved = decode_splits.DECODE_TARGET_PROGRAMS
    if bs <= decode_splits.DECODE_CHUNK_MAX_ROWS:
        decode_splits.DECODE_TARGET_PROGRAMS = chunk_programs  # this process's kernels only (a benchmark's probe)
        try:
            capacity = decode_splits.decode_chunk_capacity(bs, KV_HEADS)
        finally:
            decode_splits.DECODE_TARGET_PROGRAMS = saved
        if capacity:
            paths[f"chunked{capacity}"] = {"work": decode_work_list(seq_lens, rows, bs, capacity)}
    floor_us = 2 * bs * ctx * KV_HEADS * HEAD_DIM * 2 / bandwidth * 1e6
    row = {"batch": bs, "context": ctx, "floor_us": floor_us,
           "default_path": f"chunked{default_capacity}" if default_capacity else
           f"split{paths['default']['num_splits']}", "us": {}, "max_abs_diff": {}}
    for name, kw in paths.items():
        if name.startswith("chunked"):
            decode_splits.DECODE_TARGET_PROGRAMS = chunk_programs
        try:
            out = run(**kw)
            row["max_abs_diff"][name] = float((out.float() - want.float()).abs().max())
            timer = graph_us if device == "cuda" else wall_us  # one call a replay (the KV differs by the case)
            row["us"][name] = timer(lambda i: run(**kw), 1)
        finally:
            decode_splits.DECODE_TARGET_PROGRAMS = saved
    best = min(row["us"], key=row["us"].get)
    row["best"] = best
    print(f"batch {bs:3d} ctx {ctx:5d} floor {floor_us:6.1f} us  " +
          "  ".join(f"{n} {v:6.1f}" for n, v in row["us"].items()) +
          f"  | best {best} ({row['us']['default'] / row['us'][best]:.2f}x the default's speed; "
          f"default runs {row['default_path']}; max |diff| {max(row['max_abs_diff'].values()):.1e})", flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[16, 32, 48, 64])
    ap.add_argument("--contexts", type=int, nargs="+", default=[640, 768])
    ap.add_argument("--chunk-programs", type=int, default=1024,
                    help="the chunked probe's DECODE_TARGET_PROGRAMS (the default policy's: 256)")
    ap.add_argument("--bandwidth", type=float, default=4.27e12, help="bytes/s of the floor (H200 copy: 4.27 TB/s)")
    ap.add_argument("--dry", action="store_true", help="tiny shapes under the interpreter (the script's own check)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.dry:
        args.batches, args.contexts = [2, 40], [70]
    rows = [case(bs, ctx, device, args.chunk_programs, args.bandwidth)
            for ctx in args.contexts for bs in args.batches]
    result = {"benchmark": "decode attention's split policy at batch 16-64", "device": (
        torch.cuda.get_device_name() if device == "cuda" else "cpu"), "torch": torch.__version__, "tree": tree(),
        "command": " ".join(["benchmarks/kernels/decode_splits_sweep.py", *(argv or sys.argv[1:])]), "rows": rows}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    path = Path(args.out) / "decode_splits_sweep.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
