"""What kernels/quant_gemv_sweep.py's kinds share: the run's setup, bf16's candidates, --kind gemv's candidate configs,
one candidate's checked cell,
the tensor-core kinds' sweep by row bucket (--kind mma: W4A16; --kind fp8mma: FP8 W8A8), and the tuned table's
merge and file."""
from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable
from enum import Enum
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.lib.gpu_timing import SHAPES, tree, within_budget
from radixlm.runtime.kernels.quant import reference as ref, tiles

# The formats as the kernel benchmarks measure them (kernels/quant_gemm.py, quant_gemv_sweep.py, quant_moe.py).
HBM_TB_S = 4.8  # the H200's HBM3e, by the datasheet
GROUP = 128  # W4A16's group
BLOCK = (128, 128)  # FP8 block scales
TOLERANCE = 2e-2  # max |error| / max |reference| of a correct kernel


def weight_bytes(fmt: str, n: int, k: int) -> int:
    """An (n, k) weight's bytes in `fmt` (bf16, fp8_channel*, fp8_block*, w4a16*: a forced variant's suffix aside)."""
    fmt = fmt.removesuffix("_mma").removesuffix("_gemv").removesuffix("_w8a8")
    if fmt == "bf16":
        return 2 * n * k
    if fmt.startswith("fp8_channel"):
        return n * k + 4 * n
    if fmt == "fp8_block":
        return n * k + 4 * -(-n // BLOCK[0]) * -(-k // BLOCK[1])
    return n * k // 2 + 2 * 2 * (k // GROUP) * n  # packed INT4 + bf16 scales and zeros


def floor_us(fmt: str, n: int, k: int, m: int) -> float:
    """The weight with its scales and m rows of bf16 input and output, read once at HBM_TB_S."""
    return (weight_bytes(fmt, n, k) + 2 * m * (k + n)) / (HBM_TB_S * 1e12) * 1e6


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()


LAYER = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
MARGIN = 1.03  # a table entry only where the candidate beats the default path by this much
KERNEL_ROWS = 4  # the few-row CUDA-core kernels' most rows
PROGRAMS_PER_SM = 4  # the split-K candidates bring N's programs up to this many an SM
# The packed W4A16 kernel (int4_packed.py) holds fewer registers (sm_90a, one row: 112 at 512 x 32 on four warps,
# 128 at 512 x 64, 253 at 128 x 128 on one warp; the float32 kernel 255 at 512 x 64), so more of its programs share an
# SM: its candidates also split K to twice as many programs, up to 32 splits (N = 4096 at 512 columns a program and 16
# splits is 128 programs, one an SM).
PACKED_PROGRAMS_PER_SM = (4, 8)
PACKED_MAX_SPLIT = 32


def fp8_candidates(rows: int) -> list[tuple[int, int]]:
    """(BLOCK_N, num_warps); BLOCK_K is 256 x num_warps: the weight words' layout then matches x's 16-byte loads
    (fp8_gemv._fp8_gemv_kernel), no shared-memory conversion in the K loop."""
    return {1: [(4, 4), (8, 4), (4, 8), (8, 2)], 2: [(4, 4), (8, 4), (4, 8)], 4: [(2, 4), (4, 4), (2, 8)]}[rows]


def int4_candidates(rows: int) -> list[tuple[int, int, int, bool]]:
    """(BLOCK_N, BLOCK_K, num_warps, packed): 4 words (16 bytes) a thread along N. BLOCK_N = 128 x num_warps puts every
    warp along N, so that the scales' and zeros' loads share the words' layout (otherwise converted through shared
    memory each tile). The float32 kernel's (packed False): the configs the H200's table holds; the packed kernel's:
    bytes in flight an SM from ~40 KB (512 x 32, five programs) to ~64 KB (128 x 128 on one warp, eight programs of
    254 registers), and narrower programs (more of them) for the N = 4096 shapes; its splits may leave one tile a
    program (all of a program's weight loaded at once)."""
    return {1: [(512, 64, 4, False), (512, 64, 4, True), (512, 32, 4, True), (256, 64, 2, True), (128, 64, 1, True),
                (128, 128, 1, True)],
            2: [(512, 32, 4, False), (1024, 32, 8, False), (512, 64, 4, True), (256, 64, 2, True)],
            4: [(512, 32, 4, False), (1024, 32, 8, False), (512, 32, 4, True), (256, 32, 2, True)]}[rows]


def splits(n: int, k: int, block_n: int, block_k: int, sms: int, per_sm: tuple[int, ...] = (PROGRAMS_PER_SM,),
           unsplit: bool = True, most: int = 16, min_tiles: int = 2) -> list[int]:
    """No split (unless not unsplit), and the splits (at most `most`) that bring N's programs to per_sm programs an
    SM (at least min_tiles tiles each)."""
    programs = -(-n // block_n)
    k_tiles = -(-k // block_k)
    wants = {min(most, max(1, (p * sms) // programs), max(1, k_tiles // min_tiles)) for p in per_sm}
    return sorted(wants | ({1} if unsplit else set()))


def gemv_configs(fmt: str, rows: int, n: int, k: int, sms: int, dry: bool) -> list:
    """--kind gemv's candidates at this shape and row count (none past KERNEL_ROWS)."""
    from radixlm.runtime.kernels.quant.fp8_gemv import Fp8GemvConfig
    from radixlm.runtime.kernels.quant.int4_skinny import Int4GemvConfig

    if rows > KERNEL_ROWS:
        return []
    out = []
    if fmt.startswith("fp8"):
        for bn, warps in fp8_candidates(rows):
            bk = 256 * warps if not dry else 64
            out += [Fp8GemvConfig(bn, bk, s, warps if not dry else 1, 1) for s in splits(n, k, bn, bk, sms)]
    else:
        first_packed = True
        for bn, bk, warps, packed in int4_candidates(rows):
            bn, warps = (bn, warps) if not dry else (16, 1)
            if not packed:
                out += [Int4GemvConfig(bn, bk, s, warps, 1) for s in splits(n, k, bn, bk, sms)]
                continue
            # the split summed in the kernel (fused_reduce), and for the first packed shape by reduce_splits too
            for s in splits(n, k, bn, bk, sms, PACKED_PROGRAMS_PER_SM, False, PACKED_MAX_SPLIT, 1):
                out += [Int4GemvConfig(bn, bk, s, warps, 1, True, fused) for fused in
                        ((s > 1,) if not first_packed else tuple({s > 1, False}))]
            first_packed = False
    return list(dict.fromkeys(out))


@dataclasses.dataclass(frozen=True)
class Setup:
    """What every cell of one run shares."""
    dry: bool
    device: str
    dtype: torch.dtype
    sms: int
    timer: object  # graph_us, or wall_us in a dry run
    quick: object  # quick_us, or wall_us in a dry run


def config_dict(cfg) -> dict:
    """A kernel config as its table entry's "config" (enums by value)."""
    return {f.name: (v.value if isinstance(v := getattr(cfg, f.name), Enum) else v) for f in dataclasses.fields(cfg)}


def bf16_kernels(m: int):
    """The bf16 candidates at m rows: cuBLAS, and the skinny Triton kernels where they take m rows."""
    out = {"cublas": lambda x, w: F.linear(x, w)}
    if not torch.cuda.is_available():
        return out
    from radixlm.runtime.kernels.gemm import skinny_gemm, skinny_mma

    if m <= skinny_gemm.SKINNY_MAX_M:
        out["skinny"] = lambda x, w: skinny_gemm.skinny_linear(x, w)
    if skinny_mma.MMA_MIN_M <= m <= skinny_mma.MMA_MAX_M:
        out["skinny_mma"] = lambda x, w: skinny_mma.skinny_mma_linear(x, w)
    return out


def bf16_best(x: torch.Tensor, weights: list, m: int, setup: Setup) -> dict[str, float]:
    """Every bf16 candidate's time at m rows (graph-timed)."""
    return {kn: setup.timer(lambda i, f=f: f(x, weights[i]), len(weights)) for kn, f in bf16_kernels(m).items()}


def try_candidate(run: Callable, want: Callable, x: torch.Tensor, weights: list, cfg, timer) -> dict:
    """One candidate's cell: its error against the reference (want(x, weight)), then (when correct) its time (run(x,
    weight, cfg)); a config that does not build or launch here gets the error instead."""
    cell = {"config": config_dict(cfg)}
    try:
        cell["rel_err"] = rel_err(run(x, weights[0], cfg), want(x, weights[0]))
        if cell["rel_err"] > TOLERANCE:
            cell["error"] = "wrong result"
        else:
            cell["us"] = timer(lambda i: run(x, weights[i], cfg), len(weights))
    except Exception as e:  # noqa: BLE001 - a config that does not build or launch here is skipped
        cell["error"] = f"{type(e).__name__}: {str(e)[:200]}"
    return cell


def fp8_exact_x(m: int, k: int, device: str, dtype: torch.dtype) -> torch.Tensor:
    """A dry run's FP8 activations: on e4m3's grid times 2^-6 with every 128-channel group's maximum 448 (its scales
    exact), since Triton 3.9's interpreter rounds to e4m3 wrongly across 128 (tests/.../test_fp8_mma.py)."""
    v = (torch.randn(m, k) * 100).to(ref.FP8_DTYPE).float()
    v[:, ::128] = ref.FP8_MAX
    return (v * 2.0 ** -6).to(device=device, dtype=dtype)


def shape_weights(name: str, setup: Setup) -> tuple[int, int, int, list[torch.Tensor]]:
    """A shape's (n, k) (a dry run's shrunk), and enough distinct bf16 weight copies that a graph of one call a copy
    reads each from HBM."""
    n, k = SHAPES[name]
    if setup.dry:
        n, k = n // 64, max(128, k // 32 // 128 * 128)
    copies = 2 if setup.dry else max(2, min(16, -(-600_000_000 // (2 * n * k))))
    return n, k, copies, [torch.randn(n, k, device=setup.device, dtype=setup.dtype) * 0.02 for _ in range(copies)]


def rows_x(m: int, k: int, setup: Setup, fmt: str) -> torch.Tensor:
    """m rows of activations (a dry run's FP8 ones exactly representable: fp8_exact_x)."""
    if setup.dry and fmt.startswith("fp8"):
        return fp8_exact_x(m, k, setup.device, setup.dtype)
    return torch.randn(m, k, device=setup.device, dtype=setup.dtype)


@dataclasses.dataclass(frozen=True)
class BucketFormat:
    """One format a tensor-core kind sweeps: its table kind and group, its weights, the current path (default), the
    candidate kernel, the reference, and the configs timed at m rows."""
    name: str  # the format's name (weight_bytes': the floor's bytes)
    kernel: str  # the table's kind
    group: int
    make: Callable  # bf16 (n, k) weight -> the format's weight tuple
    default: Callable  # (x, weight) -> y: today's path at these rows (no table)
    candidate: Callable  # (x, weight, cfg) -> y
    want: Callable  # (x, weight) -> the reference's y
    configs: Callable  # (m, k, dry) -> configs
    extra: dict = dataclasses.field(default_factory=dict)  # the table entry's other keys (fp8 blocks: "block")


def sweep_buckets(args, setup: Setup, result: dict, save, formats: list[BucketFormat]) -> tuple[list[dict], set]:
    """Per shape and row count bf16's best, each format's default path and its candidates (quick-timed); then per
    format and row bucket (tiles.ROW_BUCKETS 8, 16, 64, 256) the config with the least summed quick time over the
    bucket's row counts, timed again as the default was, an entry where that sum beats the default's by MARGIN."""
    entries, swept = [], set()
    result["buckets"] = []
    for name in within_budget(args.shapes, args.t0, args.budget_s):
        n, k, copies, bf16 = shape_weights(name, setup)
        weights = {f.name: [f.make(w) for w in bf16] for f in formats}
        by_cfg: dict[tuple[str, int, object], dict[int, float]] = {}
        defaults: dict[tuple[str, int], dict[int, float]] = {}
        for m in args.rows:
            x = rows_x(m, k, setup, formats[0].name)
            times = bf16_best(x, bf16, m, setup)
            b_kernel = min(times, key=times.get)
            bucket = tiles.ROW_BUCKETS[tiles.bucket_of(m)]
            for f in formats:
                ws = weights[f.name]
                floor = floor_us(f.name, n, k, m)
                default_us = setup.timer(lambda i: f.default(x, ws[i]), copies)
                defaults.setdefault((f.name, bucket), {})[m] = default_us
                row = {"format": f.name, "shape": name, "n": n, "k": k, "rows": m, "bf16_kernel": b_kernel,
                       "bf16_us": times[b_kernel], "default_us": default_us,
                       "default_rel_err": rel_err(f.default(x, ws[0]), f.want(x, ws[0])), "floor_us": floor,
                       "candidates": []}
                for cfg in f.configs(m, k, setup.dry):
                    cell = try_candidate(f.candidate, f.want, x, ws, cfg, setup.quick)
                    if "us" in cell:
                        by_cfg.setdefault((f.name, bucket, cfg), {})[m] = cell["us"]
                    row["candidates"].append(cell)
                timed = [c for c in row["candidates"] if "us" in c]
                best = min(timed, key=lambda c: c["us"]) if timed else None
                row["best_us"], row["best_config"] = (best["us"], best["config"]) if best else (None, None)
                result["cells"].append(row)
                print(f"{f.name:>11} {name:>12} rows {m:>3}: bf16 {b_kernel} {times[b_kernel]:7.1f} | default "
                      f"{default_us:7.1f} | best " + (f"{best['us']:7.1f} {best['config']}" if best else "none")
                      + f" | floor {floor:.1f}", flush=True)
        for (fname, bucket), per_m in defaults.items():
            f = next(f for f in formats if f.name == fname)
            fits = {cfg: t for (fn, b, cfg), t in by_cfg.items()
                    if (fn, b) == (fname, bucket) and t.keys() == per_m.keys()}
            swept.add((f.kernel, n, k, bucket, f.group))
            if not fits:
                continue
            cfg = min(fits, key=lambda c: sum(fits[c].values()))
            timed = {}  # the choice timed again as the default was (graph_us), at each of the bucket's row counts
            for m_b in per_m:
                x = torch.randn(m_b, k, device=setup.device, dtype=setup.dtype)
                timed[m_b] = setup.timer(lambda i, x=x, cfg=cfg: f.candidate(x, weights[fname][i], cfg), copies)
            result["buckets"].append({"format": fname, "shape": name, "bucket": bucket, "config": config_dict(cfg),
                                      "quick_us_by_rows": fits[cfg], "us_by_rows": timed,
                                      "default_us_by_rows": per_m})
            x_rows = max(per_m)
            if sum(timed.values()) * MARGIN < sum(per_m.values()):
                entries.append({"kernel": f.kernel, "n": n, "k": k, "rows": bucket, "group": f.group, **f.extra,
                                "config": config_dict(cfg), "us": round(timed[x_rows], 2),
                                "default_us": round(per_m[x_rows], 2),
                                "floor_us": round(floor_us(fname, n, k, x_rows), 2)})
        bf16 = weights = None  # (frees the copies before the next shape)
        save()
    return entries, swept


def parse_vary(specs: list[str]) -> dict[str, list]:
    """--vary's FIELD=V1,V2 specs: true/false as bools, digits as ints."""
    def value(v: str):
        return {"true": True, "false": False}.get(v.lower(), int(v) if v.lstrip("-").isdigit() else v)

    out = {}
    for spec in specs:
        field, _, values = spec.partition("=")
        if not field or not values:
            raise ValueError(f"--vary takes FIELD=V1,V2,...; got {spec!r}")
        out[field] = [value(v) for v in values.split(",")]
    return out


def vary_buckets(args, setup: Setup, result: dict, save, formats: list[BucketFormat]) -> None:
    """kernels/quant_gemv_sweep.py --vary FIELD=V1,V2 (args.vary: parse_vary's): at each shape and row count, the
    tuned table's config for the GEMM (a dry run: the first candidate) timed as sweep_buckets times its choices, and
    again with one field changed to each value; no table is written. A field's measured A/B around the tuned point,
    without a whole sweep."""
    from radixlm.runtime.kernels.quant import quant_tuned

    for name in within_budget(args.shapes, args.t0, args.budget_s):
        n, k, _copies, bf16 = shape_weights(name, setup)
        for f in formats:
            ws = [f.make(w) for w in bf16]
            for m in args.rows:
                x = rows_x(m, k, setup, f.name)
                base = (f.configs(m, k, True)[0] if setup.dry
                        else quant_tuned.lookup(x.device, f.kernel, n, k, m, f.group))
                if base is None:
                    print(f"{f.name:>11} {name:>12} rows {m:>3}: no table entry", flush=True)
                    continue
                variants = [base] + [dataclasses.replace(base, **{field: v}) for field, values in args.vary.items()
                                     for v in values if getattr(base, field) != v]
                cells = [try_candidate(f.candidate, f.want, x, ws, cfg, setup.timer) for cfg in variants]
                result["cells"].append({"format": f.name, "shape": name, "n": n, "k": k, "rows": m,
                                        "floor_us": floor_us(f.name, n, k, m), "candidates": cells})
                print(f"{f.name:>11} {name:>12} rows {m:>3}: " + " | ".join(
                    f"{c.get('us', float('nan')):7.2f} " + ("table" if i == 0 else ", ".join(
                        f"{fd}={c['config'][fd]}" for fd in args.vary if c["config"][fd] != cells[0]["config"][fd]))
                    + (f" ({c['error']})" if "error" in c else "") for i, c in enumerate(cells)), flush=True)
        bf16 = None
        save()


def merge_entries(old: list[dict], new: list[dict], swept: set[tuple] = frozenset()) -> list[dict]:
    """The committed table's entries with those of the same (kernel, n, k, rows, group, step) as a new entry, or in
    `swept` (measured again, no longer beating the default; a step-less key stands for step ""), replaced by the new
    ones."""
    def key(e: dict) -> tuple:
        return e["kernel"], int(e["n"]), int(e["k"]), int(e.get("rows", 0)), int(e.get("group", 0)), e.get("step", "")

    gone = {key(e) for e in new} | {s if len(s) == 6 else (*s, "") for s in swept}
    return [e for e in old if key(e) not in gone] + list(new)


def write_table(out_dir: Path, setup: Setup, gpu: str, entries: list[dict], swept: set[tuple],
                script: str = "benchmarks/kernels/quant_gemv_sweep.py") -> Path:
    """The committed table (none in a dry run) with the swept entries replaced; this run's versions and tree, its
    command after the earlier ones."""
    import triton

    from radixlm.runtime.kernels.gemm.cublaslt import load_table, table_path

    committed = [] if setup.dry else load_table(gpu, "quant_gemv")
    old = json.loads(table_path(gpu, "quant_gemv").read_text()) if committed else {}
    table = {"gpu": gpu, "torch": torch.__version__, "triton": triton.__version__, "margin": MARGIN,
             "commands": [*old.get("commands", []),
                          " ".join([script, *sys.argv[1:]])],
             "tree": tree(), "entries": merge_entries(committed, entries, swept)}
    table_file = out_dir / table_path(gpu if not setup.dry else "cpu dry", "quant_gemv").name
    table_file.write_text(json.dumps(table, indent=1) + "\n")
    return table_file
