"""The batch-invariant GEMM's tuning sweep: for each weight shape, candidate tile configurations (BLOCK_M fixed) are
first checked to keep every row's output independent of M (rows computed at M = 1, 7, 64 and 256 bitwise equal to the
same rows inside a call of INVARIANCE_BIG_M rows, at another tile position), a candidate that fails is rejected, then
timed at M = 64, 256 and 2048 as a CUDA-graph replay after an L2 eviction (dispatch's timing). The best by SCORE is
written to this GPU model's table (tuned/batch_invariant_<GPU>.json), which batch_invariant_mm.config_for reads.

    python -m radixlm.runtime.kernels.gemm.batch_invariant_tune --budget-s 150 --out $OUT --install

Without CUDA (TRITON_INTERPRET=1: a dry run) the shapes are tiny, two candidates, and the "timing" is wall time."""
from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from radixlm.runtime.kernels.gemm.batch_invariant_mm import BLOCK_M, BatchInvariantConfig, default_config, matmul

# Llama-3.1-8B's GEMMs (N, K): qkv, o, gate_up, down, lm_head.
LLAMA_8B_SHAPES = {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up_proj": (28672, 4096),
                   "down_proj": (4096, 14336), "lm_head": (128256, 4096)}
TINY_SHAPES = {"tiny": (96, 128)}
INVARIANCE_MS = (1, 7, 64, 256)
INVARIANCE_BIG_M = 300  # not a multiple of BLOCK_M: the checked rows sit at other positions of other tiles
INVARIANCE_OFFSET = 37
TIMED_MS = (64, 256, 2048)
# Decode passes (64-256 rows) are most of a serving run's GEMM time; a prefill's 2048 rows count a quarter.
SCORE_WEIGHTS = {64: 1.0, 256: 1.0, 2048: 0.25}
SMEM_LIMIT = 227 * 1024  # Hopper's opt-in shared memory per block


def candidates(element_size: int = 2, smem_limit: int = SMEM_LIMIT) -> list[BatchInvariantConfig]:
    """The sweep's configurations that fit in shared memory, most promising first (a budget cuts the tail)."""
    out = []
    for bn, bk, warps, stages in itertools.product((64, 128, 32, 256), (64, 128), (4, 8), (4, 3, 5)):
        if bn == 32 and warps == 8:
            continue
        cfg = BatchInvariantConfig(block_n=bn, block_k=bk, num_warps=warps, num_stages=stages)
        if cfg.smem_bytes(element_size) <= smem_limit:
            out.append(cfg)
    return out


def invariance_failures(mm: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], weight: torch.Tensor,
                        ms: tuple[int, ...] = INVARIANCE_MS, big_m: int = INVARIANCE_BIG_M,
                        offset: int = INVARIANCE_OFFSET, seed: int = 0) -> list[int]:
    """The row counts M of ms at which mm(x[offset:offset+M], weight) differs in any bit from the same rows of
    mm(x, weight) with big_m rows (empty: invariant), and -1 if a row is far from the float reference."""
    if max(ms) + offset > big_m:
        raise ValueError(f"the checked rows (up to {max(ms)} from {offset}) must lie inside the {big_m}-row call")
    g = torch.Generator(device=weight.device).manual_seed(seed)
    x = torch.randn(big_m, weight.shape[1], generator=g, device=weight.device).to(weight.dtype)
    big = mm(x, weight)
    failed = [m for m in ms if not torch.equal(mm(x[offset: offset + m], weight), big[offset: offset + m])]
    ref = x[:8].float() @ weight.float().T
    if not torch.allclose(big[:8].float(), ref, rtol=3e-2, atol=3e-2 * float(ref.abs().max())):
        failed.append(-1)
    return failed


@dataclass(frozen=True)
class Timing:
    config: BatchInvariantConfig
    us: dict[int, float]

    @property
    def score(self) -> float:
        return sum(SCORE_WEIGHTS.get(m, 1.0) * t for m, t in self.us.items())


def time_config(cfg: BatchInvariantConfig, weight: torch.Tensor, xs: dict[int, torch.Tensor]) -> Timing:
    """Microseconds per call at each row count: CUDA-graph replays after an L2 eviction on CUDA, wall time else."""
    runs = [lambda x=x: matmul(x, weight, None, cfg) for x in xs.values()]
    if weight.is_cuda:
        from radixlm.runtime.kernels.gemm.dispatch import _time_us

        l2 = torch.cuda.get_device_properties(weight.device).L2_cache_size
        words = torch.empty(max(4 * l2, 64 << 20) // 4, dtype=torch.int32, device=weight.device)
        us = _time_us(runs, lambda: torch.amax(words))
    else:
        us = []
        for run in runs:
            t0 = time.perf_counter()
            run()
            us.append((time.perf_counter() - t0) * 1e6)
    return Timing(cfg, dict(zip(xs, us)))


def sweep_shape(name: str, n: int, k: int, dtype: torch.dtype, device: torch.device, configs: list[BatchInvariantConfig],
                deadline: float, timed_ms: tuple[int, ...] = TIMED_MS) -> dict:
    """One weight shape: the default config, then the candidates until the deadline; the best invariant one."""
    g = torch.Generator(device=device).manual_seed(1)
    weight = (torch.randn(n, k, generator=g, device=device) * k**-0.5).to(dtype)
    xs = {m: torch.randn(m, k, generator=g, device=device).to(dtype) for m in timed_ms}
    default = default_config(n, k)
    tried, rejected, errors = [], [], []
    for cfg in [default] + [c for c in configs if c != default]:
        if tried and time.perf_counter() > deadline:
            break
        try:
            failed = invariance_failures(lambda x, w: matmul(x, w, None, cfg), weight)
            if failed:
                rejected.append({"config": cfg.as_dict(), "failed_m": failed})
                continue
            tried.append(time_config(cfg, weight, xs))
        except Exception as e:  # noqa: BLE001 - a candidate that does not build here (resources) is skipped
            errors.append({"config": cfg.as_dict(), "error": f"{type(e).__name__}: {str(e)[:200]}"})
    best = min(tried, key=lambda t: t.score) if tried else None
    base = next((t for t in tried if t.config == default), None)
    row = {"name": name, "n": n, "k": k, "dtype": str(dtype).removeprefix("torch."), "tried": len(tried),
           "rejected": rejected, "errors": errors,
           "timings": [{"config": t.config.as_dict(), "us": t.us, "score": t.score} for t in tried]}
    if best is not None:
        row.update(config=best.config.as_dict(), us=best.us, default_us=base.us if base else None)
    print(f"{name:13} ({n}, {k}): {len(tried)} timed, {len(rejected)} not invariant, {len(errors)} failed; best "
          f"{best.config if best else None} {best.us if best else ''} (default {base.us if base else None})",
          flush=True)
    return row


def table_entries(rows: list[dict]) -> list[dict]:
    """The table's entries ({n, k, dtype, config, us, default_us}) of the shapes with a winner."""
    return [{key: row[key] for key in ("n", "k", "dtype", "config", "us", "default_us")}
            for row in rows if "config" in row]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budget-s", type=float, default=150.0, help="no candidate starts past this many seconds")
    p.add_argument("--out", default=os.environ.get("OUT", "."), help="folder of the sweep's JSON and the table")
    p.add_argument("--install", action="store_true",
                   help="also write the table into kernels/gemm/tuned/ (what this tree's later runs read)")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    a = p.parse_args()
    if a.budget_s <= 0:
        p.error("--budget-s must be positive")
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dtype = getattr(torch, a.dtype) if cuda else torch.float32
    shapes = LLAMA_8B_SHAPES if cuda else TINY_SHAPES
    configs = candidates() if cuda else [BatchInvariantConfig(32, 32, 4, 2), BatchInvariantConfig(64, 64, 4, 3)]
    timed = TIMED_MS if cuda else (8, 70)
    t0 = time.perf_counter()
    # Each shape gets an equal share of what is left when it starts.
    rows = []
    for i, (name, (n, k)) in enumerate(shapes.items()):
        share = (a.budget_s - (time.perf_counter() - t0)) / (len(shapes) - i)
        rows.append(sweep_shape(name, n, k, dtype, device, configs, time.perf_counter() + share, timed))
    import triton

    from radixlm.runtime.kernels.gemm.cublaslt import table_path

    gpu = torch.cuda.get_device_name() if cuda else f"cpu-{platform.machine()}"
    table = {"gpu": gpu, "torch": torch.__version__, "triton": triton.__version__, "block_m": BLOCK_M,
             "score_weights": SCORE_WEIGHTS, "command": "python -m radixlm.runtime.kernels.gemm.batch_invariant_tune "
             f"--budget-s {a.budget_s:g}", "entries": table_entries(rows)}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "batch_invariant_sweep.json").write_text(json.dumps({**table, "shapes": rows,
                                                                "seconds": time.perf_counter() - t0}, indent=1))
    path = table_path(gpu, "batch_invariant")
    (out / path.name).write_text(json.dumps(table, indent=1) + "\n")
    if a.install and cuda:
        path.write_text(json.dumps(table, indent=1) + "\n")
        print(f"installed {path}", flush=True)
    print(f"wrote {out / 'batch_invariant_sweep.json'} and {out / path.name} in {time.perf_counter() - t0:.0f} s",
          flush=True)


if __name__ == "__main__":
    main()
