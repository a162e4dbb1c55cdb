"""W4A16's dequantize-then-GEMM path (radixlm/runtime/kernels/quant/int4_dequant.py) timed beside bf16 and the tile
kernels at many rows, and the tuned-table entries (kind w4a16_dequant) that the timings choose. Used by
benchmarks/kernels/quant_gemm.py --w4a16-dequant.

Per weight shape: the dequantization kernel alone at each DEQUANT_CONFIGS tile (into one scratch, as serving reuses
one), the fastest kept; then at each row count bf16 (F.linear: cuBLAS), the current W4A16 path (int4_gemm.w4a16_linear:
int4_mma.py's tuned kernel up to 256 rows where the table has an entry, else the tile kernel that dequantizes in its
K loop) and the dequantize-then-GEMM path, each as CUDA-graph replays over distinct weight copies (timer). The entry's
min_rows: the fewest measured rows from which the dequant path beats the current one by MARGIN at every larger
measured row count (null, never, where it does not at the largest)."""
from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
import torch.nn.functional as F

from radixlm.runtime.kernels.quant import reference as ref
from radixlm.runtime.kernels.quant.int4_dequant import DequantConfig

ROWS = (128, 256, 1024, 4096, 8192)
GROUP = 128
MARGIN = 1.03  # the dequant path is chosen where it beats the current path by 3%
DEQUANT_CONFIGS = (DequantConfig(64, 16, 4), DequantConfig(128, 16, 8), DequantConfig(32, 32, 4),
                   DequantConfig(128, 8, 4))
TOLERANCE = 2e-2
KIND = "w4a16_dequant"


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()


def time_shape(name: str, n: int, k: int, rows, device: str, dtype: torch.dtype, timer: Callable,
               configs=DEQUANT_CONFIGS, copies: int = 2, log: Callable[[str], None] = print) -> dict:
    """One weight shape's cells: {"shape", "n", "k", "config", "dequant_us" (by config), "rows": [{"rows", "bf16_us",
    "current_us", "dequant_us", "dequant_rel_err"}]}; timer(fn, copies) times fn(i) over weight copy i."""
    from radixlm.runtime.kernels.quant.int4_dequant import dequant_int4_into, w4a16_dequant_linear
    from radixlm.runtime.kernels.quant.int4_gemm import w4a16_linear

    bf16 = [torch.randn(n, k, device=device, dtype=dtype) * 0.02 for _ in range(copies)]
    int4 = [ref.quant_int4(w, GROUP, dtype=dtype) for w in bf16]
    scratch = torch.empty(n, k, device=device, dtype=dtype)
    by_cfg = {}
    for cfg in configs:
        by_cfg[cfg] = timer(lambda i, cfg=cfg: dequant_int4_into(*int4[i], GROUP, scratch, cfg), copies)
    best = min(by_cfg, key=by_cfg.get)
    out = {"shape": name, "n": n, "k": k, "group": GROUP, "config": dataclasses.asdict(best),
           "dequant_only_us": [{"config": dataclasses.asdict(c), "us": round(t, 2)} for c, t in by_cfg.items()],
           "rows": []}
    for m in rows:
        x = torch.randn(m, k, device=device, dtype=dtype)
        dq = lambda i: w4a16_dequant_linear(x, *int4[i], GROUP, None, None, scratch, best)  # noqa: E731
        cell = {"rows": m, "bf16_us": timer(lambda i: F.linear(x, bf16[i]), copies),
                "current_us": timer(lambda i: w4a16_linear(x, *int4[i], GROUP), copies),
                "dequant_us": timer(dq, copies),
                "dequant_rel_err": rel_err(dq(0), ref.int4_linear(x.float(), *[t.float() if t.is_floating_point()
                                                                               else t for t in int4[0]], GROUP))}
        cell["ok"] = cell["dequant_rel_err"] <= TOLERANCE
        out["rows"].append(cell)
        log(f"{name:>13} rows {m:>5}: bf16 {cell['bf16_us']:9.1f} | W4A16 now {cell['current_us']:9.1f} | dequant+GEMM "
            f"{cell['dequant_us']:9.1f} (dequant alone {by_cfg[best]:.1f}) | err {cell['dequant_rel_err']:.2g}")
    return out


def min_rows(cells: list[dict], margin: float = MARGIN) -> int | None:
    """The fewest measured rows from which the dequant path wins by margin at every larger count; None if it loses
    at the largest (or a result was wrong)."""
    chosen = None
    for cell in sorted(cells, key=lambda c: -c["rows"]):
        if not cell.get("ok", True) or cell["dequant_us"] * margin >= cell["current_us"]:
            break
        chosen = cell["rows"]
    return chosen


def table_entry(shape: dict) -> dict:
    cells = shape["rows"]
    return {"kernel": KIND, "n": shape["n"], "k": shape["k"], "group": shape["group"], "min_rows": min_rows(cells),
            "config": shape["config"],
            "us_by_rows": {str(c["rows"]): round(c["dequant_us"], 2) for c in cells},
            "current_us_by_rows": {str(c["rows"]): round(c["current_us"], 2) for c in cells},
            "bf16_us_by_rows": {str(c["rows"]): round(c["bf16_us"], 2) for c in cells}}


def merged_table(old: dict, entries: list[dict], command: str, gpu: str) -> dict:
    """The committed table (old: its JSON, {} if none) with the w4a16_dequant entries of the measured (n, k, group)
    replaced by `entries`; every other entry kept."""
    def key(e: dict) -> tuple:
        return int(e["n"]), int(e["k"]), int(e.get("group", 0))

    gone = {key(e) for e in entries}
    kept = [e for e in old.get("entries", []) if e["kernel"] != KIND or key(e) not in gone]
    return {**{k: v for k, v in old.items() if k != "entries"}, "gpu": gpu,
            "commands": [*old.get("commands", []), command], "entries": kept + entries}


def layer_sums(shapes: list[dict], names) -> list[dict]:
    """Per row count with every named shape measured: bf16, the current path, the dequant path and the faster of the
    two W4A16 paths, summed over the layer's GEMMs."""
    out = []
    rows = sorted({c["rows"] for s in shapes for c in s["rows"]})
    for m in rows:
        cells = [c for s in shapes if s["shape"] in names for c in s["rows"] if c["rows"] == m]
        if len(cells) < len(names):
            continue
        row = {"rows": m}
        for key in ("bf16_us", "current_us", "dequant_us"):
            row[key] = round(sum(c[key] for c in cells), 2)
        row["best_us"] = round(sum(min(c["current_us"], c["dequant_us"]) for c in cells), 2)
        row["best_vs_bf16"] = round(row["best_us"] / row["bf16_us"], 3)
        out.append(row)
    return out


def write_table(out_dir: Path, table_file: str, table: dict, install: Path | None) -> list[Path]:
    """The merged table into out_dir (and over `install`, the engine's own file, where given)."""
    text = json.dumps(table, indent=1) + "\n"
    paths = [out_dir / table_file] + ([install] if install is not None else [])
    for p in paths:
        p.write_text(text)
    return paths


def run(shapes: Iterable[tuple[str, int, int]], layer: tuple[str, ...], rows, out_dir: Path, timer: Callable,
        dry: bool, install: bool, copy_bytes: int, command: str, tree: str | None, t0: float) -> dict:
    """quant_gemm.py --w4a16-dequant: each (name, n, k) shape timed (a lazy iterable: the caller's budget), then
    out_dir/w4a16_dequant.json and out_dir/quant_gemv_<GPU>.json (the engine's table with the measured shapes'
    entries; install: written over the engine's too). dry: the CPU under TRITON_INTERPRET=1, float32."""
    from radixlm.runtime.kernels.gemm.cublaslt import table_path

    gpu = "cpu (dry)" if dry else torch.cuda.get_device_name()
    device, dtype = ("cpu", torch.float32) if dry else ("cuda", torch.bfloat16)
    result = {"benchmark": "w4a16_dequant", "gpu": gpu, "torch": torch.__version__, "command": command, "tree": tree,
              "group": GROUP, "margin": MARGIN, "shapes": []}
    for name, n, k in shapes:
        copies = 2 if dry else max(2, min(16, -(-copy_bytes // (2 * n * k))))
        result["shapes"].append(time_shape(name, n, k, rows, device, dtype, timer,
                                           DEQUANT_CONFIGS[:2] if dry else DEQUANT_CONFIGS, copies))
        if not dry:
            torch.cuda.empty_cache()
        (out_dir / "w4a16_dequant.json").write_text(json.dumps(result, indent=1) + "\n")
    result["layer"] = layer_sums(result["shapes"], layer)
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    result["entries"] = entries = [table_entry(s) for s in result["shapes"]]
    (out_dir / "w4a16_dequant.json").write_text(json.dumps(result, indent=1) + "\n")
    engine_table = table_path(gpu, "quant_gemv")
    old = json.loads(engine_table.read_text()) if engine_table.exists() and not dry else {}
    written = write_table(out_dir, engine_table.name, merged_table(old, entries, command, gpu),
                          engine_table if install and not dry else None)
    print("\none layer's GEMMs (us): rows | bf16 | W4A16 now | dequant+GEMM | the faster W4A16 (x bf16)")
    for row in result["layer"]:
        print(f"rows {row['rows']:>5} | {row['bf16_us']:9.1f} | {row['current_us']:9.1f} | {row['dequant_us']:9.1f} | "
              f"{row['best_us']:9.1f} ({row['best_vs_bf16']:.2f}x)")
    bad = sum(not c["ok"] for s in result["shapes"] for c in s["rows"])
    print("min_rows by shape: " + ", ".join(f"{s['shape']} {e['min_rows']}" for s, e in zip(result["shapes"], entries))
          + f"\nwrong results: {bad}; table -> " + ", ".join(map(str, written)) + f"; {result['wall_s']:.0f} s")
    return result
