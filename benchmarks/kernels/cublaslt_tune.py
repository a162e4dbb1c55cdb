"""Tunes cuBLASLt configurations for the decode GEMMs of CUDA-graph batch sizes and writes the table start-up loads
(`radixlm/runtime/layers/tuned/cublaslt_<GPU>.json`; `layers/cublaslt.py`, `gemm.linear`). Issue 20: at 256 rows the
heuristic's pick (torch's) leaves 5-10% on gate_up and down_proj that other tiles and cluster shapes of the same kernel
family reach (`benchmarks/cublaslt_probe.py --exhaustive`).

Per shape and row count: every configuration cuBLASLt accepts in the heuristic's kernel families without split-K
(`enumerate_algos`), in random order, each run once and kept only if its output is bit-identical to torch's (so a
tuned GEMM changes no token); those quick-timed for a budget, then every variant of the five fastest tiles; the eight
fastest graph-timed as `gemv_sweep.graph_us` times cuBLAS (over weight copies: no L2 hits). An entry is written where
the best beats torch's matmul by MARGIN.

    python benchmarks/kernels/cublaslt_tune.py --log $OUT/cublaslt_tune.json   # then commit the table it names
    python benchmarks/kernels/cublaslt_tune.py --merge --graph-sizes --budget-s 540   # every graph size, kept entries merged

With no workspace, lm_head and gate_up past 384 rows have no configuration (their kernels all need one; 4 bytes on an
H200): --workspace-mib (default 1) offers one, and an entry records the bytes its configuration needs.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.lib.gpu_timing import SHAPES, graph_us, quick_us, weight_copies, write_cells  # noqa: E402
from radixlm.runtime.kernels.gemm.cublaslt import (CublasLt, LtGemm, algo_config, enumerate_algos,  # noqa: E402
                                             table_path)

MARGIN = 1.03
ROWS = [48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 512, 640, 768, 1024]


def tune_cell(lt: CublasLt, n: int, k: int, m: int, ws: list, budget_s: float, workspace_mib: int = 1) -> dict:
    copies = len(ws)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    x2 = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    ys = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    ref, ref2 = torch.matmul(x, ws[0].t()), torch.matmul(x2, ws[0].t())
    workspace = torch.empty(workspace_mib << 20, dtype=torch.uint8, device="cuda") if workspace_mib else None
    gemm = LtGemm(lt, m, n, k, torch.bfloat16, workspace)
    families = tuple(sorted({algo_config(lt, h.algo)["id"] for h in gemm.heuristic()}))
    gemm.candidates = enumerate_algos(gemm, splitks=(1,), max_custom=7, limit=60000, only_ids=families,
                                      clusters=tuple(range(0, 10)))
    configs = [algo_config(lt, c.algo) for c in gemm.candidates]
    order = list(range(len(gemm.candidates)))
    random.Random(m * 7919 + n).shuffle(order)

    timed: dict[int, float] = {}

    def time_one(index: int) -> None:
        gemm.algo_index = index
        if not torch.equal(gemm(x, ws[0], ys[0]), ref):
            return
        timed[index] = quick_us(lambda i: gemm(x, ws[i], ys[i]), copies)

    t0 = time.perf_counter()
    for index in order:
        if time.perf_counter() - t0 > budget_s * 0.6:
            break
        time_one(index)
    top_tiles = {configs[i]["tile"] for i in sorted(timed, key=timed.get)[:5]}
    for index in order:
        if time.perf_counter() - t0 > budget_s:
            break
        if index not in timed and configs[index]["tile"] in top_tiles:
            time_one(index)
    finalists = []
    for index in sorted(timed, key=timed.get)[:8]:
        gemm.algo_index = index
        if torch.equal(gemm(x2, ws[0], ys[0]), ref2):
            finalists.append((graph_us(lambda i: gemm(x, ws[i], ys[i]), copies), index))
    cublas_us = graph_us(lambda i: torch.matmul(x, ws[i].t(), out=ys[i]), copies)
    finalists.sort()
    cell = {"n": n, "k": k, "m": m, "dtype": "bfloat16", "cublas_us": cublas_us, "families": families,
            "accepted": len(gemm.candidates), "timed": len(timed), "search_s": time.perf_counter() - t0}
    if finalists:
        best_us, index = finalists[0]
        cell.update(us=best_us, config=configs[index], speedup=cublas_us / best_us,
                    workspace=gemm.candidates[index].workspace_size)
    return cell


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", nargs="+", default=["gate_up_proj", "down_proj", "qkv_proj", "o_proj"])
    p.add_argument("--rows", type=int, nargs="+", default=ROWS)
    p.add_argument("--graph-sizes", action="store_true",
                   help="tune every CUDA-graph size past the few-row kernels (default max) instead of --rows")
    p.add_argument("--cell-budget-s", type=float, default=6)
    p.add_argument("--budget-s", type=float, default=420)
    p.add_argument("--workspace-mib", type=int, default=1,
                   help="configurations that need a workspace up to this size too (0: none; entries record their need)")
    p.add_argument("--table", default=None, help="where to write the table (default: the runtime's path for this GPU)")
    p.add_argument("--merge", action="store_true", help="keep the table's entries for cells this run does not tune")
    p.add_argument("--log", default="cublaslt_tune.json")
    args = p.parse_args()
    if args.graph_sizes:
        from radixlm.runtime.executor.cuda_graph_runner import capture_batch_sizes
        from radixlm.runtime.executor.model_runner import CUDA_GRAPH_DEFAULT_MAX_BS
        from radixlm.runtime.kernels.gemm.skinny_mma import MMA_MAX_M

        args.rows = [b for b in capture_batch_sizes(CUDA_GRAPH_DEFAULT_MAX_BS) if b > MMA_MAX_M]
    t0 = time.perf_counter()
    lt = CublasLt()
    device = torch.cuda.get_device_name()
    table = Path(args.table) if args.table else table_path(device)
    cells, entries, commands = [], [], [" ".join(sys.argv)]
    if args.merge and table.exists():
        old = json.loads(table.read_text())
        retuned = {(SHAPES[name][0], SHAPES[name][1], m) for name in args.shapes for m in args.rows}
        entries = [e for e in old["entries"] if (e["n"], e["k"], e["m"]) not in retuned]
        commands = old["commands"] + commands
    for name in args.shapes:
        n, k = SHAPES[name]
        ws = weight_copies(n, k)
        for m in args.rows:
            if time.perf_counter() - t0 > args.budget_s:
                print("budget spent: stopping", flush=True)
                break
            cell = tune_cell(lt, n, k, m, ws, args.cell_budget_s, args.workspace_mib) | {"shape": name}
            cells.append(cell)
            won = cell.get("speedup", 0) >= MARGIN
            if won:
                entries.append({key: cell[key] for key in ("n", "k", "m", "dtype", "config", "us", "cublas_us")}
                               | ({"workspace": cell["workspace"]} if cell["workspace"] else {}))
            print(f"{name:13s} M={m:5d}: cuBLAS {cell['cublas_us']:7.1f} us  best {cell.get('us', 0):7.1f} "
                  f"x{cell.get('speedup', 0):.3f} {'TABLE' if won else '     '} ({cell['timed']} timed of "
                  f"{cell['accepted']} in {cell['search_s']:.1f} s) {cell.get('config')} "
                  f"workspace {cell.get('workspace')}", flush=True)
            table.parent.mkdir(parents=True, exist_ok=True)
            table.write_text(json.dumps({"gpu": device, "torch": torch.__version__, "margin": MARGIN,
                                         "commands": commands, "entries": entries}, indent=1) + "\n")
            write_cells(args.log, "cublaslt_tune", cells)
        del ws
        torch.cuda.empty_cache()
    print(f"wrote {table} ({len(entries)} entries) and {args.log} after {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
