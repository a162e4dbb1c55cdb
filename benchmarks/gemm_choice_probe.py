"""Does start-up's skinny-or-cuBLAS measurement pick what a CUDA-graph replay favours? (issue 20: the engines of
2026-11-27's second session gave cuBLAS 63-64 of the 129 batch-1 GEMMs, earlier engines 11-31, while
`gemv_sweep.py`'s graph replays had the skinny kernel 5-19% ahead at one row.)

Per Llama-3.1-8B GEMM shape (no prologue or epilogue) and row count:
  replay  a CUDA-graph replay over COPIES weight copies (no L2 hits, no launch cost), skinny kernel and cuBLAS;
  write   `gemm._time_us`, each call after a write of 4x the L2 cache (its dirty lines are written back while the GEMM
          reads its weight), ROUNDS times;
  read    the same after a read of that buffer (clean lines, as other layers' weight reads leave them): start-up's way.
Until 2026-11-27 `_time_us` called each candidate eagerly, where the host's launch cost showed through
(kernels_h100/gemm_choice_probe.json and _order.json); _lead.json had the device sleep first while the host queued every
call (right picks, but 5 s more start-up); since then it replays each candidate's own CUDA graph.
Each measurement's pick is the skinny kernel where it is below SKINNY_MARGIN x cuBLAS; the table says how often the
start-up measurement's picks agree with the replay's.

    python benchmarks/gemm_choice_probe.py --out $OUT/gemm_choice_probe.json
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gemv_sweep import SHAPES, graph_us, weight_copies, within_budget, write_cells  # noqa: E402
from radixlm.runtime.layers.gemm import SKINNY_MARGIN, _time_us  # noqa: E402
from radixlm.runtime.layers.skinny_gemm import skinny_linear  # noqa: E402


def picks_skinny(skinny_us: float, cublas_us: float) -> bool:
    return skinny_us < SKINNY_MARGIN * cublas_us


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", nargs="+", default=list(SHAPES))
    p.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--budget-s", type=float, default=240)
    p.add_argument("--out", default="gemm_choice_probe.json")
    args = p.parse_args()
    t0 = time.perf_counter()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    buf = torch.empty(max(4 * l2, 64 << 20), dtype=torch.uint8, device="cuda")
    words = buf.view(torch.int32)
    evictions = {"write": buf.zero_, "read": lambda: torch.amax(words)}
    cells = []
    print(f"{'shape':13s} rows | replay skinny / cuBLAS us | " + " | ".join(f"{m} picks skinny" for m in evictions))
    for name in within_budget(args.shapes, t0, args.budget_s):
        n, k = SHAPES[name]
        ws = weight_copies(n, k)
        copies = len(ws)
        for m in args.rows:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            fns = [lambda i: skinny_linear(x, ws[i]), lambda i: F.linear(x, ws[i])]
            replay = [graph_us(fn, copies) for fn in fns]
            cell = {"shape": name, "m": m, "n": n, "k": k, "replay_us": replay,
                    "replay_picks_skinny": picks_skinny(*replay)}
            for kind, evict in evictions.items():
                rounds = [_time_us([lambda: fns[0](0), lambda: fns[1](0)], evict) for _ in range(args.rounds)]
                cell[f"{kind}_us"] = rounds
                cell[f"{kind}_picks_skinny"] = sum(picks_skinny(*r) for r in rounds)
                cell[f"{kind}_median_us"] = [statistics.median(r[i] for r in rounds) for i in (0, 1)]
            cells.append(cell)
            eager = " | ".join("{}/{} (median {:.1f} / {:.1f})".format(
                cell[f"{kind}_picks_skinny"], args.rounds, *cell[f"{kind}_median_us"]) for kind in evictions)
            winner = "skinny" if cell["replay_picks_skinny"] else "cuBLAS"
            print(f"{name:13s} {m:4d} | {replay[0]:7.1f} / {replay[1]:7.1f} ({winner}) | {eager}", flush=True)
            write_cells(args.out, "gemm_choice_probe", cells)
        del ws
        torch.cuda.empty_cache()
    print(f"wrote {args.out} after {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
