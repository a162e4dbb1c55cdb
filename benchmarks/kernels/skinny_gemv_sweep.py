"""Issue 56 (decode step at batch 1 <= 3.90 ms, 1.10x its floor): how close the skinny GEMM's tiles come to the HBM's
read bandwidth at one row, on Llama-3.1-8B's shapes (TP=1 and a TP=2 rank's), every tile in a grid against the
autotuner's candidates (skinny_gemm._CONFIGS) and cuBLAS (F.linear); beside them a plain read of the same bytes
(torch.sum over the weight) as the bandwidth a GEMV could reach. Each call replayed from a CUDA graph over distinct
weight copies (benchmarks/lib/gpu_timing.py), as a step reads each layer's weights cold (the first run,
benchmarks/results/kernels/h200/skinny_gemv_sweep_l2warm.json, replayed one copy: its shapes under ~100 MB read
partly from L2, up to 5.08 TB/s).

    python benchmarks/kernels/skinny_gemv_sweep.py [--out DIR]

Prints, per shape, the candidates' best, the grid's best and cuBLAS in us and TB/s, and writes skinny_gemv_sweep.json
(skinny_prologues.json with --prologues-only) to --out (default $OUT, else the current directory). A grid tile
faster than every candidate by --margin on a shape that matters is one to add to _CONFIGS (the autotuner keeps
choosing per shape at start-up). Then each prologue (PrologueKind: the norm a step fuses into qkv and gate_up at one
row, the SiLU-and-mul into down) against none, each at the best of the candidates (what the autotuner would pick),
and the norms also `narrow` (NORM_BLOCK = BLOCK_K: the norm's loop in BLOCK_K-wide steps, each an L2 round trip
before the first weight load; the kernel's default is 4,096-wide steps). The first cold run (skinny_gemv_sweep.json)
found the fused norm costing 3-6 us over the plain GEMV at the plain GEMV's tile (gate_up 58.9 -> 65.1 us with the
residual add), and unrolling the norm's loop 8 times did not help; the second (skinny_prologues/) measured the wide
norm (gate_up's add-and-norm 63.6 -> 61.6 us) and a register double buffer with the first weight tile loaded before
the norm (slower everywhere: 68.5; dropped). Needs CUDA."""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from benchmarks.lib.gpu_timing import graph_us, tree, weight_copies  # noqa: E402

SHAPES = {  # name: (N, K) of y = x @ W.T
    "qkv": (6144, 4096), "o_proj": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
    "lm_head": (128256, 4096),
    "qkv_tp2": (3072, 4096), "o_proj_tp2": (4096, 2048), "gate_up_tp2": (14336, 4096), "down_tp2": (4096, 7168),
    "lm_head_tp2": (64128, 4096),
}
LAYER_CALLS = {"qkv": 32, "o_proj": 32, "gate_up": 32, "down": 32, "lm_head": 1}
GRID = dict(block_n=(4, 8, 16), block_k=(256, 512, 1024, 2048), warps=(4, 8), stages=(2, 3, 4))


def launcher(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor, pro: int = 0, narrow: bool = False):
    """The skinny kernel at one row on x (1, K), or with prologue `pro` (PrologueKind's values; SILU_MUL reads x's
    first 2K columns as [gate | up]: x must hold them), as skinny_linear launches it; narrow: the norm's steps
    BLOCK_K wide (NORM_BLOCK; skinny_linear: the kernel's default)."""
    import triton

    from radixlm.runtime.kernels.gemm.skinny_gemm import _skinny_kernel

    n, k = w.shape
    norm_w = torch.ones(k, device=w.device, dtype=w.dtype) if pro in (1, 2) else w
    residual = torch.zeros(1, k, device=w.device, dtype=w.dtype) if pro == 2 else w
    residual_out = torch.empty(1, k, device=w.device, dtype=w.dtype) if pro == 2 else w
    eps = 1e-5 if pro in (1, 2) else 0.0

    def launch(bn: int, bk: int, warps: int, stages: int):
        _skinny_kernel.fn[(triton.cdiv(n, bn),)](
            x, w, w, y, norm_w, residual, residual_out, w, w, w, w, w, n, k, x.stride(0), w.stride(0), y.stride(0),
            residual.stride(0) if pro == 2 else 0, eps, 0, 0, 0, 0, 0, 1.0, 1.0, M=1, HAS_BIAS=False, PRO=pro,
            EPI=False, HEAD_DIM=0, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages,
            **({"NORM_BLOCK": bk} if narrow else {}))
    return launch


def prologue_variants() -> dict[str, tuple[int, bool]]:
    """label: (PRO, narrow)."""
    return {"none": (0, False), "rmsnorm": (1, False), "rmsnorm_narrow": (1, True), "add_rmsnorm": (2, False),
            "add_rmsnorm_narrow": (2, True), "silu_mul": (3, False)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--margin", type=float, default=0.03, help="a grid tile this much faster than the candidates is "
                                                                   "flagged")
    ap.add_argument("--prologues-only", action="store_true", help="the candidates only, no grid: the prologues' run")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs CUDA")
        return 2
    from radixlm.runtime.kernels.gemm.skinny_gemm import _CONFIGS

    candidates = [(c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"], c.num_warps, c.num_stages) for c in _CONFIGS]
    grid = list(itertools.product(*GRID.values()))
    rows = []
    for name in args.shapes:
        n, k = SHAPES[name]
        nbytes = n * k * 2
        ws = weight_copies(n, k)
        copies = len(ws)
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        y = torch.empty(1, n, device="cuda", dtype=torch.bfloat16)
        want = torch.nn.functional.linear(x, ws[0])
        launches = [launcher(x, w, y) for w in ws]
        row = {"shape": name, "n": n, "k": k, "bytes": nbytes, "copies": copies, "tiles": {}}
        row["read_us"] = graph_us(lambda i: ws[i].sum(dtype=torch.float32), copies)
        row["cublas_us"] = graph_us(lambda i: torch.nn.functional.linear(x, ws[i]), copies)
        for tile in dict.fromkeys(candidates + ([] if args.prologues_only else grid)):
            try:
                launches[0](*tile)
                torch.cuda.synchronize()
                if not torch.allclose(y.float(), want.float(), rtol=2e-2, atol=2e-2):
                    row["tiles"][str(tile)] = {"error": "wrong result"}
                    continue
                row["tiles"][str(tile)] = {"us": graph_us(lambda i: launches[i](*tile), copies)}
            except Exception as e:  # noqa: BLE001 - a tile that does not compile (shared memory) is recorded
                row["tiles"][str(tile)] = {"error": str(e)[:200]}
        timed = {t: v["us"] for t, v in row["tiles"].items() if "us" in v}
        cand = {str(t): timed[str(t)] for t in candidates if str(t) in timed}
        row["candidates_best"] = min(cand, key=cand.get)
        row["grid_best"] = min(timed, key=timed.get)
        row["grid_gain"] = cand[row["candidates_best"]] / timed[row["grid_best"]] - 1
        # Each prologue variant at the best of the candidates (x2: [gate | up] for 3, as the down projection reads it).
        x2 = torch.randn(1, 2 * k, device="cuda", dtype=torch.bfloat16)
        row["prologue_us"], row["prologue_tile"] = {}, {}
        for label, (pro, narrow) in prologue_variants().items():
            fns = [launcher(x2 if pro == 3 else x, w, y, pro, narrow) for w in ws]
            best = {t: graph_us(lambda i: fns[i](*t), copies) for t in candidates}
            tile = min(best, key=best.get)
            row["prologue_us"][label], row["prologue_tile"][label] = best[tile], str(tile)
        print(f"{name:12s} prologues (best candidate each): "
              + ", ".join(f"{k} {v:.1f}" for k, v in row["prologue_us"].items()) + " us", flush=True)
        tbps = lambda us: nbytes / us / 1e6  # noqa: E731
        print(f"{name:12s} {nbytes / 1e6:7.1f} MB  read {row['read_us']:7.1f} us {tbps(row['read_us']):.2f} TB/s  "
              f"cuBLAS {row['cublas_us']:7.1f} ({tbps(row['cublas_us']):.2f})  candidates' best "
              f"{cand[row['candidates_best']]:7.1f} ({tbps(cand[row['candidates_best']]):.2f}) {row['candidates_best']}"
              f"  grid's best {timed[row['grid_best']]:7.1f} ({tbps(timed[row['grid_best']]):.2f}) {row['grid_best']}"
              + ("  <- a tile to add" if row["grid_gain"] > args.margin else ""), flush=True)
        rows.append(row)
    # Per grid tile, the batch-1 step time its tiles would save across the TP=1 shapes if the autotuner could pick it.
    step = {}
    for tile in map(str, grid):
        saved = 0.0
        for row in rows:
            calls = LAYER_CALLS.get(row["shape"], 0)
            t = row["tiles"].get(tile, {})
            if calls and "us" in t:
                saved += calls * max(0.0, row["tiles"][row["candidates_best"]]["us"] - t["us"])
        step[tile] = saved
    best_add = sorted(step.items(), key=lambda kv: -kv[1])[:5]
    print("tiles that would save the most of a TP=1 batch-1 step (us) if added:", best_add)
    result = {"benchmark": "skinny GEMM tiles at one row", "device": torch.cuda.get_device_name(), "tree": tree(),
              "torch": torch.__version__, "command": " ".join(["benchmarks/kernels/skinny_gemv_sweep.py",
                                                                *(argv or sys.argv[1:])]),
              "tile_fields": ["BLOCK_N", "BLOCK_K", "num_warps", "num_stages"], "candidates": candidates,
              "rows": rows, "step_saving_us_if_added": dict(best_add)}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    name = "skinny_prologues.json" if args.prologues_only else "skinny_gemv_sweep.json"
    (Path(args.out) / name).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
