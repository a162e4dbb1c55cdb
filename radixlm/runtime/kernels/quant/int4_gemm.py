"""W4A16 GEMM on CUDA (Triton) on reference.py's INT4 layout, checked against reference.int4_linear.

qweight (K // 8, N) int32 packs eight consecutive input channels per word along K, so a [BLOCK_K // 8, BLOCK_N] tile
of words is one coalesced load along N, and unpacking it in registers ([BLOCK_K // 8, 8, BLOCK_N] shifts, reshaped to
[BLOCK_K, BLOCK_N]) gives the K tile in order: the layout needs no repacking for this kernel. Each K tile lies in one
quantization group (BLOCK_K divides the group size, or the weight has a single group), so a tile's scales and zeros
are one row of (K // g, N). The weight is dequantized in the K loop as the reference does it, (q - z) * s in float32
rounded to the activation dtype, and multiplied on the tensor cores (tl.dot) with float32 accumulation. An act-order
permutation gathers the activation's channels in the loads.

Where the K tile is 128 channels (group sizes that are multiples of 128, or one group: the checkpoints' usual 128)
and the row bucket's config asks for it (up to 16 rows: INT4_CONFIGS), _w4a16_nibbles_kernel runs instead: the same result from eight dots per tile, one per nibble, with no reshape and the
dequantization in packed 16-bit arithmetic (its docstring). Up to int4_gemv.GEMV_MAX_ROWS rows (one by default) run
int4_gemv.py's kernel on the CUDA cores (1-4 rows with a tuned config in this GPU model's table: int4_skinny.py's,
quant_tuned.py; 5-256 rows: int4_mma.py's tensor-core kernel where the table names one); up to 64 rows the
tensor-core kernels split K across programs (tiles.split_k) so that every SM streams weight; larger buckets take
wider tiles. Capturable in CUDA graphs: its
allocations (output, split-K partials) have one size per row count, and nothing syncs with the host. From a weight's
min_rows rows (512 by default; the tuned table's kind "w4a16_dequant") int4_linear_cuda dequantizes the weight once
into a scratch and runs the dense GEMM instead (int4_dequant.py)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.runtime.kernels.quant import int4_dequant, int4_gemv, int4_mma, int4_skinny, quant_tuned, splitk, tiles
from radixlm.runtime.kernels.quant.reference import INT4_PACK, dequant_int4
from radixlm.runtime.kernels.quant.splitk import store_tile
from radixlm.runtime.kernels.quant.tiles import TileConfig

MAX_BLOCK_K = 128
MIN_BLOCK_K = 16


# By row bucket (tiles.ROW_BUCKETS: 1, 2, 4, 8, 16, <= 64, <= 256, more rows). The K loop's sm_90a SASS, instructions
# a weight (_w4a16_nibbles_kernel; _w4a16_kernel's in parentheses): 16 x 128 tiles 4.8 (16 x 64: 9.1), 64 x 128 on
# four warps 6.8 (9.1), 128 x 128 on eight 9.6 (10.5); 32 x 128 ran 5.8 but repeats the dequantization per 32 rows.
_DECODE = TileConfig(16, 128, 4, 4, True, True)
# Past 16 rows the nibbles kernel lost on the H200 (one layer: 434 us at 32 rows, 699 at 64, 2882 at 256, against
# _w4a16_kernel's 278, 516 and 1001 at these configs; benchmarks/results/kernels/h200/quant_gemm_check_h200.json and
# quant_gemm_h200.json).
INT4_CONFIGS = (_DECODE,) * 5 + (TileConfig(32, 64, 4, 4, True, False), TileConfig(64, 128, 4, 3, False, False),
                                 TileConfig(128, 128, 8, 3, False, False))


@triton.jit(do_not_specialize=["M", "stride_ys"], do_not_specialize_on_alignment=["X"])
def _w4a16_kernel(X, Perm, QW, S, Z, Bias, Y, M, N, K, group_size, stride_xm, stride_qk, stride_sg, stride_ym,
                  stride_ys, k_tiles_per_split, HAS_PERM: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr,
                  EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    offs_kp = tl.arange(0, BLOCK_K // 8)
    shifts = tl.arange(0, 8) * 4
    m_mask = offs_m < M
    n_mask = offs_n < N
    k_tiles = tl.cdiv(K, BLOCK_K)
    t0 = pid_k * k_tiles_per_split
    t1 = tl.minimum(t0 + k_tiles_per_split, k_tiles)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for t in range(t0, t1):
        k0 = t * BLOCK_K
        k = k0 + offs_k
        kp = k0 // 8 + offs_kp
        if EVEN_K:
            x_mask = m_mask[:, None]
            q_mask = n_mask[None, :]
        else:
            x_mask = m_mask[:, None] & (k < K)[None, :]
            q_mask = n_mask[None, :] & (kp < K // 8)[:, None]
        if HAS_PERM:
            kx = tl.load(Perm + k, mask=k < K, other=0)
        else:
            kx = k
        x = tl.load(X + offs_m[:, None] * stride_xm + kx[None, :], mask=x_mask, other=0.0)
        packed = tl.load(QW + kp[:, None] * stride_qk + offs_n[None, :], mask=q_mask, other=0)
        q = tl.reshape((packed[:, None, :] >> shifts[None, :, None]) & 0xF, [BLOCK_K, BLOCK_N])
        g = k0 // group_size
        s = tl.load(S + g * stride_sg + offs_n, mask=n_mask, other=0.0).to(tl.float32)
        z = tl.load(Z + g * stride_sg + offs_n, mask=n_mask, other=0.0).to(tl.float32)
        # float(q) without an int-to-float conversion (a quarter-rate instruction that would bound the kernel below
        # the memory's rate): the bits 0x4B000000 | q are the float 2^23 + q, exactly; minus 2^23 + z (exact for the
        # formats' integer zeros) it is q - z.
        q_f = (q | 0x4B000000).to(tl.float32, bitcast=True)
        w = ((q_f - (z + 8388608.0)[None, :]) * s[None, :]).to(X.dtype.element_ty)
        acc = tl.dot(x, w, acc)
    store_tile(acc, Y, Bias, offs_m, offs_n, m_mask, n_mask, stride_ym, stride_ys, pid_k, SPLIT, HAS_BIAS)


NIBBLES_BLOCK_K = 128  # its K tile: eight dots of BLOCK_K / 8 = 16 channels (the MMA's K)
_MAGIC = {torch.bfloat16: (0x4300, 128.0, True), torch.float16: (0x6400, 1024.0, True),
          torch.float32: (0x4B000000, 8388608.0, False)}  # (bits, value, 16-bit): the magic float's


@triton.jit(do_not_specialize=["M", "stride_ys"], do_not_specialize_on_alignment=["X"])
def _w4a16_nibbles_kernel(X, Perm, QW, S, Z, Bias, Y, M, N, K, group_size, stride_xm, stride_qk, stride_sg,
                          stride_ym, stride_ys, k_tiles_per_split, HAS_PERM: tl.constexpr, HAS_BIAS: tl.constexpr,
                          SPLIT: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_K: tl.constexpr, MAGIC_BITS: tl.constexpr, MAGIC: tl.constexpr, HALF: tl.constexpr):
    """_w4a16_kernel's result, without unpacking into a [BLOCK_K, BLOCK_N] tile: nibble j of the [BLOCK_K / 8,
    BLOCK_N] words is the weight of channels 8 kp + j, multiplied by x's columns k0 + 8 kp + j (one tl.dot per j).
    No reshape, so the dequantized tile reaches the MMA without a scalar round trip through shared memory. In the
    16-bit dtypes the nibble or-ed into the magic number's mantissa (bf16 0x4300 = 128, fp16 0x6400 = 1024) is the
    float MAGIC + q, exactly; minus MAGIC + z (exact for zeros in [0, 15], the formats' integers) it is q - z, exact,
    and one multiplication by s rounds (q - z) s once, as the reference does: three packed 16-bit operations a pair
    of weights (sm_90a SASS: 4.8 instructions a weight at 16 x 128 tiles, the reshaping kernel's 9.1)."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_kp = tl.arange(0, BLOCK_K // 8)
    m_mask = offs_m < M
    n_mask = offs_n < N
    k_tiles = tl.cdiv(K, BLOCK_K)
    t0 = pid_k * k_tiles_per_split
    t1 = tl.minimum(t0 + k_tiles_per_split, k_tiles)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    w_ty = X.dtype.element_ty if HALF else tl.float32
    for t in range(t0, t1):
        k0 = t * BLOCK_K
        kp = k0 // 8 + offs_kp
        if EVEN_K:
            q_mask = n_mask[None, :]
        else:
            q_mask = n_mask[None, :] & (kp < K // 8)[:, None]
        packed = tl.load(QW + kp[:, None] * stride_qk + offs_n[None, :], mask=q_mask, other=0)
        g = k0 // group_size
        s = tl.load(S + g * stride_sg + offs_n, mask=n_mask, other=0.0).to(w_ty)
        zb = (tl.load(Z + g * stride_sg + offs_n, mask=n_mask, other=0.0).to(tl.float32) + MAGIC).to(w_ty)
        for j in tl.static_range(8):
            k = k0 + offs_kp * 8 + j
            if HAS_PERM:
                kx = tl.load(Perm + k, mask=k < K, other=0)
            else:
                kx = k
            if EVEN_K:
                x_mask = m_mask[:, None]
            else:
                x_mask = m_mask[:, None] & (k < K)[None, :]
            x = tl.load(X + offs_m[:, None] * stride_xm + kx[None, :], mask=x_mask, other=0.0)
            bits = ((packed >> (4 * j)) & 0xF) | MAGIC_BITS
            if HALF:
                q_m = bits.to(tl.int16).to(w_ty, bitcast=True)
            else:
                q_m = bits.to(tl.float32, bitcast=True)
            w = ((q_m - zb[None, :]) * s[None, :]).to(X.dtype.element_ty)
            acc = tl.dot(x, w, acc)
    store_tile(acc, Y, Bias, offs_m, offs_n, m_mask, n_mask, stride_ym, stride_ys, pid_k, SPLIT, HAS_BIAS)


def int4_block_k(k: int, group_size: int) -> int | None:
    """The K tile that keeps every tile in one group: the largest power of two <= MAX_BLOCK_K dividing group_size
    (any, for a single group), at least MIN_BLOCK_K; None where there is none (the dequantizing path)."""
    if group_size >= k:
        return MAX_BLOCK_K
    b = MAX_BLOCK_K
    while b >= MIN_BLOCK_K:
        if group_size % b == 0:
            return b
        b //= 2
    return None


def check_int4(k: int, n: int, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int,
               perm: torch.Tensor | None) -> None:
    groups = -(-k // group_size) if group_size > 0 else 0
    if group_size <= 0 or k % INT4_PACK or tuple(qweight.shape) != (k // INT4_PACK, n) or qweight.dtype != torch.int32:
        raise ValueError(f"an INT4 GEMM of input size {k} takes a ({k // INT4_PACK}, N) int32 qweight and a positive "
                         f"group size, got {tuple(qweight.shape)} {qweight.dtype}, group size {group_size}")
    if tuple(scales.shape) != (groups, n) or tuple(zeros.shape) != (groups, n):
        raise ValueError(f"INT4 scales and zeros must be ({groups}, {n}) for group size {group_size}, got "
                         f"{tuple(scales.shape)} and {tuple(zeros.shape)}")
    if perm is not None and tuple(perm.shape) != (k,):
        raise ValueError(f"an act-order permutation has {k} entries, got shape {tuple(perm.shape)}")


def tuned_skinny(x2: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                 group_size: int) -> int4_skinny.Int4GemvConfig | None:
    """The few-row kernel's config (int4_skinny.py) where this GPU model's tuned table has one for this shape, group
    size and row bucket (quant_tuned.py; none without a table), else None."""
    m, k = x2.shape
    n = qweight.shape[1]
    cfg = quant_tuned.lookup(x2.device, "w4a16", n, k, m, group_size)
    if cfg is None or scales.stride(0) != zeros.stride(0) or not int4_skinny.takes(m, k, group_size, cfg):
        return None
    return cfg


def tuned_mma(x2: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
              group_size: int) -> int4_mma.Int4MmaConfig | None:
    """int4_mma.py's config where this GPU model's tuned table has one for this shape, group size and row bucket (5..256
    rows; none without a table), else None."""
    m, k = x2.shape
    cfg = quant_tuned.lookup(x2.device, "w4a16_mma", qweight.shape[1], k, m, group_size)
    if cfg is None or scales.stride(0) != zeros.stride(0) or not int4_mma.takes(m, k, group_size, x2.dtype, cfg):
        return None
    return cfg


def w4a16_linear(x2: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int,
                 perm: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                 gemv_max_rows: int = int4_gemv.GEMV_MAX_ROWS, cfg: TileConfig | None = None,
                 gemv_cfg: int4_gemv.GemvConfig = int4_gemv.GEMV_CONFIG) -> torch.Tensor:
    """The Triton kernels' launch: x2 (M, K) with unit column stride -> (M, N) in x2's dtype; int4_block_k must
    find a K tile. Where this GPU model's tuned table has a config (cfg not given): int4_skinny.py's kernel
    (tuned_skinny, 1-4 rows) or int4_mma.py's (tuned_mma, 5-256 rows). Up to gemv_max_rows rows: the CUDA-core
    kernel (int4_gemv.py). cfg: the row bucket's (INT4_CONFIGS) unless given, as gemv_cfg
    (benchmarks/kernels/quant_gemm.py --sweep)."""
    m, k = x2.shape
    n = qweight.shape[1]
    block_k = int4_block_k(k, group_size)
    if block_k is None:
        raise ValueError(f"no K tile of {MIN_BLOCK_K}..{MAX_BLOCK_K} channels divides the group size {group_size}")
    skinny = tuned_skinny(x2, qweight, scales, zeros, group_size) if cfg is None else None
    if skinny is not None:
        return int4_skinny.w4a16_skinny_linear(x2, qweight, scales, zeros, group_size, perm, bias, skinny)
    mma = tuned_mma(x2, qweight, scales, zeros, group_size) if cfg is None else None
    if mma is not None:
        return int4_mma.w4a16_mma_linear(x2, qweight, scales, zeros, group_size, perm, bias, mma)
    if m <= gemv_max_rows:
        return int4_gemv.w4a16_gemv(x2, qweight, scales, zeros, group_size, block_k, perm, bias, gemv_cfg)
    cfg = cfg or INT4_CONFIGS[tiles.bucket_of(m)]
    grid_n, grid_m = triton.cdiv(n, cfg.block_n), triton.cdiv(m, cfg.block_m)
    split = tiles.split_k(grid_n * grid_m, triton.cdiv(k, block_k), tiles.sm_count(x2.device), cfg.split)
    y, out = tiles.split_outputs(m, n, x2.dtype, x2.device, split)
    nibbles = cfg.nibbles and block_k == NIBBLES_BLOCK_K and x2.dtype in _MAGIC
    kernel, extra = _w4a16_kernel, {}
    if nibbles:
        bits, value, half = _MAGIC[x2.dtype]
        kernel, extra = _w4a16_nibbles_kernel, {"MAGIC_BITS": bits, "MAGIC": value, "HALF": half}
    kernel[(grid_n, grid_m, split.splits)](
        x2, perm if perm is not None else qweight, qweight, scales, zeros, bias if bias is not None else y, out, m, n,
        k, group_size, x2.stride(0), qweight.stride(0), scales.stride(0), out.stride(-2),
        out.stride(0) if split.splits > 1 else 0, split.k_tiles_per_split, HAS_PERM=perm is not None,
        HAS_BIAS=bias is not None, SPLIT=split.splits > 1, EVEN_K=k % block_k == 0, BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n, BLOCK_K=block_k, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **extra)
    if split.splits > 1:
        splitk.reduce_splits(out, bias, y)
    return y


def dequant_scratch(x2: torch.Tensor, n: int,
                    group_size: int) -> tuple[torch.Tensor, int4_dequant.DequantConfig] | None:
    """The (N, K) scratch and kernel config of int4_dequant.py's path where this GEMM takes it (from its min_rows
    rows: the tuned table's or the default; inside a CUDA-graph capture only where the device's scratch is already
    large enough), else None."""
    m, k = x2.shape
    choice = int4_dequant.choice_for(x2.device, n, k, group_size)
    if not choice.takes(m):
        return None
    capturing = x2.is_cuda and torch.cuda.is_current_stream_capturing()
    w = int4_dequant.scratch_for(x2.device).take(n, k, x2.dtype, capturing)
    return None if w is None else (w, choice.config)


def int4_linear_cuda(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                     group_size: int, perm: torch.Tensor | None = None,
                     bias: torch.Tensor | None = None) -> torch.Tensor:
    """kernels.quant.int4_linear on CUDA: x (..., K) in bfloat16 or float16. From the weight's min_rows rows
    (int4_dequant.choice_for: 512 without a tuned entry) the weight is dequantized into the device's scratch and
    multiplied by cuBLAS (int4_dequant.py); fewer rows run the Triton kernels (w4a16_linear); float32, or a group size
    no K tile divides, below min_rows: the reference's dequantize-then-matmul."""
    k = x.shape[-1]
    n = qweight.shape[1]
    check_int4(k, n, qweight, scales, zeros, group_size, perm)
    x2 = x.reshape(-1, k)
    if x2.shape[0] == 0:
        return x.new_empty(*x.shape[:-1], n)
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    unit = qweight.stride(1) == 1 and scales.stride(1) == 1 and zeros.stride(1) == 1
    dq = dequant_scratch(x2, n, group_size) if unit and x.dtype in (torch.bfloat16, torch.float16) else None
    if dq is not None:
        y = int4_dequant.w4a16_dequant_linear(x2, qweight, scales, zeros, group_size, perm, bias, *dq)
    elif x.dtype in (torch.bfloat16, torch.float16) and int4_block_k(k, group_size) is not None and unit:
        y = w4a16_linear(x2, qweight, scales, zeros, group_size, perm, bias)
    else:
        if perm is not None:
            x2 = x2.index_select(-1, perm)
        y = torch.nn.functional.linear(x2, dequant_int4(qweight, scales, zeros, group_size, x.dtype), bias)
    return y.reshape(*x.shape[:-1], n)
