"""The batch-invariant GEMM's tuning sweep: for each weight shape, candidate tile configurations (per weight, never
per M) are first checked to keep every row's output independent of M (rows computed at M = 1, 7, 64 and 256 bitwise
equal to the same rows inside a call of INVARIANCE_BIG_M rows, at another tile position); a candidate that fails is
rejected, the others are timed at M = 8, 64, 256 and 2048 as CUDA-graph replays after an L2 eviction (dispatch's
timing). The best by Timing.score is written to this GPU model's table (tuned/batch_invariant_<GPU>.json), which
batch_invariant_mm.config_for reads.

    python -m radixlm.runtime.kernels.gemm.batch_invariant_tune --budget-s 150 --out $OUT --install

Without CUDA (TRITON_INTERPRET=1: a dry run) the shapes are tiny, three candidates, and the "timing" is wall time."""
from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from radixlm.runtime.kernels.gemm.batch_invariant_mm import (
    DEFAULT_NARROW, DEFAULT_WIDE, BatchInvariantConfig, default_config, matmul,
)
from radixlm.runtime.kernels.tune_cli import parse_tune_args, write_tune_outputs

# Llama-3.1-8B's GEMMs (N, K): qkv, o, gate_up, down, lm_head.
LLAMA_8B_SHAPES = {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up_proj": (28672, 4096),
                   "down_proj": (4096, 14336), "lm_head": (128256, 4096)}
TINY_SHAPES = {"tiny": (96, 128)}
INVARIANCE_MS = (1, 7, 64, 256)
INVARIANCE_BIG_M = 300  # not a multiple of a tile's rows: the checked rows sit at other positions of other tiles
INVARIANCE_OFFSET = 37
TIMED_MS = (8, 64, 256, 2048)
# The ShareGPT-like workload's GEMM calls (issue 55's cost: 1000 requests, radixlm.bench.datasets' lengths, all
# admitted at once: 1024 decode passes of 1000 down to 1 rows, 196k prompt tokens in 8192-row prefill passes), each
# pass's time interpolated linearly between the timed row counts (constant below 8, proportional past 2048) and the
# coefficients summed per timed count, over the 8-row one's: 553 passes of few rows, 194 / 236 around 64 / 256 rows,
# and 136 units of 2048 rows (prefill 96 of them). Timing 8 rows stands for the long tail of small decode batches.
SCORE_WEIGHTS = {8: 1.0, 64: 0.35, 256: 0.43, 2048: 0.25}
SMEM_LIMIT = 227 * 1024  # Hopper's opt-in shared memory per block


def candidates(element_size: int = 2, smem_limit: int = SMEM_LIMIT) -> list[BatchInvariantConfig]:
    """The sweep's configurations that fit in shared memory, most promising first (the budget cuts the tail): the
    defaults, then wide and narrow tiles of 64 and 128 K, then the rest of the grid."""
    first = [DEFAULT_NARROW, DEFAULT_WIDE] + [BatchInvariantConfig(*c) for c in (
        (128, 128, 4, 3), (64, 64, 4, 4), (128, 64, 8, 4), (256, 64, 8, 3), (32, 128, 4, 4), (128, 128, 8, 3),
        (128, 64, 8, 4, 8, 128), (64, 64, 8, 4, 8, 128), (256, 64, 8, 3, 8, 128), (128, 128, 8, 3, 8, 128),
        (64, 128, 4, 4, 8, 64, 2), (64, 128, 4, 4, 8, 64, 4), (32, 128, 4, 4, 8, 64, 2), (128, 64, 4, 4, 8, 64, 2),
        (64, 128, 4, 3), (64, 256, 4, 3), (256, 64, 4, 3), (32, 256, 4, 4))]
    # Few rows are weight-bound and a 64-wide tile of a 4096-output weight is 64 programs on 132 SMs: narrower tiles
    # (16, 32) give more programs, deeper pipelines (5-6 stages, K steps to 512) more bytes in flight each; none splits
    # K. Then the large-M winners split in 2-3 K parts (more programs at few rows, the same tile at many).
    first += [BatchInvariantConfig(*c) for c in (
        (32, 128, 4, 6), (16, 128, 4, 6), (16, 256, 4, 4), (16, 256, 4, 5), (64, 128, 4, 6), (32, 512, 4, 2),
        (16, 512, 4, 2), (64, 64, 4, 6), (128, 64, 8, 5, 8, 128, 2), (128, 64, 8, 5, 8, 128, 3),
        (128, 64, 4, 3, 8, 128, 2), (128, 128, 8, 4, 8, 64, 2))]
    # split_k: more programs for few rows and narrow weights, at the partials' traffic for many rows.
    # 128-row tiles read a weight tile once for twice the rows (half the L2 traffic at 256 rows), at twice the MMA
    # work of a few-row pass.
    grid = [BatchInvariantConfig(bn, bk, warps, stages, 8, bm)
            for bm, bn, bk, warps, stages in itertools.product((64, 128), (64, 128, 32, 256), (64, 128, 256), (4, 8),
                                                               (4, 3, 5, 2))
            if not (bn == 32 and warps == 8)]
    out: list[BatchInvariantConfig] = []
    for cfg in first + grid:
        if cfg not in out and cfg.smem_bytes(element_size) <= smem_limit:
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


@dataclass
class ShapeSweep:
    """One weight shape's state in the sweep: its operands and what each candidate gave."""

    name: str
    weight: torch.Tensor
    xs: dict[int, torch.Tensor]
    tried: list[Timing] = field(default_factory=list)
    rejected: list[dict] = field(default_factory=list)
    errors: list[dict] = field(default_factory=list)

    @classmethod
    def make(cls, name: str, n: int, k: int, dtype: torch.dtype, device: torch.device,
             timed_ms: tuple[int, ...]) -> "ShapeSweep":
        g = torch.Generator(device=device).manual_seed(1)
        weight = (torch.randn(n, k, generator=g, device=device) * k**-0.5).to(dtype)
        return cls(name, weight, {m: torch.randn(m, k, generator=g, device=device).to(dtype) for m in timed_ms})

    def run(self, cfg: BatchInvariantConfig) -> None:
        """Checks cfg's invariance on this weight, and times it if it keeps it."""
        try:
            failed = invariance_failures(lambda x, w: matmul(x, w, None, cfg), self.weight)
            if failed:
                self.rejected.append({"config": cfg.as_dict(), "failed_m": failed})
                return
            self.tried.append(time_config(cfg, self.weight, self.xs))
        except Exception as e:  # noqa: BLE001 - a candidate that does not build here (resources) is skipped
            self.errors.append({"config": cfg.as_dict(), "error": f"{type(e).__name__}: {str(e)[:200]}"})

    def result(self) -> dict:
        n, k = self.weight.shape
        default = default_config(n, k)
        best = min(self.tried, key=lambda t: t.score) if self.tried else None
        base = next((t for t in self.tried if t.config == default), None)
        row = {"name": self.name, "n": n, "k": k, "dtype": str(self.weight.dtype).removeprefix("torch."),
               "tried": len(self.tried), "rejected": self.rejected, "errors": self.errors,
               "timings": [{"config": t.config.as_dict(), "us": t.us, "score": t.score} for t in self.tried]}
        if best is not None:
            row.update(config=best.config.as_dict(), us=best.us, default_us=base.us if base else None)
        print(f"{self.name:13} ({n}, {k}): {len(self.tried)} timed, {len(self.rejected)} not invariant, "
              f"{len(self.errors)} failed; best {best.config if best else None} {best.us if best else ''} "
              f"(default {base.us if base else None})", flush=True)
        return row


def sweep(shapes: dict[str, tuple[int, int]], dtype: torch.dtype, device: torch.device,
          configs: list[BatchInvariantConfig], budget_s: float, timed_ms: tuple[int, ...] = TIMED_MS) -> list[dict]:
    """Each candidate in order on every shape (a Triton build serves them all), until budget_s is spent; the shapes'
    defaults always run."""
    t0 = time.perf_counter()
    states = [ShapeSweep.make(name, n, k, dtype, device, timed_ms) for name, (n, k) in shapes.items()]
    defaults = list(dict.fromkeys(default_config(*s.weight.shape) for s in states))
    needed = set(defaults)
    for cfg in defaults + [c for c in configs if c not in needed]:
        if time.perf_counter() - t0 > budget_s and not needed:
            print(f"budget of {budget_s:g} s spent: {len(states[0].tried) + len(states[0].rejected)} candidates run",
                  flush=True)
            break
        needed.discard(cfg)
        for state in states:
            state.run(cfg)
    return [state.result() for state in states]


def table_entries(rows: list[dict]) -> list[dict]:
    """The table's entries ({n, k, dtype, config, us, default_us}) of the shapes with a winner."""
    return [{key: row[key] for key in ("n", "k", "dtype", "config", "us", "default_us")}
            for row in rows if "config" in row]


def main() -> None:
    run = parse_tune_args(__doc__, 150.0, "kernels/gemm/tuned/")
    a, cuda, device, dtype, gpu = run.args, run.cuda, run.device, run.dtype, run.gpu
    shapes = LLAMA_8B_SHAPES if cuda else TINY_SHAPES
    configs = (candidates() if cuda else
               [BatchInvariantConfig(32, 32, 4, 2), BatchInvariantConfig(32, 32, 4, 2, split_k=2)])
    timed = TIMED_MS if cuda else (8, 70)
    t0 = time.perf_counter()
    rows = sweep(shapes, dtype, device, configs, a.budget_s, timed)
    import triton

    from radixlm.runtime.kernels.gemm.cublaslt import table_path

    table = {"gpu": gpu, "torch": torch.__version__, "triton": triton.__version__,
             "score_weights": SCORE_WEIGHTS, "command": "python -m radixlm.runtime.kernels.gemm.batch_invariant_tune "
             f"--budget-s {a.budget_s:g}", "entries": table_entries(rows)}
    path = table_path(gpu, "batch_invariant")
    out = write_tune_outputs(run, "batch_invariant_sweep.json", {"shapes": rows, "seconds": time.perf_counter() - t0},
                             table, path)
    print(f"wrote {out / 'batch_invariant_sweep.json'} and {out / path.name} in {time.perf_counter() - t0:.0f} s",
          flush=True)


if __name__ == "__main__":
    main()
