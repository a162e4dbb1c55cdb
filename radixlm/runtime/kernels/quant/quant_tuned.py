"""The quantized GEMM kernels' tuned configs (fp8_gemv.py, int4_skinny.py: few rows; int4_mma.py, fp8_mma.py: 5..256
rows): this
GPU model's table in kernels/gemm/tuned/quant_gemv_<GPU>.json (the tuned-table mechanism of cublaslt.table_path /
load_table; written by benchmarks/kernels/quant_gemv_sweep.py and w4a16_mma_sweep.py), looked up per GEMM call by
(kernel, N, K, row bucket, group). A GEMM with no entry takes the default paths (fp8_gemm.py, int4_gemm.py): with no table for a GPU model, nothing changes.

Entry: {"kernel": "fp8_channel" | "fp8_block" | "w4a16" | "w4a16_mma" | "fp8_mma", "n", "k", "rows": the row
bucket's bound (1, 2, 4; w4a16_mma and fp8_mma: 8, 16, 64, 256, written by quant_gemv_sweep.py --kind mma / fp8mma),
"group": 0 per channel / tensor, the block's K size (fp8_block and fp8_mma with block weights, with "block": [bn,
bk]) or the group size (w4a16),
"config": the kernel's config dataclass as a dict, and the sweep's "us", "default_us", "floor_us"}. A one-row
fp8_channel / fp8_block entry may name the steps its launch fuses, "step" (fp8_gemv.step_name, e.g.
"add_rmsnorm+rotary"; written by benchmarks/kernels/fp8_gemv_fused_sweep.py where fusing beat running the steps
unfused); without it, the plain GEMM's.
Kind "w4a16_dequant" (int4_dequant.py: dequantize, then the dense GEMM; written by benchmarks/kernels/quant_gemm.py
--w4a16-dequant) has no "rows": {"kernel", "n", "k", "group", "min_rows": the path's first row count, or null (never),
"config": int4_dequant.DequantConfig as a dict (optional: its defaults), and the benchmark's timings}."""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from radixlm.runtime.kernels.quant import tiles

KINDS = ("fp8_channel", "fp8_block", "w4a16", "w4a16_mma", "fp8_mma", "w4a16_dequant")
STEPS = ("rmsnorm", "add_rmsnorm", "silu_mul", "rotary", "rmsnorm+rotary", "add_rmsnorm+rotary")
MMA_KINDS = ("w4a16_mma", "fp8_mma")  # 5..256 rows (the buckets 8, 16, 64, 256)


@dataclass(frozen=True)
class TunedKey:
    kernel: str
    n: int
    k: int
    rows: int  # the row bucket's bound
    group: int  # 0, the FP8 block's K size, or the INT4 group size
    step: str = ""  # the steps a few-row FP8 launch fuses (fp8_gemv.step_name), "" for the plain GEMM


def parse(entries: list[dict]) -> dict[TunedKey, object]:
    """A table's entries as configs by key; a malformed entry raises ValueError naming it."""
    from radixlm.runtime.kernels.quant.fp8_gemv import MAX_ROWS as FP8_ROWS, Fp8GemvConfig
    from radixlm.runtime.kernels.quant.fp8_mma import ROW_BOUNDS as FP8_MMA_ROWS, Fp8MmaConfig
    from radixlm.runtime.kernels.quant.int4_dequant import DequantChoice, DequantConfig
    from radixlm.runtime.kernels.quant.int4_mma import ROW_BOUNDS as MMA_ROWS, Int4MmaConfig
    from radixlm.runtime.kernels.quant.int4_skinny import MAX_ROWS as INT4_ROWS, Int4GemvConfig

    out: dict[TunedKey, object] = {}
    for entry in entries:
        try:
            kernel = entry["kernel"]
            if kernel not in KINDS:
                raise ValueError(f"unknown kernel {kernel!r} (one of {KINDS})")
            if kernel == "w4a16_dequant":
                if "rows" in entry:
                    raise ValueError("a w4a16_dequant entry has min_rows, not rows")
                key = TunedKey(kernel, int(entry["n"]), int(entry["k"]), 0, int(entry["group"]))
                min_rows = entry["min_rows"]
                if min_rows is not None and (isinstance(min_rows, bool) or not isinstance(min_rows, int)):
                    raise ValueError(f"min_rows must be an integer or null, got {min_rows!r}")
                out[key] = DequantChoice(min_rows, DequantConfig(**entry.get("config", {})))
                continue
            step = entry.get("step", "")
            if step and (kernel not in ("fp8_channel", "fp8_block") or entry["rows"] != 1 or step not in STEPS):
                raise ValueError(f"a fused step ({step!r}) is one of {STEPS}, on a one-row fp8_channel / fp8_block "
                                 f"entry")
            key = TunedKey(kernel, int(entry["n"]), int(entry["k"]), int(entry["rows"]), int(entry.get("group", 0)),
                           step)
            if kernel in MMA_KINDS:
                bounds = MMA_ROWS if kernel == "w4a16_mma" else FP8_MMA_ROWS
                if key.rows not in bounds:
                    raise ValueError(f"rows {key.rows} is not one of the tensor-core kernel's buckets {bounds}")
                if kernel == "fp8_mma" and key.group not in (0, entry["config"].get("block_k")):
                    raise ValueError(f"group {key.group}: 0 (per tensor / channel) or the block's K size, which "
                                     f"is the config's block_k")
            else:
                limit = INT4_ROWS if kernel == "w4a16" else FP8_ROWS
                if key.rows not in tiles.ROW_BUCKETS or key.rows > limit:
                    raise ValueError(f"rows {key.rows} is not a row bucket's bound up to {limit}")
            cls = {"w4a16": Int4GemvConfig, "w4a16_mma": Int4MmaConfig, "fp8_mma": Fp8MmaConfig}.get(kernel,
                                                                                                Fp8GemvConfig)
            out[key] = cls(**entry["config"])
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            raise ValueError(f"bad quant_gemv tuned entry {entry}: {e}") from e
    return out


@functools.cache
def _table(device_name: str) -> dict[TunedKey, object]:
    from radixlm.runtime.kernels.gemm.cublaslt import load_table

    return parse(load_table(device_name, "quant_gemv"))


def lookup_dequant(device: torch.device, n: int, k: int, group: int):
    """The w4a16_dequant entry (int4_dequant.DequantChoice) of this GEMM on this device's GPU model, or None."""
    if device.type != "cuda":
        return None
    name = _device_name(device.index if device.index is not None else torch.cuda.current_device())
    return _table(name).get(TunedKey("w4a16_dequant", n, k, 0, group))


@functools.cache
def _device_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


def lookup(device: torch.device, kernel: str, n: int, k: int, m: int, group: int = 0, step: str = ""):
    """The tuned config of this GEMM (with `step` fused) on this device's GPU model, or None (off CUDA, no table, or
    no entry: lookup_in)."""
    if device.type != "cuda":
        return None
    name = _device_name(device.index if device.index is not None else torch.cuda.current_device())
    return lookup_in(_table(name), kernel, n, k, m, group, step)


def lookup_in(table: dict[TunedKey, object], kernel: str, n: int, k: int, m: int, group: int = 0, step: str = ""):
    """table's config for a GEMM of m rows, or None: no entry, or more rows than the kernel's buckets take (4 for the
    few-row kernels, 256 for w4a16_mma and fp8_mma)."""
    bound = tiles.ROW_BUCKETS[tiles.bucket_of(m)]
    if bound is None or bound > (256 if kernel in MMA_KINDS else 4):
        return None
    return table.get(TunedKey(kernel, n, k, bound, group, step))
