"""The decode LoRA kernels' launch parameters (kernels/lora/decode.py), without Triton: lora/ reads them on any
device. A GPU model's swept config lives in kernels/gemm/tuned/lora_decode_<GPU>.json
(benchmarks/kernels/lora_decode_sweep.py --install writes it); without one, the defaults."""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import torch


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class LoraDecodeConfig:
    """The decode kernels' launch parameters (benchmarks/kernels/lora_decode_sweep.py sweeps them)."""

    block_m: int = 16  # rows per block (a slot's rows; the graph table reserves blocks for the worst mix)
    splits: int = 16  # the most K splits of a block's shrink
    min_split_k: int = 256  # each split at least this many columns
    shrink_block_k: int = 128
    shrink_block_w: int = 64  # A's rows per shrink program (qkv's 3 x rank in one tile up to rank 21)
    shrink_warps: int = 4
    shrink_stages: int = 3
    expand_block_n: int = 128
    expand_programs: int = 1024  # the expand's target grid (~8 per SM on an H100/H200): sets the N chunk
    expand_warps: int = 4
    expand_stages: int = 3

    def __post_init__(self) -> None:
        for name in ("block_m", "shrink_block_k", "shrink_block_w", "expand_block_n"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"LoraDecodeConfig.{name} must be a power of 2 >= 16, got {v}")
        for name in ("splits", "min_split_k", "shrink_warps", "shrink_stages", "expand_programs", "expand_warps",
                     "expand_stages"):
            if getattr(self, name) < 1:
                raise ValueError(f"LoraDecodeConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.splits > 32:
            raise ValueError(f"LoraDecodeConfig.splits is at most 32 (the expand unrolls them), got {self.splits}")
        if self.min_split_k % self.shrink_block_k:
            raise ValueError(f"min_split_k {self.min_split_k} is not a multiple of shrink_block_k "
                             f"{self.shrink_block_k}")

    def as_dict(self) -> dict:
        return asdict(self)

    def split_k(self, k: int) -> int:
        """The K columns of one shrink program (a constant of K: the graph's grid is fixed)."""
        chunk = _cdiv(_cdiv(k, self.splits), self.shrink_block_k) * self.shrink_block_k
        return max(self.min_split_k, chunk)

    def tiles_per_program(self, n: int, blocks: int) -> int:
        """Output tiles per expand program: enough that blocks x chunks comes near expand_programs."""
        tiles = _cdiv(n, self.expand_block_n)
        return max(1, min(tiles, tiles * blocks // self.expand_programs))


def table_path(device_name: str) -> Path:
    """tuned/lora_decode_<GPU>.json beside the GEMM tables (kernels/gemm/cublaslt.py's naming)."""
    name = re.sub(r"[^A-Za-z0-9]+", "_", device_name).strip("_")
    return Path(__file__).resolve().parents[1] / "gemm" / "tuned" / f"lora_decode_{name}.json"


@lru_cache(maxsize=None)
def tuned_config(device_name: str) -> LoraDecodeConfig:
    """This GPU model's swept config (tuned/lora_decode_<GPU>.json), else the defaults."""
    path = table_path(device_name)
    if not path.exists():
        return LoraDecodeConfig()
    return LoraDecodeConfig(**json.loads(path.read_text())["config"])


def config_for(device: torch.device | str) -> LoraDecodeConfig:
    device = torch.device(device)
    if device.type != "cuda":
        return LoraDecodeConfig()
    return tuned_config(torch.cuda.get_device_name(device))
