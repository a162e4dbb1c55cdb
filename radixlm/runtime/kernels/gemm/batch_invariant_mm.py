"""The batch-invariant GEMM's Triton kernel (batch_invariant.py): one tile configuration per weight shape for every
row count, so each output element is the same walk over K in BLOCK_K steps (tl.dot of one fixed tile shape,
accumulated in float32) whatever M is and whatever the other rows hold. A weight's entry may split K into a fixed
number of parts (split_k: their float32 partials summed in part order by a second kernel), again the same for every
M. Never autotuned at run time: a tuning key on M would choose per batch again.

The configuration is a function of (N, K, dtype) only: this GPU model's tuned table (tuned/batch_invariant_<GPU>.json,
written by batch_invariant_tune.py, the sweep that rejects any candidate whose rows change with M) or the defaults
below. Its block_m is part of it: the tile's MMA shape (block_m x block_n, num_warps) and its K walk (block_k) are
then fixed per weight whatever M is."""
from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

import torch
import triton
import triton.language as tl

BLOCK_M = 64  # the defaults' tile rows
WIDE_N = 16384  # weights with at least this many outputs take the wide default tile
# Pointer arguments are specialised on 16-byte alignment (vector loads, cp.async pipelining); an input view at another
# offset is copied to an aligned buffer first rather than building a second variant in the middle of serving.
ALIGN_BYTES = 16


@dataclass(frozen=True)
class BatchInvariantConfig:
    """One weight shape's tile. Changing block_m, block_n, block_k, num_warps or split_k may change the arithmetic
    (another MMA shape or K walk), so a table entry is only ever a function of the weight, never of M; num_stages and
    group_m change the schedule only."""

    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    group_m: int = 8
    block_m: int = BLOCK_M
    split_k: int = 1  # K parts summed in order by a second kernel (more programs for few rows and narrow weights)

    def __post_init__(self) -> None:
        if self.block_m not in (64, 128):
            raise ValueError(f"block_m {self.block_m} must be 64 or 128 (one or two wgmma row blocks)")
        for name in ("block_n", "block_k"):
            v = getattr(self, name)
            if v < 16 or v > 512 or v & (v - 1):
                raise ValueError(f"{name} {v} must be a power of two in 16..512")
        if self.num_warps not in (4, 8):
            raise ValueError(f"num_warps {self.num_warps} must be 4 or 8 (one or two warpgroups)")
        if not 1 <= self.num_stages <= 6:
            raise ValueError(f"num_stages {self.num_stages} must be 1..6")
        if not 1 <= self.group_m <= 64:
            raise ValueError(f"group_m {self.group_m} must be 1..64")
        if not 1 <= self.split_k <= 16:
            raise ValueError(f"split_k {self.split_k} must be 1..16")

    def smem_bytes(self, element_size: int = 2) -> int:
        """Shared memory of the pipelined A and B tiles."""
        return self.num_stages * (self.block_m + self.block_n) * self.block_k * element_size

    def as_dict(self) -> dict:
        return asdict(self)


# Hopper defaults (the bf16 configurations of Triton's matmul tutorials, narrowed to the fixed 64-row tile): decode's
# GEMMs are weight-bound at 64-256 rows, so narrow weights keep 64-wide tiles (more programs read the weight) and wide
# ones take 128; 4 stages keep enough of the weight in flight per SM.
DEFAULT_NARROW = BatchInvariantConfig(block_n=64, block_k=128, num_warps=4, num_stages=4)
DEFAULT_WIDE = BatchInvariantConfig(block_n=128, block_k=64, num_warps=4, num_stages=4)


def default_config(n: int, k: int) -> BatchInvariantConfig:
    """The configuration of a weight with no tuned entry (a function of the weight alone)."""
    return DEFAULT_WIDE if n >= WIDE_N else DEFAULT_NARROW


def block_n(n: int) -> int:
    """The default tile width for a weight of n outputs."""
    return default_config(n, 0).block_n


def parse_table(entries: list[dict]) -> dict[tuple[int, int, str], BatchInvariantConfig]:
    """A tuned table's entries ({n, k, dtype, config, ...}) by (n, k, dtype); a malformed one raises ValueError."""
    out = {}
    for entry in entries:
        try:
            out[(int(entry["n"]), int(entry["k"]), str(entry["dtype"]))] = BatchInvariantConfig(**entry["config"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"bad batch_invariant tuned entry {entry}: {e}") from e
    return out


@functools.cache
def _table(device_name: str) -> dict[tuple[int, int, str], BatchInvariantConfig]:
    from radixlm.runtime.kernels.gemm.cublaslt import load_table

    return parse_table(load_table(device_name, "batch_invariant"))


@functools.cache
def _device_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


def config_for(n: int, k: int, dtype: torch.dtype, device: torch.device) -> BatchInvariantConfig:
    """The tuned entry of this GPU model for the weight (n, k, dtype), else the default: never a function of M."""
    if device.type == "cuda":
        name = _device_name(device.index if device.index is not None else torch.cuda.current_device())
        found = _table(name).get((n, k, str(dtype).removeprefix("torch.")))
        if found is not None:
            return found
    return default_config(n, k)


# M (and the partials' stride, M * N) change every pass: they may not build a variant of their own (a build in the
# middle of serving); nothing about them changes the arithmetic.
@triton.jit(do_not_specialize=["M", "stride_cs"])
def _batch_invariant_mm_kernel(A, B, C, Bias, M, N, K, K_SPLIT, stride_am, stride_ak, stride_bn, stride_bk,
                               stride_cs, stride_cm, stride_cn, HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr,
                               PARTIAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                               BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    # Grouped launch order (which tile a program computes, not how): GROUP_M tiles down, then across.
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows
    # This program's part of K: K_SPLIT (a multiple of BLOCK_K, a function of K alone) from pid_k * K_SPLIT.
    k_start = tl.program_id(1) * K_SPLIT
    k_end = tl.minimum(K, k_start + K_SPLIT)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    a_ptr = A + rm[:, None] * stride_am + (k_start + rk)[None, :] * stride_ak
    b_ptr = B + rn[None, :] * stride_bn + (k_start + rk)[:, None] * stride_bk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptr, mask=m_ok[:, None], other=0.0)
            b = tl.load(b_ptr, mask=n_ok[None, :], other=0.0)
        else:
            k_ok = (k0 + rk) < k_end
            a = tl.load(a_ptr, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(b_ptr, mask=n_ok[None, :] & k_ok[:, None], other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptr += BLOCK_K * stride_ak
        b_ptr += BLOCK_K * stride_bk
    c_ptr = C + rm[:, None] * stride_cm + rn[None, :] * stride_cn
    if not PARTIAL:
        if HAS_BIAS:
            acc += tl.load(Bias + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        tl.store(c_ptr, acc.to(C.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])
    else:  # a float32 partial, summed by _split_k_reduce
        tl.store(c_ptr + tl.program_id(1).to(tl.int64) * stride_cs, acc, mask=m_ok[:, None] & n_ok[None, :])


@triton.jit(do_not_specialize=["total", "stride_ws"])
def _split_k_reduce(W, C, Bias, total, N, stride_ws, HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr,
                    BLOCK: tl.constexpr):
    # Each element's partials summed in split order, whatever M is.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < total
    acc = tl.load(W + offs, mask=ok, other=0.0)
    for s in tl.static_range(1, SPLIT_K):
        acc += tl.load(W + (s * stride_ws.to(tl.int64) + offs), mask=ok, other=0.0)
    if HAS_BIAS:
        acc += tl.load(Bias + offs % N, mask=ok, other=0.0).to(tl.float32)
    tl.store(C + offs, acc.to(C.dtype.element_ty), mask=ok)


REDUCE_BLOCK = 1024


def aligned_rows(x: torch.Tensor) -> torch.Tensor:
    """x itself when it is contiguous and starts on an ALIGN_BYTES boundary, else a contiguous copy (allocations are
    aligned; the values, hence the arithmetic, are the same)."""
    if x.is_contiguous() and x.data_ptr() % ALIGN_BYTES == 0:
        return x
    return x.clone(memory_format=torch.contiguous_format)


def matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           config: BatchInvariantConfig | None = None) -> torch.Tensor:
    """x (M, K) @ weight (N, K).T (+ bias (N,)) -> (M, N) in x's dtype. config: this weight's table entry or default
    (config_for) unless given (the tuning sweep's candidates)."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"batch-invariant GEMM of {tuple(x.shape)} by {tuple(weight.shape)}.T: the inner sizes "
                         f"differ or an operand is not a matrix")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"bias of shape {tuple(bias.shape)} for a GEMM of {weight.shape[0]} outputs")
    m, k = x.shape
    n = weight.shape[0]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    cfg = config or config_for(n, k, weight.dtype, weight.device)
    x = aligned_rows(x)
    k_split = triton.cdiv(triton.cdiv(k, cfg.split_k), cfg.block_k) * cfg.block_k
    splits = triton.cdiv(k, k_split)
    # One split writes the output; several write float32 partials (splits, M, N) that the reduction sums in order.
    target = out if splits == 1 else torch.empty(splits, m, n, dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n), splits)
    _batch_invariant_mm_kernel[grid](
        x, weight, target, bias if bias is not None else out, m, n, k, k_split, x.stride(0) if m > 1 else k,
        x.stride(1), weight.stride(0), weight.stride(1), m * n, n, 1, HAS_BIAS=bias is not None,
        EVEN_K=k % cfg.block_k == 0, PARTIAL=splits > 1, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if splits > 1:
        _split_k_reduce[(triton.cdiv(m * n, REDUCE_BLOCK),)](
            target, out, bias if bias is not None else out, m * n, n, m * n, HAS_BIAS=bias is not None,
            SPLIT_K=splits, BLOCK=REDUCE_BLOCK, num_warps=4)
    return out
