"""The shared-prefix decode kernel's launch at the generated-shared-prefix workload's decode shape (issue 56: its
decode passes spend ~7 ms a pass in _shared_prefix_stage1, ~2.3 TB/s): 32 groups of 32 requests over 2048-token
prefixes plus 160-token suffixes, Llama-3.1-8B's heads (32 query, 8 kv, 128 dims), bf16, one layer.

Times (CUDA graphs, gpu_timing.graph_us) the whole decode_attention at the tree's defaults, then the prefix stage
alone per launch config: BLOCK_M (the rows of a tile: BLOCK_M / 4 requests, so the prefix is read once per tile),
BLOCK_N, warps, pipeline stages and prefix splits, each checked against the default's partials (the merged output
of both is the same attention), next to its bytes floor (each tile's prefix K and V read once).

    python benchmarks/kernels/shared_prefix_probe.py [--out DIR]

Prints a table and writes shared_prefix_probe.json to --out (default $OUT, else the current directory)."""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import triton  # noqa: E402

from benchmarks.lib.gpu_timing import graph_us  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
GROUP = HEADS // KV_HEADS


def build(groups: int, rows: int, prefix: int, suffix: int, device: str):
    bs = groups * rows
    slots = groups * prefix + bs * suffix + 1
    k = torch.randn(slots, KV_HEADS, HEAD_DIM, device=device, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    rt = torch.zeros(bs, prefix + suffix, dtype=torch.int64, device=device)
    for g in range(groups):
        rt[g * rows : (g + 1) * rows, :prefix] = 1 + g * prefix + torch.arange(prefix, device=device)
    rt[:, prefix:] = 1 + groups * prefix + torch.arange(bs * suffix, device=device).view(bs, suffix)
    q = torch.randn(bs, HEADS, HEAD_DIM, device=device, dtype=torch.bfloat16)
    seq_lens = torch.full((bs,), prefix + suffix, device=device, dtype=torch.int64)
    return q, k, v, rt, torch.arange(bs, device=device), seq_lens


def tiles(groups: int, rows: int, prefix: int, per_tile: int, device: str):
    """SharedPrefixes' tile_rows and tiles (first index, row count, prefix length) for per_tile requests a tile."""
    firsts, counts = [], []
    for g in range(groups):
        for i in range(0, rows, per_tile):
            firsts.append(g * rows + i)
            counts.append(min(per_tile, rows - i))
    n = len(firsts)
    tile_rows = torch.arange(groups * rows, device=device)
    spec = torch.tensor(firsts + counts + [prefix] * n, device=device, dtype=torch.int64)
    return tile_rows, spec, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--groups", type=int, default=32)
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--prefix", type=int, default=2048)
    ap.add_argument("--suffix", type=int, default=160)
    ap.add_argument("--bandwidth", type=float, default=4.8e12)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    from radixlm.runtime.kernels.attention import decode_attention
    from radixlm.runtime.kernels.attention.shared_prefix import _shared_prefix_stage1
    from radixlm.runtime.layers.attention.triton_backend import shared_prefixes

    dev = "cuda"
    t0 = time.perf_counter()
    q, k, v, rt, rows, seq_lens = build(args.groups, args.rows, args.prefix, args.suffix, dev)
    bs, scale = q.shape[0], HEAD_DIM**-0.5
    groups = [(args.prefix, list(range(g * args.rows, (g + 1) * args.rows))) for g in range(args.groups)]
    shared = shared_prefixes(groups, bs, GROUP, KV_HEADS, dev)
    result = {"benchmark": "shared_prefix_probe", "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": triton.__version__, "command": " ".join(sys.argv), "args": vars(args), "rows": []}
    out_path = Path(args.out) / "shared_prefix_probe.json"

    def add(row: dict) -> None:
        result["rows"].append(row)
        out_path.write_text(json.dumps(result, indent=1))
        print(" ".join(f"{k_}={v_:.4g}" if isinstance(v_, float) else f"{k_}={v_}" for k_, v_ in row.items()),
              flush=True)

    whole = graph_us(lambda i: decode_attention(q, k, v, rt, rows, seq_lens, scale, args.prefix + args.suffix, None,
                                                shared), 4)
    plain = graph_us(lambda i: decode_attention(q, k, v, rt, rows, seq_lens, scale, args.prefix + args.suffix), 2)
    add({"what": "decode_attention, shared prefixes (defaults)", "us": whole})
    add({"what": "decode_attention, every row's whole sequence", "us": plain})

    mid_o = torch.empty(bs, HEADS, 8, HEAD_DIM, device=dev, dtype=torch.float32)
    mid_lse = torch.empty(bs, HEADS, 8, device=dev, dtype=torch.float32)
    ref = None
    configs = list(itertools.product((64, 128), (64, 128), (4, 8), (2, 3), (1, 2)))
    for block_m, block_n, warps, stages, splits in configs:
        tile_rows, spec, n_tiles = tiles(args.groups, args.rows, args.prefix, block_m // GROUP, dev)

        def launch(i=0):
            _shared_prefix_stage1[(n_tiles, KV_HEADS, splits)](
                q, k, v, rt, rows, tile_rows, spec, mid_o, mid_lse, scale, 1.0,
                q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), rt.stride(0),
                mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
                n_tiles, splits, 0, GROUP=GROUP, HEAD_DIM=HEAD_DIM, BLOCK_D=HEAD_DIM, BLOCK_M=block_m,
                BLOCK_N=block_n, PRECISION="tf32", KV_CVT="", num_warps=warps, num_stages=stages)

        try:
            mid_lse.fill_(float("-inf"))
            launch()
            # The partials merged over the splits: each row's prefix attention, comparable across configs.
            w = torch.softmax(mid_lse[:, :, :splits], dim=-1)
            merged = (mid_o[:, :, :splits] * w[..., None]).sum(2)
            ref = merged if ref is None else ref
            err = ((merged - ref).abs().max() / ref.abs().max()).item()
            us = graph_us(launch, 4)
        except Exception as e:  # a config that does not build here (shared memory): reported, not timed
            print(f"bm{block_m} bn{block_n} w{warps} s{stages} x{splits}: {type(e).__name__}: {str(e)[:160]}")
            continue
        floor_us = n_tiles * KV_HEADS * args.prefix * HEAD_DIM * 2 * 2 / args.bandwidth * 1e6
        add({"what": "prefix stage", "block_m": block_m, "block_n": block_n, "warps": warps, "stages": stages,
             "splits": splits, "tiles": n_tiles, "us": us, "floor_us": floor_us, "of_floor": floor_us / us,
             "rel_err_vs_first": err})
    print(f"wrote {out_path} ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
