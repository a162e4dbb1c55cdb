"""The command line and outputs the kernels' batch-invariant sweeps share (gemm/batch_invariant_tune.py,
attention/fixed_split_tune.py): --budget-s, --out, --install, --dtype; the sweep's JSON and its table written under
--out, the table also installed into the tree where asked, on CUDA only (a table is per GPU model)."""
from __future__ import annotations

import argparse
import json
import os
import platform
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class TuneRun:
    """What a sweep's main needs from its command line and machine (parse_tune_args sets every field)."""
    args: argparse.Namespace
    cuda: bool
    device: torch.device
    dtype: torch.dtype  # float32 without CUDA (the interpreter's dry run)
    gpu: str  # the table's GPU model (cpu-<machine> without CUDA)


def parse_tune_args(description: str, default_budget_s: float, table_dir: str) -> TuneRun:
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budget-s", type=float, default=default_budget_s, help="no candidate starts past this many seconds")
    p.add_argument("--out", default=os.environ.get("OUT", "."), help="folder of the sweep's JSON and the table")
    p.add_argument("--install", action="store_true",
                   help=f"also write the table into {table_dir} (what this tree's later runs read)")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    a = p.parse_args()
    if a.budget_s <= 0:
        p.error("--budget-s must be positive")
    cuda = torch.cuda.is_available()
    return TuneRun(a, cuda, torch.device("cuda" if cuda else "cpu"), getattr(torch, a.dtype) if cuda else torch.float32,
                   torch.cuda.get_device_name() if cuda else f"cpu-{platform.machine()}")


def write_tune_outputs(run: TuneRun, sweep_name: str, sweep: dict, table: dict, table_path: Path,
                       install: bool = True) -> Path:
    """--out/<sweep_name> (the table's fields and the sweep's) and --out/<the table's file name>; with --install on
    CUDA (and `install`), the table over the tree's own. Returns the output folder."""
    out = Path(run.args.out).absolute()
    out.mkdir(parents=True, exist_ok=True)
    (out / sweep_name).write_text(json.dumps({**table, **sweep}, indent=1))
    (out / table_path.name).write_text(json.dumps(table, indent=1) + "\n")
    if run.args.install and run.cuda and install:
        table_path.parent.mkdir(parents=True, exist_ok=True)
        table_path.write_text(json.dumps(table, indent=1) + "\n")
        print(f"installed {table_path}", flush=True)
    return out
