"""What the quantized GEMM kernels share: the row buckets that pick a tile config (and so the kernel variants start-up
builds), the split of K across programs for the few rows of decode (the partials' reduction: splitk.py). Imports no
Triton.

At a few rows a quantized GEMM only streams its weight: its tiles along N alone are too few to keep every
multiprocessor reading (Llama-8B's o_proj at BLOCK_N 64: 64 programs on the H200's 132 SMs), so the K loop is split
across programs that write float32 partials, and one small kernel sums them, adds the bias and rounds once. The split
depends on the weight's shape and the row bucket only, never on the row count inside a bucket: one kernel variant
per bucket, and a CUDA graph's launches are the same at every replay."""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch

T = TypeVar("T")

# Row buckets: a GEMM of m rows runs the config of the first bucket whose bound is >= m (the last: any m).
# Up to 16: the decode kernels' row counts (int4_gemv.py's and fp8_w8a16.py's ROWS: CUDA graphs pad decode batches
# to these powers of two); the others pick the tensor-core kernels' tiles.
ROW_BUCKETS = (1, 2, 4, 8, 16, 64, 256, None)
MAX_SPLIT = 16
SKINNY_MAX_SPLIT = 32  # a few-row kernel's config (its tuned table entry) may split K further
MIN_K_TILES_PER_SPLIT = 4
DEFAULT_SMS = 132  # an H200's, for a CPU device (the interpreter tests)


@dataclass(frozen=True)
class TileConfig:
    """A row bucket's launch of a quantized GEMM kernel."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    split: bool  # split K across programs (split_k) where the output tiles are few
    nibbles: bool = False  # W4A16: int4_gemm._w4a16_nibbles_kernel where the K tile is NIBBLES_BLOCK_K


@dataclass(frozen=True)
class SkinnyConfig:
    """A few-row weight-streaming kernel's launch (fp8_gemv.py, int4_skinny.py): BLOCK_N output channels by BLOCK_K
    inputs a tile, K split over split_k programs."""

    block_n: int
    block_k: int
    split_k: int  # programs along K; each takes a whole number of BLOCK_K tiles (the last may take fewer)
    num_warps: int
    num_stages: int

    def __post_init__(self):
        kind = type(self).__name__
        for name in ("block_n", "block_k", "num_warps"):
            v = getattr(self, name)
            if v <= 0 or v & (v - 1):
                raise ValueError(f"{kind}.{name} must be a power of two, got {v}")
        if self.block_k < 16:
            raise ValueError(f"{kind}: BLOCK_K >= 16, got {self}")
        if not 1 <= self.split_k <= SKINNY_MAX_SPLIT or self.num_stages < 1:
            raise ValueError(f"{kind}: split_k in 1..{SKINNY_MAX_SPLIT}, num_stages >= 1, got {self}")


def bucket_of(m: int) -> int:
    """The index in ROW_BUCKETS of m rows."""
    if m <= 0:
        raise ValueError(f"a quantized GEMM needs at least one row, got {m}")
    return next(i for i, bound in enumerate(ROW_BUCKETS) if bound is None or m <= bound)


def warmup_rows() -> tuple[int, ...]:
    """One row count per bucket (the first of each): running a GEMM at each builds every kernel variant it has."""
    rows, low = [], 1
    for bound in ROW_BUCKETS:
        rows.append(low)
        low = (bound or 0) + 1
    return tuple(rows)


@functools.cache
def _sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return DEFAULT_SMS
    return _sms(device.index if device.index is not None else torch.cuda.current_device())


@dataclass(frozen=True)
class Split:
    splits: int  # programs along K (1: no partials)
    k_tiles_per_split: int


def split_k(tiles: int, k_tiles: int, sms: int, wanted: bool, per_sm: int = 2,
            min_tiles: int = MIN_K_TILES_PER_SPLIT) -> Split:
    """The split of k_tiles K tiles that brings `tiles` output tiles to about per_sm programs per SM (when wanted: the
    few-row buckets), each split at least min_tiles tiles long."""
    splits = 1
    if wanted and tiles < per_sm * sms:
        splits = max(1, min(MAX_SPLIT, (per_sm * sms) // tiles, k_tiles // min_tiles))
    per = _cdiv(k_tiles, splits)
    return Split(_cdiv(k_tiles, per), per)


def config_split(splits: int, grid_n: int, k_tiles: int, device: torch.device) -> Split:
    """A tensor-core config's split: `splits` K splits, or with 0 the split from N's tiles alone (the same variant at
    every row count of a bucket)."""
    if splits == 0:
        return split_k(grid_n, k_tiles, sm_count(device), True)
    per = _cdiv(k_tiles, min(splits, k_tiles))
    return Split(_cdiv(k_tiles, per), per)


def split_outputs(m: int, n: int, dtype: torch.dtype, device: torch.device,
                  split: Split) -> tuple[torch.Tensor, torch.Tensor]:
    """The (m, n) output and where the kernel writes: the output itself, or float32 partials (splits, m, n) that
    splitk.reduce_splits sums into it."""
    y = torch.empty(m, n, dtype=dtype, device=device)
    return y, (y if split.splits == 1 else torch.empty(split.splits, m, n, dtype=torch.float32, device=device))


def per_device(make: Callable[[torch.device], T]) -> Callable[[torch.device], T]:
    """One object per device, made on first use (a bare "cuda" is the current device): the kernels' reused buffers."""
    @functools.cache
    def one(device_type: str, index: int | None) -> T:
        return make(torch.device(device_type, index) if index is not None else torch.device(device_type))

    def get(device: torch.device) -> T:
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        return one(device.type, device.index)
    return get


def check_mma_config(cfg, block_ks: tuple[int, ...]) -> None:
    """The tensor-core kernels' config fields (block_m/n/k, num_warps, num_stages, split_k): a ValueError naming the
    config's class for any out of bounds."""
    name = type(cfg).__name__
    for field in ("block_m", "block_n", "num_warps"):
        v = getattr(cfg, field)
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0 or v & (v - 1):
            raise ValueError(f"{name}.{field} must be a power of two, got {v!r}")
    if cfg.block_k not in block_ks or not 16 <= cfg.block_m <= 256 or not 16 <= cfg.block_n <= 256:
        raise ValueError(f"{name}: block_k in {block_ks}, block_m and block_n in 16..256, got {cfg}")
    if not 0 <= cfg.split_k <= MAX_SPLIT or cfg.num_stages < 1:
        raise ValueError(f"{name}: split_k in 0..{MAX_SPLIT}, num_stages >= 1, got {cfg}")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)
