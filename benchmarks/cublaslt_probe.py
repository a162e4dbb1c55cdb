"""Does any of cuBLASLt's candidate algorithms beat torch's cuBLAS pick on the decode GEMMs (issue 20: at batch 256
the GEMMs take ~6.7 ms of the step, ~1.3x max(weight read, 700 TFLOP/s))? For each Llama-3.1-8B shape and row count:
torch.matmul (cuBLAS's heuristic pick) and every algorithm cuBLASLt's heuristic lists (`layers/cublaslt.LtGemm`),
graph-timed over weight copies (no L2 hits, as a model's layers), each candidate's output checked against torch's.

With --exhaustive, instead of the heuristic's list: every configuration `enumerate_algos` finds (optionally one
algorithm id, with cluster shapes and custom options), in random order, quick-timed for a budget per cell, the fastest
eight graph-timed (outputs within bf16 rounding of torch's; benchmarks/cublaslt_tune.py keeps bit-identical ones only).

    python benchmarks/cublaslt_probe.py --out $OUT/cublaslt_probe.json
    python benchmarks/cublaslt_probe.py --exhaustive --algo-ids 66 --clusters 0 2 3 4 5 6 7 8 9 --max-custom 7 \
        --rows 256 128 --shapes gate_up_proj down_proj qkv_proj o_proj --cell-budget-s 25 --budget-s 280
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gemv_sweep import SHAPES, graph_us, weight_copies, within_budget, write_cells  # noqa: E402
from radixlm.runtime.layers.cublaslt import CublasLt, CublasLtError, LtGemm, algo_config, enumerate_algos  # noqa: E402


def quick_us(fn, copies: int, reps: int = 5) -> float:
    """A cheaper graph timing for a wide search: one capture, two warm replays, `reps` timed ones."""
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(copies):
            fn(i)
    for _ in range(2):
        g.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        g.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / reps / copies


def search(lt, name, n, k, m, ws, ys, x, workspace, cell_budget_s: float, search_args: dict) -> dict:
    """Every configuration cuBLASLt accepts, quick-timed; the fastest 8 graph-timed as the main table is."""
    copies = len(ws)
    ref = torch.matmul(x, ws[0].t()).float()
    scale = ref.abs().max().item()
    gemm = LtGemm(lt, m, n, k, torch.bfloat16, workspace)
    heuristic = [algo_config(lt, c.algo) for c in gemm.heuristic()]
    gemm.candidates = enumerate_algos(gemm, **search_args)
    random.Random(0).shuffle(gemm.candidates)
    t0 = time.perf_counter()
    timed = []
    for index in range(len(gemm.candidates)):
        if time.perf_counter() - t0 > cell_budget_s:
            break
        gemm.algo_index = index
        try:
            ys[0].fill_(float("nan"))
            gemm(x, ws[0], ys[0])
            err = (ys[0].float() - ref).abs().max().item() / scale
            if not err < 2e-2:
                continue
            timed.append((quick_us(lambda i: gemm(x, ws[i], ys[i]), copies), index))
        except (CublasLtError, RuntimeError):
            continue
    timed.sort()
    best = []
    for _, index in timed[:8]:
        gemm.algo_index = index
        best.append({"us": graph_us(lambda i: gemm(x, ws[i], ys[i]), copies),
                     "config": algo_config(lt, gemm.candidates[index].algo),
                     "workspace": gemm.candidates[index].workspace_size})
    best.sort(key=lambda b: b["us"])
    cublas = graph_us(lambda i: torch.matmul(x, ws[i].t(), out=ys[i]), copies)
    return {"shape": name, "m": m, "n": n, "k": k, "cublas_us": cublas, "accepted": len(gemm.candidates),
            "timed": len(timed), "heuristic_configs": heuristic, "best": best,
            "speedup": cublas / best[0]["us"] if best else None}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, nargs="+", default=[48, 64, 96, 128, 192, 256, 384, 512, 768, 1024])
    p.add_argument("--shapes", nargs="+", default=list(SHAPES))
    p.add_argument("--max-algos", type=int, default=32)
    p.add_argument("--budget-s", type=float, default=400)
    p.add_argument("--exhaustive", action="store_true",
                   help="time every configuration cuBLASLt accepts (enumerate_algos), not only the heuristic's list")
    p.add_argument("--cell-budget-s", type=float, default=25)
    p.add_argument("--algo-ids", type=int, nargs="*", default=[], help="search only these algorithm ids")
    p.add_argument("--clusters", type=int, nargs="+", default=[0], help="cluster shape ids to try")
    p.add_argument("--max-custom", type=int, default=2)
    p.add_argument("--out", default="cublaslt_probe.json")
    args = p.parse_args()
    t0 = time.perf_counter()
    lt = CublasLt()
    search_args = {"limit": 20000, "only_ids": tuple(args.algo_ids), "clusters": tuple(args.clusters),
                   "max_custom": args.max_custom}
    workspace = torch.empty(32 << 20, dtype=torch.uint8, device="cuda")
    cells = []
    for name in args.shapes:
        n, k = SHAPES[name]
        ws = weight_copies(n, k)
        copies = len(ws)
        for m in within_budget(args.rows, t0, args.budget_s):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ys = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
            if args.exhaustive:
                cell = search(lt, name, n, k, m, ws, ys, x, workspace, args.cell_budget_s, search_args)
                cells.append(cell)
                top = cell["best"][0] if cell["best"] else {"us": 0, "config": {}}
                print(f"{name:13s} M={m:5d}: cuBLAS {cell['cublas_us']:7.1f} us  best {top['us']:7.1f} "
                      f"x{cell['speedup'] or 0:.3f} ({cell['timed']} timed of {cell['accepted']}) {top['config']}",
                      flush=True)
                print(f"    heuristic: {cell['heuristic_configs'][:3]}", flush=True)
                write_cells(args.out, "cublaslt_probe_exhaustive", cells)
                continue
            ref = torch.matmul(x, ws[0].t()).float()
            scale = ref.abs().max().item()
            cublas = graph_us(lambda i: torch.matmul(x, ws[i].t(), out=ys[i]), copies)
            gemm = LtGemm(lt, m, n, k, torch.bfloat16, workspace)
            gemm.candidates = gemm.heuristic(args.max_algos)
            algos = []
            for index, cand in enumerate(gemm.candidates):
                gemm.algo_index = index
                try:
                    ys[0].fill_(float("nan"))
                    gemm(x, ws[0], ys[0])
                    err = (ys[0].float() - ref).abs().max().item() / scale
                    us = graph_us(lambda i: gemm(x, ws[i], ys[i]), copies)
                except (CublasLtError, RuntimeError) as exc:
                    algos.append({"index": index, "error": str(exc)})
                    continue
                algos.append({"index": index, "us": us, "rel_err": err, "workspace": cand.workspace_size,
                              "waves": cand.waves_count, "algo": list(cand.algo.data)})
            ok = [a for a in algos if "us" in a and a["rel_err"] < 2e-2]
            best = min(ok, key=lambda a: a["us"]) if ok else None
            cell = {"shape": name, "m": m, "n": n, "k": k, "cublas_us": cublas,
                    "lt_first_us": ok[0]["us"] if ok else None,
                    "lt_best_us": best["us"] if best else None, "lt_best_index": best["index"] if best else None,
                    "speedup": cublas / best["us"] if best else None, "weight_read_us_at_3tbps": n * k * 2 / 3e6,
                    "algos": algos}
            cells.append(cell)
            print(f"{name:13s} M={m:5d}: cuBLAS {cublas:7.1f} us  Lt first {cell['lt_first_us'] or 0:7.1f}  "
                  f"best {cell['lt_best_us'] or 0:7.1f} (#{cell['lt_best_index']} of {len(algos)})  "
                  f"x{cell['speedup'] or 0:.3f}  weights {cell['weight_read_us_at_3tbps']:.1f}", flush=True)
            write_cells(args.out, "cublaslt_probe", cells)
        del ws
        torch.cuda.empty_cache()
    print(f"wrote {args.out} after {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
