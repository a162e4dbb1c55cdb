"""W4A16 on the tensor cores for 5..256 rows (Triton), on reference.py's INT4 layout: reference.int4_linear's result,
chosen only where this GPU model's tuned table (quant_tuned.py, kind "w4a16_mma") names a config for the GEMM's shape,
group size and row bucket (8, 16, 64, 256); with no entry int4_gemm.py's default kernels run.

Shape of work (skinny_mma.py's): the product's operands are swapped, acc[BLOCK_N, BLOCK_M] += W[BLOCK_N, k] @ x^T,
so the weight band is the MMA's long side (on Hopper the register operand of wgmma: dequantized in registers, no
shared-memory round trip) and the few rows its short side (16..256). Every program covers all BLOCK_M rows, so each
weight is dequantized once per BLOCK_M rows; a 128-channel K tile is 16 words a column, and nibble j of them is the
weight of channels 8 kp + j: eight dots of K = BLOCK_K / 8 per tile, one per nibble, with no unpacking reshape
(int4_gemm._w4a16_nibbles_kernel's arithmetic). Dequantization: the nibble or-ed into a magic float's mantissa (bf16
0x4300 = 128, fp16 0x6400 = 1024; float32 0x4B000000 in the interpreter) is MAGIC + q exactly; minus MAGIC + z (per
column, once a group) it is q - z, exact; one multiplication by s rounds once, as the reference does. With
Int4MmaConfig.asm (CUDA) two weights share a register: prmt, one LOP3 and two packed FMAs a pair (_pair_asm). The K
loop's sm_90 SASS (Triton 3.9, benchmarks/kernels/w4a16_mma_sass.py): the weight is wgmma's register operand, no
spills; 16 x 64 x 128 tiles 5.8 instructions a weight with asm (7.0 without), 16 x 128 x 128 4.3, 16 x 128 x 256
3.6. Not yet timed on a GPU: benchmarks/kernels/w4a16_mma_sweep.py writes the table entries.

x's channels for nibble j (XLoad): SPLIT loads the [BLOCK_M, BLOCK_K] tile contiguously (pipelined) and splits it in
registers (reshape + three tl.split: free where a thread holds eight consecutive channels); STRIDED loads each
nibble's channels directly (stride 8); GATHERED permutes x once before the launch (nibble-major within each K tile,
one gather, act-order's permutation composed into it) so that each nibble's channels are a contiguous slice, loaded
straight into the dot's shared-memory operand by the pipeline (X is specialized as 16-byte aligned; a misaligned x
is copied first). Scales and zeros: one row per K tile where the tile lies in one group; for groups of 8..64
channels the tile's BLOCK_K / g rows are loaded once and broadcast to the words. Split K (tiles.split_k from N's
tiles: about two programs an SM) where the output tiles are fewer than two waves. Capturable in CUDA graphs (one
allocation size per row count, no host sync); M is not specialized on."""
from __future__ import annotations

import enum
import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from radixlm.runtime.kernels.quant import splitk, tiles
from radixlm.runtime.kernels.quant.reference import INT4_PACK
from radixlm.runtime.kernels.quant.splitk import store_tile

ROW_BOUNDS = (8, 16, 64, 256)  # the row buckets (tiles.ROW_BUCKETS) a table entry may name: 5..256 rows
BLOCK_KS = (128, 256)  # BLOCK_K / 8 >= 16: each nibble's dot has the MMA's K
_MAGIC = {torch.bfloat16: (0x4300, 128.0, True), torch.float16: (0x6400, 1024.0, True),
          torch.float32: (0x4B000000, 8388608.0, False)}  # (bits, value, 16-bit)


class XLoad(str, enum.Enum):
    SPLIT = "split"
    STRIDED = "strided"
    GATHERED = "gathered"


_ASM_KIND = {torch.bfloat16: 1, torch.float16: 2}
_XMODE = {XLoad.SPLIT: 0, XLoad.STRIDED: 1, XLoad.GATHERED: 2}


@dataclass(frozen=True)
class Int4MmaConfig:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    split_k: int = 0  # 0: tiles.split_k's (about two programs an SM); 1: none; more: at most this many
    x_load: XLoad = XLoad.SPLIT
    asm: bool = False  # _pair_asm's dequantization (CUDA and 16-bit x only; the interpreter runs the other)

    def __post_init__(self):
        object.__setattr__(self, "x_load", XLoad(self.x_load))
        tiles.check_mma_config(self, BLOCK_KS)


def _pair_asm(magic2: int, one2: int, fma: str) -> tl.constexpr:
    """Two weights (nibble j of two words, pack=2: $1, $2) in one 32-bit register: prmt puts the byte holding the
    nibble of each word in the register's two halves ($5: the selector), shr by 4 for an odd nibble ($7), one LOP3
    masks it into the magic float's mantissa (MAGIC + q per half), then (MAGIC + q) * 1 - (MAGIC + z) (exact) and
    * s (one rounding, as the reference's) in packed 16-bit FMAs; $3: s, $4: -(MAGIC + z), two per register."""
    return tl.constexpr("{ .reg .b32 t, c; prmt.b32 t, $1, $2, $5; shr.b32 t, t, $7; "
                        f"lop3.b32 t, t, 0x000F000F, {magic2:#x}, 0xEA; mov.b32 c, {one2:#x}; "
                        f"fma.rn.{fma} t, t, c, $4; mov.b32 c, 0x80008000; fma.rn.{fma} $0, t, $3, c; }}")


_ASM_BF16 = _pair_asm(0x43004300, 0x3F803F80, "bf16x2")
_ASM_FP16 = _pair_asm(0x64006400, 0x3C003C00, "f16x2")


@triton.jit
def _nibble_dot(acc, packed, j: tl.constexpr, x_j, s, zb, MAGIC_BITS: tl.constexpr, HALF: tl.constexpr,
                ASM: tl.constexpr):
    """acc + W_j @ x_j^T: W_j [BLOCK_N, BLOCK_K / 8] the dequantized nibble j of the words, x_j [BLOCK_M, BLOCK_K / 8]
    x's channels 8 kp + j. ASM (CUDA, 16-bit x; 1 bfloat16, 2 float16): two weights a register (_pair_asm; zb is then
    -(MAGIC + z))."""
    if ASM != 0:
        sel = tl.full(packed.shape, (j // 2) | ((4 + j // 2) << 8), tl.int32)
        shift = tl.full(packed.shape, 4 * (j % 2), tl.int32)
        if ASM == 1:
            w = tl.inline_asm_elementwise(_ASM_BF16, "=r,r,r,r,r,r,r,r,r", [packed, s, zb, sel, shift],
                                          dtype=tl.bfloat16, is_pure=True, pack=2)
        else:
            w = tl.inline_asm_elementwise(_ASM_FP16, "=r,r,r,r,r,r,r,r,r", [packed, s, zb, sel, shift],
                                          dtype=tl.float16, is_pure=True, pack=2)
    else:
        bits = ((packed >> (4 * j)) & 0xF) | MAGIC_BITS
        if HALF:
            q_m = bits.to(tl.int16).to(s.dtype, bitcast=True)
        else:
            q_m = bits.to(tl.float32, bitcast=True)
        w = ((q_m - zb) * s).to(x_j.dtype)
    return tl.dot(w, tl.trans(x_j), acc)


@triton.jit
def _x_nibble(X, offs_m, m_mask, k0, j: tl.constexpr, offs_kp, K, stride_xm, X_MODE: tl.constexpr,
              EVEN_K: tl.constexpr, BLOCK_K: tl.constexpr):
    if X_MODE == 1:
        k = k0 + offs_kp * 8 + j
    else:
        k = k0 + j * (BLOCK_K // 8) + offs_kp
    if EVEN_K:
        mask = m_mask[:, None]
    else:
        mask = m_mask[:, None] & (k < K)[None, :]
    return tl.load(X + offs_m[:, None] * stride_xm + k[None, :], mask=mask, other=0.0)


@triton.jit(do_not_specialize=["M", "stride_ys"])
def _w4a16_mma_kernel(X, QW, S, Z, Bias, Y, M, N, K, group_size, stride_xm, stride_qk, stride_sg, stride_ym,
                      stride_ys, k_tiles_per_split, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, EVEN_K: tl.constexpr,
                      GROUPS: tl.constexpr, X_MODE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, MAGIC_BITS: tl.constexpr, MAGIC: tl.constexpr, HALF: tl.constexpr,
                      ASM: tl.constexpr):
    """GROUPS: quantization groups in a K tile (1: the tile lies in one group, or the weight has one)."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_kp = tl.arange(0, BLOCK_K // 8)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N
    k_tiles = tl.cdiv(K, BLOCK_K)
    t0 = pid_k * k_tiles_per_split
    t1 = tl.minimum(t0 + k_tiles_per_split, k_tiles)
    w_ty = X.dtype.element_ty if HALF else tl.float32
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for t in range(t0, t1):
        k0 = t * BLOCK_K
        kp = k0 // 8 + offs_kp
        if EVEN_K:
            q_mask = n_mask[:, None]
        else:
            q_mask = n_mask[:, None] & (kp < K // 8)[None, :]
        packed = tl.load(QW + kp[None, :] * stride_qk + offs_n[:, None], mask=q_mask, other=0)
        if GROUPS == 1:
            g = k0 // group_size
            s = tl.load(S + g * stride_sg + offs_n, mask=n_mask, other=0.0).to(w_ty)[:, None]
            z = tl.load(Z + g * stride_sg + offs_n, mask=n_mask, other=0.0)
            zb = (z.to(tl.float32) + MAGIC).to(w_ty)[:, None]
            if ASM != 0:
                zb = -zb
        else:
            g = k0 // group_size + tl.arange(0, GROUPS)
            sz_off = g[None, :] * stride_sg + offs_n[:, None]
            sz_mask = n_mask[:, None] & (g * group_size < K)[None, :]
            s2 = tl.load(S + sz_off, mask=sz_mask, other=0.0).to(w_ty)
            z2 = (tl.load(Z + sz_off, mask=sz_mask, other=0.0).to(tl.float32) + MAGIC).to(w_ty)
            if ASM != 0:
                z2 = -z2
            s = tl.reshape(tl.broadcast_to(s2[:, :, None], [BLOCK_N, GROUPS, BLOCK_K // 8 // GROUPS]),
                      [BLOCK_N, BLOCK_K // 8])
            zb = tl.reshape(tl.broadcast_to(z2[:, :, None], [BLOCK_N, GROUPS, BLOCK_K // 8 // GROUPS]),
                       [BLOCK_N, BLOCK_K // 8])
        if X_MODE == 0:
            k = k0 + offs_k
            if EVEN_K:
                x_mask = m_mask[:, None]
            else:
                x_mask = m_mask[:, None] & (k < K)[None, :]
            x = tl.load(X + offs_m[:, None] * stride_xm + k[None, :], mask=x_mask, other=0.0)
            e, o = tl.split(tl.reshape(x, [BLOCK_M, BLOCK_K // 8, 2, 2, 2]))  # the channel's bit 0
            ee, eo = tl.split(e)
            oe, oo = tl.split(o)
            x0, x4 = tl.split(ee)
            x2, x6 = tl.split(eo)
            x1, x5 = tl.split(oe)
            x3, x7 = tl.split(oo)
        else:
            x0 = _x_nibble(X, offs_m, m_mask, k0, 0, offs_kp, K, stride_xm, X_MODE, EVEN_K, BLOCK_K)
            x1 = _x_nibble(X, offs_m, m_mask, k0, 1, offs_kp, K, stride_xm, X_MODE, EVEN_K, BLOCK_K)
            x2 = _x_nibble(X, offs_m, m_mask, k0, 2, offs_kp, K, stride_xm, X_MODE, EVEN_K, BLOCK_K)
            x3 = _x_nibble(X, offs_m, m_mask, k0, 3, offs_kp, K, stride_xm, X_MODE, EVEN_K, BLOCK_K)
            x4 = _x_nibble(X, offs_m, m_mask, k0, 4, offs_kp, K, stride_xm, X_MODE, EVEN_K, BLOCK_K)
            x5 = _x_nibble(X, offs_m, m_mask, k0, 5, offs_kp, K, stride_xm, X_MODE, EVEN_K, BLOCK_K)
            x6 = _x_nibble(X, offs_m, m_mask, k0, 6, offs_kp, K, stride_xm, X_MODE, EVEN_K, BLOCK_K)
            x7 = _x_nibble(X, offs_m, m_mask, k0, 7, offs_kp, K, stride_xm, X_MODE, EVEN_K, BLOCK_K)
        acc = _nibble_dot(acc, packed, 0, x0, s, zb, MAGIC_BITS, HALF, ASM)
        acc = _nibble_dot(acc, packed, 1, x1, s, zb, MAGIC_BITS, HALF, ASM)
        acc = _nibble_dot(acc, packed, 2, x2, s, zb, MAGIC_BITS, HALF, ASM)
        acc = _nibble_dot(acc, packed, 3, x3, s, zb, MAGIC_BITS, HALF, ASM)
        acc = _nibble_dot(acc, packed, 4, x4, s, zb, MAGIC_BITS, HALF, ASM)
        acc = _nibble_dot(acc, packed, 5, x5, s, zb, MAGIC_BITS, HALF, ASM)
        acc = _nibble_dot(acc, packed, 6, x6, s, zb, MAGIC_BITS, HALF, ASM)
        acc = _nibble_dot(acc, packed, 7, x7, s, zb, MAGIC_BITS, HALF, ASM)
    store_tile(tl.trans(acc), Y, Bias, offs_m, offs_n, m_mask, n_mask, stride_ym, stride_ys, pid_k, SPLIT, HAS_BIAS)


def groups_per_tile(k: int, group_size: int, block_k: int) -> int | None:
    """Quantization groups in one K tile: 1 where the tile lies in one group (group_size a multiple of block_k, or a
    single group), block_k / group_size for groups of 8..block_k / 2 channels dividing it; None otherwise."""
    if group_size >= k or (group_size > 0 and group_size % block_k == 0):
        return 1
    if group_size >= INT4_PACK and group_size % INT4_PACK == 0 and block_k % group_size == 0:
        return block_k // group_size
    return None


def takes(m: int, k: int, group_size: int, dtype: torch.dtype, cfg: Int4MmaConfig) -> bool:
    return (0 < m and k % INT4_PACK == 0 and dtype in _MAGIC and groups_per_tile(k, group_size, cfg.block_k) is not None
            and (cfg.x_load != XLoad.GATHERED or k % cfg.block_k == 0))


@functools.cache
def nibble_order(k: int, block_k: int, device: torch.device) -> torch.Tensor:
    """XLoad.GATHERED's channel order: position k0 + j * block_k / 8 + kp holds channel k0 + 8 kp + j (k a multiple
    of block_k)."""
    pos = torch.arange(k).reshape(k // block_k, block_k // 8, 8).transpose(1, 2).reshape(k)
    return pos.to(device)


def w4a16_mma_linear(x2: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                     group_size: int, perm: torch.Tensor | None, bias: torch.Tensor | None,
                     cfg: Int4MmaConfig) -> torch.Tensor:
    """x2 (M, K) bfloat16/float16 (float32: the interpreter) -> (M, N) in x2's dtype; qweight (K / 8, N) int32,
    scales and zeros (K / g, N) with unit column strides and one row stride (int4_gemm.check_int4's shapes). perm:
    act-order, x's channels gathered first."""
    m, k = x2.shape
    n = qweight.shape[1]
    if not takes(m, k, group_size, x2.dtype, cfg) or qweight.stride(1) != 1 or (
            scales.stride(1) != 1 or zeros.stride(1) != 1 or scales.stride(0) != zeros.stride(0)):
        raise ValueError(f"the W4A16 tensor-core kernel takes float32/bfloat16/float16 rows, K a multiple of 8 "
                         f"(of block_k {cfg.block_k} when gathered), a group size that is a multiple or a divisor "
                         f"(>= 8) of block_k, unit column strides and scales and zeros of one row stride; got {m} "
                         f"rows {x2.dtype}, K {k}, group {group_size}, {cfg}")
    if cfg.x_load == XLoad.GATHERED:
        order = nibble_order(k, cfg.block_k, x2.device)
        x2 = x2.index_select(1, order if perm is None else perm.index_select(0, order))
    elif perm is not None:
        x2 = x2.index_select(1, perm)
    if x2.stride(1) != 1 or x2.data_ptr() % 16 or x2.stride(0) % 8:
        x2 = x2.clone(memory_format=torch.contiguous_format)  # X is specialized as 16-byte aligned (cp.async)
    grid_n, grid_m = triton.cdiv(n, cfg.block_n), triton.cdiv(m, cfg.block_m)
    k_tiles = triton.cdiv(k, cfg.block_k)
    split = tiles.config_split(cfg.split_k, grid_n, k_tiles, x2.device)
    y, out = tiles.split_outputs(m, n, x2.dtype, x2.device, split)
    bits, value, half = _MAGIC[x2.dtype]
    _w4a16_mma_kernel[(grid_n, grid_m, split.splits)](
        x2, qweight, scales, zeros, bias if bias is not None else y, out, m, n, k, group_size, x2.stride(0),
        qweight.stride(0), scales.stride(0), out.stride(-2), out.stride(0) if split.splits > 1 else 0,
        split.k_tiles_per_split, HAS_BIAS=bias is not None, SPLIT=split.splits > 1, EVEN_K=k % cfg.block_k == 0,
        GROUPS=groups_per_tile(k, group_size, cfg.block_k), X_MODE=_XMODE[cfg.x_load], BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, MAGIC_BITS=bits, MAGIC=value, HALF=half,
        ASM=_ASM_KIND.get(x2.dtype, 0) if cfg.asm and x2.is_cuda else 0, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages)
    if split.splits > 1:
        splitk.reduce_splits(out, bias, y)
    return y
