"""FP8 weight GEMMs on CUDA, checked against reference.fp8_linear_w8a8 (their arithmetic) and reference.fp8_linear.

Per-tensor and per-channel weights: the activations are quantized per token (or with the checkpoint's static input
scale: fp8_act.py), then from SCALED_MM_MIN_ROWS rows cuBLASLt multiplies them (torch._scaled_mm: row-wise scales
(M, 1) x (1, N), or two scalars when both are per tensor), the bias added after; fewer rows run this file's Triton
kernel in its per-channel mode (split K). _scaled_mm refuses some shapes (K or N not a multiple of 16) and
row-wise scales with an output other than bfloat16: those run this file's Triton kernel in its per-channel mode.

128 x 128 blocks (DeepSeek-V3, Qwen3-FP8): activations quantized per token per group of the block's K size, then on
compute capability 9.0 torch._scaled_mm's block scaling (block_scaled_mm_ok), elsewhere the Triton kernel below (w8a8
block-scaled: each K tile is one block column, its product scaled by the rows' group scales times the weight block's
scale). Its tile configs by row bucket (tiles.ROW_BUCKETS): the decode buckets take narrow N tiles and split K
(tiles.split_k) so that every SM streams weight; from 65 rows, 64 x 128 and then 128 x 128 tiles.

Where this GPU model's tuned table names a config for the shape and row bucket (quant_tuned.py), fp8_linear_cuda runs
the weight-only few-row kernel of fp8_gemv.py (kind fp8_channel / fp8_block: 1-4 rows) or the W8A8 tensor-core kernel
of fp8_mma.py (kind fp8_mma: 5-256 rows) instead of the paths above.
Up to W8A16_DEFAULT_MAX_ROWS rows (none by default: measured slower), fp8_linear_cuda runs none of the above but the
weight-only kernel of fp8_w8a16.py (bf16/fp16 activations, not quantized: reference.fp8_linear's arithmetic, one
launch); w8a16_max_rows forces it up to fp8_w8a16.W8A16_MAX_ROWS rows.

Every path is capturable in a CUDA graph: no host syncs, and its allocations (outputs, quantized activations, split-K
partials) have the same sizes at every replay of one row count."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from enum import Enum

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from radixlm.runtime.kernels.gemm.epilogue import RotaryStore
from radixlm.runtime.kernels.gemm.prologue import Prologue, apply
from radixlm.runtime.kernels.quant import (fp8_act, fp8_gemv, fp8_mma, fp8_prologue, fp8_w8a16, quant_tuned, splitk,
                                           tiles)
from radixlm.runtime.kernels.quant.reference import FP8_DTYPE, dequant_fp8
from radixlm.runtime.kernels.quant.splitk import store_tile, tile_range
from radixlm.runtime.kernels.quant.tiles import TileConfig

SCALED_MM_ALIGN = 16
# Fewer rows than this run the Triton kernel's per-channel mode instead of _scaled_mm (past the weight-only kernel's
# 16 rows). On the H200 (benchmarks/results/kernels/h200/quant_gemm_h200.json, one layer of Llama-3.1-8B) the Triton
# kernel took 113.5 us at 32 rows against _scaled_mm's 142.4, and 166.8 against 138.3 at 64; from 8 to 32 rows it
# won every shape.
SCALED_MM_MIN_ROWS = 33
# Rows up to which fp8_linear_cuda takes the weight-only kernel (fp8_w8a16.py, up to its W8A16_MAX_ROWS): none. On the
# H200 (benchmarks/results/kernels/h200/quant_gemm_check_h200.json) one layer at 1 row took 196 us there (per channel;
# 199 with blocks) against the W8A8 Triton kernel's 102.5 (88.5), and lost at every row count to 16.
W8A16_DEFAULT_MAX_ROWS = 0


# By row bucket (tiles.ROW_BUCKETS: 1, 2, 4, 8, 16, <= 64, <= 256, more rows). BLOCK_K is the weight block's K size.
_DECODE = TileConfig(16, 64, 4, 4, True)
FP8_CONFIGS = (_DECODE,) * 5 + (TileConfig(32, 64, 4, 4, True), TileConfig(64, 128, 4, 3, False),
                                TileConfig(128, 128, 8, 3, False))


@triton.jit(do_not_specialize=["M", "stride_ys"])
def _w8a8_kernel(A, AS, B, BS, Bias, Y, M, N, K, stride_am, stride_asm, stride_bn, stride_bsn, stride_bsk, stride_ym,
                 stride_ys, k_tiles_per_split, GROUP_N: tl.constexpr, BLOCKWISE: tl.constexpr, HAS_BIAS: tl.constexpr,
                 SPLIT: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr):
    """y = (a * as) @ (b * bs).T. BLOCKWISE: as (M, K / BLOCK_K), bs (ceil(N / GROUP_N), K / BLOCK_K), applied per K
    tile; else as (M,) and bs (N,) (stride 0: one value), applied once after the loop. SPLIT: program_id(2) sums
    k_tiles_per_split tiles into float32 partials at Y + pid_k * stride_ys (splitk.reduce_splits finishes)."""
    offs_m, offs_n, offs_k, m_mask, n_mask, t0, t1, pid_k = tile_range(M, N, K, k_tiles_per_split, BLOCK_M,
                                                                        BLOCK_N, BLOCK_K)
    a_ptrs = A + offs_m[:, None] * stride_am + offs_k[None, :]
    b_ptrs = B + offs_n[None, :] * stride_bn + offs_k[:, None]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for t in range(t0, t1):
        k0 = t * BLOCK_K
        if EVEN_K:
            a = tl.load(a_ptrs + k0, mask=m_mask[:, None], other=0.0)
            b = tl.load(b_ptrs + k0, mask=n_mask[None, :], other=0.0)
        else:
            k_mask = (k0 + offs_k) < K
            a = tl.load(a_ptrs + k0, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
            b = tl.load(b_ptrs + k0, mask=n_mask[None, :] & k_mask[:, None], other=0.0)
        if BLOCKWISE:
            a_s = tl.load(AS + offs_m * stride_asm + t, mask=m_mask, other=0.0)
            b_s = tl.load(BS + (offs_n // GROUP_N) * stride_bsn + t * stride_bsk, mask=n_mask, other=0.0)
            acc += tl.dot(a, b) * a_s[:, None] * b_s[None, :]
        else:
            acc = tl.dot(a, b, acc)
    if not BLOCKWISE:
        a_s = tl.load(AS + offs_m * stride_asm, mask=m_mask, other=0.0)
        b_s = tl.load(BS + offs_n * stride_bsn, mask=n_mask, other=0.0)
        acc = acc * a_s[:, None] * b_s[None, :]
    store_tile(acc, Y, Bias, offs_m, offs_n, m_mask, n_mask, stride_ym, stride_ys, pid_k, SPLIT, HAS_BIAS)


def _w8a8(q: torch.Tensor, q_scale: torch.Tensor, weight: torch.Tensor, w_scale: torch.Tensor,
          block: tuple[int, int] | None, bias: torch.Tensor | None, out_dtype: torch.dtype,
          cfg: TileConfig | None = None) -> torch.Tensor:
    """Launches _w8a8_kernel: q (M, K) FP8 with q_scale (M, K / bk) (block) or (M, 1) / one value; weight (N, K).
    cfg: the row bucket's (FP8_CONFIGS) unless given (benchmarks/kernels/quant_gemm.py --sweep)."""
    m, k = q.shape
    n = weight.shape[0]
    blockwise = block is not None
    block_k = block[1] if blockwise else 128
    cfg = cfg or FP8_CONFIGS[tiles.bucket_of(m)]
    k_tiles = triton.cdiv(k, block_k)
    grid_n, grid_m = triton.cdiv(n, cfg.block_n), triton.cdiv(m, cfg.block_m)
    split = tiles.split_k(grid_n * grid_m, k_tiles, tiles.sm_count(q.device), cfg.split)
    y, out = tiles.split_outputs(m, n, out_dtype, q.device, split)
    if blockwise:
        bs_n, bs_k = w_scale.stride(0), w_scale.stride(1)
        as_m = q_scale.stride(0)
    else:
        w_scale = w_scale.reshape(-1)
        bs_n, bs_k = (1 if w_scale.numel() > 1 else 0), 0
        as_m = q_scale.stride(0) if q_scale.dim() == 2 else 0  # (M, 1) per token, or one static value
    _w8a8_kernel[(grid_n, grid_m, split.splits)](
        q, q_scale, weight, w_scale, bias if bias is not None else y, out, m, n, k, q.stride(0), as_m,
        weight.stride(0), bs_n, bs_k, out.stride(-2), out.stride(0) if split.splits > 1 else 0,
        split.k_tiles_per_split, GROUP_N=block[0] if blockwise else 1, BLOCKWISE=blockwise,
        HAS_BIAS=bias is not None, SPLIT=split.splits > 1, EVEN_K=k % block_k == 0, BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n, BLOCK_K=block_k, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if split.splits > 1:
        splitk.reduce_splits(out, bias, y)
    return y


def block_shape_ok(block: tuple[int, int]) -> bool:
    bn, bk = block
    return bn > 0 and bk >= 16 and bk & (bk - 1) == 0


def fp8_block_linear(x2: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int],
                     bias: torch.Tensor | None, cfg: TileConfig | None = None) -> torch.Tensor:
    """x2 (M, K) -> (M, N) in x2's dtype; weight (N, K) FP8 with scale (ceil(N / bn), ceil(K / bk)). torch._scaled_mm's
    block scaling where it takes the GEMM (block_scaled_mm_ok; cfg, a benchmark's forced config, keeps the Triton
    kernel), else the Triton kernel."""
    if cfg is None and block_scaled_mm_ok(x2, weight, scale, block):
        q, q_scale = fp8_act.quant_fp8_per_group(x2, block[1], column_major=True, rows_multiple=BLOCK_SCALED_ROWS)
        y = torch._scaled_mm(q, weight.t(), q_scale, scale.t(), out_dtype=x2.dtype)[:x2.shape[0]]
        return y.add_(bias) if bias is not None else y
    q, q_scale = fp8_act.quant_fp8_per_group(x2, block[1])
    return _w8a8(q, q_scale, weight, scale, block, bias, x2.dtype, cfg)


def block_scaled_mm_ok(x2: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> bool:
    """Whether torch._scaled_mm runs this block-scaled GEMM (1 x 128 activation groups, 128 x 128 weight blocks, as
    DeepSeek-V3 and Qwen3-FP8 ship): cuBLASLt's block scaling (CUDA 12.9+) on compute capability 9.0, where it was
    measured: half the Triton kernel's time at 256-8,192 rows on Llama-8B's shapes, the same at 64
    (benchmarks/results/kernels/h200/fp8_block_scaled_mm/). bfloat16 rows, whole blocks, float32 scales."""
    n, k = weight.shape
    return (block == (128, 128) and x2.dtype == torch.bfloat16 and n % 128 == 0 and k % 128 == 0
            and weight.stride(1) == 1 and scale.dtype == torch.float32 and scale.is_contiguous()
            and scale.shape == (n // 128, k // 128) and _block_scaling(x2.device))


# cuBLASLt refused the block scaling (CUBLAS_STATUS_NOT_SUPPORTED) at row counts other than the benchmark's multiples of
# 64 (the CUDA tests' 3..300 rows, a model's prefill passes): the rows are padded to a multiple of 16.
BLOCK_SCALED_ROWS = 16


@functools.lru_cache(maxsize=None)
def _block_scaling(device: torch.device) -> bool:
    cuda = tuple(int(v) for v in (torch.version.cuda or "0.0").split(".")[:2])
    return device.type == "cuda" and torch.cuda.get_device_capability(device) == (9, 0) and cuda >= (12, 9)


def scaled_mm_ok(x2: torch.Tensor, weight: torch.Tensor, per_tensor: bool) -> bool:
    """Whether torch._scaled_mm takes this GEMM: K and N multiples of 16, and row-wise scales only into bfloat16."""
    n, k = weight.shape
    return (k % SCALED_MM_ALIGN == 0 and n % SCALED_MM_ALIGN == 0 and weight.stride(1) == 1
            and (per_tensor or x2.dtype == torch.bfloat16))


def fp8_scaled_linear(x2: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
                      input_scale: torch.Tensor | None, min_scaled_mm_rows: int = SCALED_MM_MIN_ROWS,
                      rows: tuple[torch.Tensor, torch.Tensor] | None = None, tuned: dict | None = None
                      ) -> torch.Tensor:
    """Per-tensor or per-channel weight scale: torch._scaled_mm where it takes the shape (scaled_mm_ok) and there are
    min_scaled_mm_rows rows or more, else the Triton kernel's per-channel mode. rows: x2 already quantized per token
    (fp8_prologue.quantized_rows), x2 then only their shape and dtype. tuned: row count -> a tuned cuBLASLt GEMM
    (tuned_gemm.install: row-wise scales, dynamic activations) that runs instead of torch._scaled_mm's pick."""
    m = x2.shape[0]
    n = weight.shape[0]
    per_tensor = scale.numel() == 1 and input_scale is not None
    q, q_scale = rows if rows is not None else fp8_act.quant_fp8_per_token(x2, input_scale)
    if m < min_scaled_mm_rows or not scaled_mm_ok(x2, weight, per_tensor):
        return _w8a8(q, q_scale, weight, scale, None, bias, x2.dtype)
    w_scale = scale.to(torch.float32)
    if per_tensor:
        a_s, b_s, out_dtype = q_scale.reshape(()), w_scale.reshape(()), x2.dtype
    else:
        a_s = q_scale.reshape(1, 1).expand(m, 1).contiguous() if q_scale.numel() == 1 else q_scale
        b_s = w_scale.reshape(1, -1).expand(1, n).contiguous()
        out_dtype = torch.bfloat16
    lt = tuned.get(m) if tuned is not None and input_scale is None else None
    if lt is not None and not per_tensor:
        y = lt(q, weight, None, a_s.reshape(-1), b_s.reshape(-1))
    else:
        y = torch._scaled_mm(q, weight.t(), a_s, b_s, out_dtype=out_dtype)
    if bias is not None:
        y.add_(bias)
    return y


class Fp8Path(Enum):
    """Which kernel fp8_linear_cuda runs (choose_path)."""

    DEQUANT = "dequant"  # F.linear on the dequantized weight: float32 rows, no FP8 tensor cores, an unsupported block
    GEMV = "gemv"  # fp8_gemv.py's tuned weight-only few-row kernel
    W8A16 = "w8a16"  # fp8_w8a16.py, activations not quantized
    MMA = "mma"  # fp8_mma.py's tuned tensor-core kernel
    BLOCK = "block"  # fp8_block_linear
    SCALED = "scaled"  # fp8_scaled_linear: per-token (or static) activation scales


@dataclass(frozen=True)
class Fp8Choice:
    path: Fp8Path
    config: fp8_gemv.Fp8GemvConfig | fp8_mma.Fp8MmaConfig | None = None  # GEMV's and MMA's tuned config


def choose_path(x2: torch.Tensor, weight: torch.Tensor, block: tuple[int, int] | None,
                w8a16_max_rows: int) -> Fp8Choice:
    """fp8_linear_cuda's kernel for x2's rows (their count, dtype and device decide, not their strides)."""
    m = x2.shape[0]
    if x2.dtype not in (torch.bfloat16, torch.float16) or not fp8_supported(x2.device) or (
            block is not None and not block_shape_ok(block)):
        return Fp8Choice(Fp8Path.DEQUANT)
    if (gemv := tuned_gemv(x2, weight, block)) is not None:
        return Fp8Choice(Fp8Path.GEMV, gemv)
    if m <= w8a16_max_rows and weight.stride(1) == 1 and fp8_w8a16.takes(m, block):
        return Fp8Choice(Fp8Path.W8A16)
    if (mma := tuned_mma(x2, weight, block)) is not None:
        return Fp8Choice(Fp8Path.MMA, mma)
    return Fp8Choice(Fp8Path.BLOCK if block is not None else Fp8Path.SCALED)


def fp8_linear_cuda(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] | None = None,
                    bias: torch.Tensor | None = None, input_scale: torch.Tensor | None = None,
                    w8a16_max_rows: int = W8A16_DEFAULT_MAX_ROWS, prologue: Prologue | None = None,
                    tuned: dict | None = None, epilogue: RotaryStore | None = None) -> torch.Tensor:
    """kernels.quant.fp8_linear on CUDA: x (..., K) in bfloat16 or float16 (float32: the dequantizing path). Up to
    w8a16_max_rows rows the weight-only kernel (fp8_w8a16.py: the activations are not quantized, a static
    input_scale is not used), else the W8A8 kernels (benchmarks/kernels/quant_gemm.py forces each). prologue: x is
    the input before that step (gemm/prologue.py): at one row the few-row kernel (fp8_gemv.py) runs it in its loads
    where the tuned table names a launch for it (tuned_fused); where the GEMM quantizes its activations per token, the
    step runs with the quantization in one launch (fp8_prologue.py); else unfused first. epilogue: applied (and
    marked) where a tuned fused launch takes it, else left to the caller. tuned: fp8_scaled_linear's."""
    rows, choice = None, None
    if prologue is not None:
        if prologue.in_features(x) == weight.shape[1]:
            choice = choose_path(x[:, :weight.shape[1]], weight, block, w8a16_max_rows)
        if choice is not None and choice.path is Fp8Path.GEMV:
            fused = tuned_fused(x, weight, block, prologue, epilogue)
            if fused is not None:
                return fp8_gemv.fp8_gemv_linear(x, weight, scale, block, bias, *fused)
        if choice is not None and _fuses_quantization(x, choice, block, input_scale, prologue):
            rows = fp8_prologue.quantized_rows(prologue, x)
            x = x[:, :rows[0].shape[1]]  # the rows' shape, dtype and device from here (their values are not read)
        else:
            x = apply(prologue, x)
    k = x.shape[-1]
    n = weight.shape[0]
    if weight.dtype != FP8_DTYPE or weight.shape[1] != k:
        raise ValueError(f"an FP8 GEMM takes a ({n}, {k}) {FP8_DTYPE} weight, got {tuple(weight.shape)} {weight.dtype}")
    if block is not None and input_scale is not None:
        raise ValueError("block-scaled FP8 weights take dynamic activations: no static input scale")
    x2 = x.reshape(-1, k)
    if x2.shape[0] == 0:
        return x.new_empty(*x.shape[:-1], n)
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    choice = choice or choose_path(x2, weight, block, w8a16_max_rows)
    if choice.path is Fp8Path.DEQUANT:
        y = F.linear(x2, dequant_fp8(weight, scale, block, x.dtype), bias)
    elif choice.path is Fp8Path.GEMV:
        fused = tuned_fused(x2, weight, block, None, epilogue) if epilogue is not None else None
        y = fp8_gemv.fp8_gemv_linear(x2, weight, scale, block, bias, *(fused or (choice.config,)))
    elif choice.path is Fp8Path.W8A16:
        y = fp8_w8a16.w8a16_linear(x2, weight, scale, block, bias)
    elif choice.path is Fp8Path.MMA:
        y = fp8_mma.fp8_mma_linear(x2, weight, scale, block, bias, input_scale, choice.config, rows=rows)
    elif choice.path is Fp8Path.BLOCK:
        y = fp8_block_linear(x2, weight, scale, block, bias)
    else:
        y = fp8_scaled_linear(x2, weight, scale, bias, input_scale, rows=rows, tuned=tuned)
    return y.reshape(*x.shape[:-1], n)


FusedLaunch = tuple[fp8_gemv.Fp8GemvConfig, Prologue | None, RotaryStore | None]


def tuned_fused(x: torch.Tensor, weight: torch.Tensor, block: tuple[int, int] | None, prologue: Prologue | None,
                epilogue: RotaryStore | None) -> FusedLaunch | None:
    """(config, prologue, epilogue) of the few-row kernel's launch that fuses the prologue (x: its input), with the
    epilogue where the table also has that, or, without a prologue, the epilogue alone: where this GPU model's tuned
    table names a launch for those steps (they beat running unfused; quant_tuned.STEPS) and the kernel takes them
    (fp8_gemv.takes_prologue, takes_epilogue); else None."""
    if prologue is not None and not fp8_gemv.takes_prologue(prologue, x):
        return None
    x2 = x if prologue is None else x[:, :weight.shape[1]]
    m, k = x2.shape
    group = block[1] if block is not None else 0
    kind = "fp8_block" if block is not None else "fp8_channel"
    name = prologue.kind.name.lower() if prologue is not None else None
    for epi in ((epilogue, None) if epilogue is not None else (None,)):
        if epi is None and name is None:
            return None
        step = fp8_gemv.step_name(name, epi is not None)
        cfg = quant_tuned.lookup(x.device, kind, weight.shape[0], k, m, group, step)
        if (cfg is not None and fp8_gemv.takes(m, weight.shape[0], k, block, cfg)
                and (epi is None or fp8_gemv.takes_epilogue(x2, weight, block, epi, cfg))):
            return cfg, prologue, epi
    return None


def _fuses_quantization(x: torch.Tensor, choice: Fp8Choice, block: tuple[int, int] | None,
                        input_scale: torch.Tensor | None, prologue: Prologue) -> bool:
    """Whether the chosen kernel quantizes the step's output per token (per-tensor / per-channel weights, dynamic
    activations: the tensor-core and scaled paths) and fp8_prologue runs the step with that quantization."""
    return (choice.path in (Fp8Path.MMA, Fp8Path.SCALED) and block is None and input_scale is None
            and fp8_prologue.takes(prologue, x))


def tuned_gemv(x2: torch.Tensor, weight: torch.Tensor, block: tuple[int, int] | None) -> fp8_gemv.Fp8GemvConfig | None:
    """The weight-only few-row kernel's config (fp8_gemv.py) where this GPU model's tuned table has one for this
    shape and row bucket (quant_tuned.py; none without a table: the paths below), else None."""
    m, k = x2.shape
    n = weight.shape[0]
    cfg = quant_tuned.lookup(x2.device, "fp8_block" if block is not None else "fp8_channel", n, k, m,
                             block[1] if block is not None else 0)
    if cfg is None or weight.stride(1) != 1 or weight.stride(0) % 4 or not fp8_gemv.takes(m, n, k, block, cfg):
        return None
    return cfg


def tuned_mma(x2: torch.Tensor, weight: torch.Tensor, block: tuple[int, int] | None) -> fp8_mma.Fp8MmaConfig | None:
    """The W8A8 tensor-core kernel's config (fp8_mma.py) where this GPU model's tuned table has one (kind fp8_mma) for
    this shape, block K size (0: per tensor / channel) and row bucket (5..256 rows), else None."""
    m, k = x2.shape
    cfg = quant_tuned.lookup(x2.device, "fp8_mma", weight.shape[0], k, m, block[1] if block is not None else 0)
    if cfg is None or weight.stride(1) != 1 or not fp8_mma.takes(m, k, block, x2.dtype, cfg):
        return None
    return cfg


@functools.lru_cache(maxsize=None)  # on every FP8 GEMM call: the device's capability read once
def fp8_supported(device: torch.device) -> bool:
    """FP8 tensor cores: compute capability 8.9 (Ada) and up; older GPUs take the dequantizing path."""
    return device.type != "cuda" or torch.cuda.get_device_capability(device) >= (8, 9)
