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

--fp8: the W8A8 GEMMs of FP8 models past the few-row kernels (kernels/quant/fp8_gemm.fp8_scaled_linear: per-token
activations, per-channel weights, cuBLASLt's outer-vector scales, which torch._scaled_mm runs with the heuristic's
pick). The search takes split-K configurations too (at 64-256 rows the heuristic's 128 x 128 tiles leave SMs idle),
which sum in another order than torch's kernel (candidates: the heuristic's 64 and their split-K and cluster variants,
split_variants): a candidate is kept if its output is within FP8_CLOSE of
torch._scaled_mm's (relative norm) and the same at a second call; the cell records whether the best is also
bit-identical. Entries go to their own table (`cublaslt_fp8_<GPU>.json`, dtype float8_e4m3fn).

    python benchmarks/kernels/cublaslt_tune.py --fp8 --graph-sizes --workspace-mib 16 --log $OUT/fp8_tune.json \
        --table $OUT/cublaslt_fp8_<GPU>.json
"""
from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.lib.gpu_timing import SHAPES, graph_us, quick_us, weight_copies, write_cells  # noqa: E402
from radixlm.runtime.kernels.gemm.cublaslt import (CublasLt, LtGemm, LtScale, algo_config,  # noqa: E402
                                                    configured, enumerate_algos, table_path)

MARGIN = 1.03
ROWS = [48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 512, 640, 768, 1024]
FP8_CLOSE = 2e-3  # a split-K sum's roundings (bf16 output: ~4e-3 an element, far less over the norm)
FP8_SPLITS = (1, 2, 3, 4, 6, 8)
FP8_CLUSTERS = (0, 2, 3, 5)  # cublasLtClusterShape_t: auto, 1x1x1, 2x1x1, 1x2x1


class Operands:
    """One cell's inputs, torch's GEMM on them and a candidate's call: 16-bit x @ w.T, or FP8 (per-token x, per-channel
    w) as torch._scaled_mm computes it."""

    def __init__(self, n: int, k: int, m: int, ws: list, fp8: bool):
        self.fp8, self.ws = fp8, ws
        dtype = torch.bfloat16
        self.xs = [torch.randn(m, k, device="cuda", dtype=dtype) for _ in range(2)]
        self.ys = [torch.empty(m, n, device="cuda", dtype=dtype) for _ in ws]
        if fp8:
            from radixlm.runtime.kernels.quant.fp8_act import quant_fp8_per_token

            self.xs = [quant_fp8_per_token(x) for x in self.xs]  # (q, scale (M, 1))
            self.w_scales = [torch.rand(n, device="cuda") * 0.02 + 0.01 for _ in ws]

    def torch_gemm(self, j: int, i: int = 0) -> torch.Tensor:
        if not self.fp8:
            return torch.matmul(self.xs[j], self.ws[i].t(), out=self.ys[i])
        q, s = self.xs[j]
        return torch._scaled_mm(q, self.ws[i].t(), s, self.w_scales[i].reshape(1, -1), out_dtype=torch.bfloat16)

    def run(self, gemm: LtGemm, j: int, i: int = 0) -> torch.Tensor:
        if not self.fp8:
            return gemm(self.xs[j], self.ws[i], self.ys[i])
        q, s = self.xs[j]
        return gemm(q, self.ws[i], self.ys[i], s.reshape(-1), self.w_scales[i])

    def accepts(self, out: torch.Tensor, ref: torch.Tensor) -> bool:
        if not self.fp8:
            return torch.equal(out, ref)
        return ((out.float() - ref.float()).norm() / ref.float().norm()).item() < FP8_CLOSE


def split_variants(gemm: LtGemm, found: list) -> list:
    """The heuristic's configurations and each one's split-K (FP8_SPLITS, every reduction scheme) and cluster-shape
    (FP8_CLUSTERS) variants that cuBLASLt accepts, once each: enumerate_algos's whole product (tiles x stages x splits
    x reductions x swizzles x custom options x clusters) is ~10^5 configurations a family with split K."""
    seen, out = set(), []
    for base in found:
        config = algo_config(gemm.lt, base.algo)
        for split, red, cluster in itertools.product(FP8_SPLITS, (0, 1, 2, 4), FP8_CLUSTERS):
            if (split == 1) != (red == 0):
                continue
            variant = {**config, "splitk": split, "reduction": red, "cluster": cluster}
            key = tuple(sorted(variant.items()))
            if key in seen:
                continue
            seen.add(key)
            result = configured(gemm, variant)
            if result is not None:
                out.append(result)
    return out


def tune_cell(lt: CublasLt, n: int, k: int, m: int, ws: list, budget_s: float, workspace_mib: int = 1,
              fp8: bool = False) -> dict:
    copies = len(ws)
    ops = Operands(n, k, m, ws, fp8)
    ref, ref2 = ops.torch_gemm(0).clone(), ops.torch_gemm(1).clone()
    workspace = torch.empty(workspace_mib << 20, dtype=torch.uint8, device="cuda") if workspace_mib else None
    dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    gemm = LtGemm(lt, m, n, k, dtype, workspace, out_dtype=torch.bfloat16,
                  scales=LtScale.ROW if fp8 else LtScale.NONE)
    families = tuple(sorted({algo_config(lt, h.algo)["id"] for h in gemm.heuristic()}))
    if fp8:
        gemm.candidates = split_variants(gemm, gemm.heuristic(64))
    else:
        gemm.candidates = enumerate_algos(gemm, splitks=(1,), max_custom=7, limit=60000, only_ids=families,
                                          clusters=tuple(range(0, 10)))
    configs = [algo_config(lt, c.algo) for c in gemm.candidates]
    order = list(range(len(gemm.candidates)))
    random.Random(m * 7919 + n).shuffle(order)

    timed: dict[int, float] = {}

    def time_one(index: int) -> None:
        gemm.algo_index = index
        if not ops.accepts(ops.run(gemm, 0), ref):
            return
        timed[index] = quick_us(lambda i: ops.run(gemm, 0, i), copies)

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
        again = ops.run(gemm, 1).clone()
        if ops.accepts(again, ref2) and torch.equal(ops.run(gemm, 1), again):
            finalists.append((graph_us(lambda i: ops.run(gemm, 0, i), copies), index))
    cublas_us = graph_us(lambda i: ops.torch_gemm(0, i), copies)
    finalists.sort()
    cell = {"n": n, "k": k, "m": m, "dtype": str(dtype).removeprefix("torch."), "cublas_us": cublas_us,
            "families": families, "accepted": len(gemm.candidates), "timed": len(timed),
            "search_s": time.perf_counter() - t0}
    if finalists:
        best_us, index = finalists[0]
        gemm.algo_index = index
        cell.update(us=best_us, config=configs[index], speedup=cublas_us / best_us,
                    workspace=gemm.candidates[index].workspace_size,
                    identical=bool(torch.equal(ops.run(gemm, 0), ref)))
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
    p.add_argument("--fp8", action="store_true", help="the FP8 (W8A8, row-wise scales) GEMMs; their own table")
    args = p.parse_args()
    if args.graph_sizes:
        from radixlm.runtime.executor.cuda_graph_runner import capture_batch_sizes
        from radixlm.runtime.executor.model_runner import CUDA_GRAPH_DEFAULT_MAX_BS
        from radixlm.runtime.kernels.gemm.skinny_mma import MMA_MAX_M

        args.rows = [b for b in capture_batch_sizes(CUDA_GRAPH_DEFAULT_MAX_BS) if b > MMA_MAX_M]
    t0 = time.perf_counter()
    lt = CublasLt()
    device = torch.cuda.get_device_name()
    table = Path(args.table) if args.table else table_path(device, "cublaslt_fp8" if args.fp8 else "cublaslt")
    cells, entries, commands = [], [], [" ".join(sys.argv)]
    if args.merge and table.exists():
        old = json.loads(table.read_text())
        retuned = {(SHAPES[name][0], SHAPES[name][1], m) for name in args.shapes for m in args.rows}
        entries = [e for e in old["entries"] if (e["n"], e["k"], e["m"]) not in retuned]
        commands = old["commands"] + commands
    for name in args.shapes:
        n, k = SHAPES[name]
        ws = weight_copies(n, k, scale=1.0)
        if args.fp8:
            ws = [w.to(torch.float8_e4m3fn) for w in ws]
        else:
            ws = [w.mul_(0.02) for w in ws]
        for m in args.rows:
            if time.perf_counter() - t0 > args.budget_s:
                print("budget spent: stopping", flush=True)
                break
            cell = tune_cell(lt, n, k, m, ws, args.cell_budget_s, args.workspace_mib, args.fp8) | {"shape": name}
            cells.append(cell)
            won = cell.get("speedup", 0) >= MARGIN
            if won:
                entries.append({key: cell[key] for key in ("n", "k", "m", "dtype", "config", "us", "cublas_us")}
                               | ({"workspace": cell["workspace"]} if cell["workspace"] else {})
                               | ({"identical": cell["identical"]} if args.fp8 else {}))
            print(f"{name:13s} M={m:5d}: cuBLAS {cell['cublas_us']:7.1f} us  best {cell.get('us', 0):7.1f} "
                  f"x{cell.get('speedup', 0):.3f} {'TABLE' if won else '     '} ({cell['timed']} timed of "
                  f"{cell['accepted']} in {cell['search_s']:.1f} s) {cell.get('config')} "
                  f"workspace {cell.get('workspace')} identical {cell.get('identical')}", flush=True)
            table.parent.mkdir(parents=True, exist_ok=True)
            table.write_text(json.dumps({"gpu": device, "torch": torch.__version__, "margin": MARGIN,
                                         "commands": commands, "entries": entries}, indent=1) + "\n")
            write_cells(args.log, "cublaslt_tune", cells)
        del ws
        torch.cuda.empty_cache()
    print(f"wrote {table} ({len(entries)} entries) and {args.log} after {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
