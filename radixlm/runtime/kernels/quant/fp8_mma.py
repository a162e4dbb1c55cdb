"""FP8 W8A8 on the tensor cores for 5..256 rows (Triton): reference.fp8_linear_w8a8's result for per-tensor,
per-channel and 128x128-block weight scales, chosen only where this GPU model's tuned table (quant_tuned.py, kind
"fp8_mma") names a config for the GEMM's shape, block K size (0: per tensor / channel) and row bucket (8, 16, 64,
256); with no entry fp8_gemm.py's paths run as before.

Shape of work (int4_mma.py's and skinny_mma.py's): the product's operands are swapped, acc[BLOCK_N, BLOCK_M] +=
W[BLOCK_N, k] @ q^T, so the weight band fills the MMA's long side and the few rows its short side (16..256); every
program covers BLOCK_M rows, so the weight is read once per BLOCK_M rows. Both operands are e4m3 and K-contiguous
(the weight (N, K), the activations (M, K)), as Hopper's FP8 wgmma needs. Accumulation in float32, promoted once a K
tile: each tile's dot starts from zero and is added to the float32 accumulator (Hopper's FP8 MMA keeps fewer bits
than float32 along one chain of instructions, and Triton's default for FP8 dots never promotes: DeepSeek-V3's
promotion every 128 channels; the block path needs the per-tile product anyway, to scale it).

Arithmetic (reference.fp8_linear_w8a8, as fp8_gemm._w8a8_kernel): the activations are quantized to e4m3, per token
(per-tensor / per-channel weights: fp8_act.quant_fp8_per_token's launch before this one, since a row's scale needs
the whole row), per token per group of the weight block's K size (block weights), or with the checkpoint's static
input scale. Where the scale of a K tile's activations is known inside the tile (block weights: the tile is the
group; a static scale), Fp8MmaConfig.fused_act quantizes them in the kernel's K loop instead (fp8_act's arithmetic:
scale = max(amax, ACT_EPS) / FP8_MAX, q = x / scale rounded to nearest, clamped), one launch and no quantized copy;
otherwise fp8_act's kernels run first. Scales: per tensor / per channel once after the K loop (acc * a_s[m] *
w_s[n]); blocks per K tile (each K tile is one block column: dot * a_s[m, t] * w_s[n // bn, t], summed in float32).
Split K (tiles.split_k from N's tiles: about two programs an SM) where the output tiles are fewer than two waves; the
float32 partials are summed by splitk.reduce_splits, which adds the bias and rounds once.

Capturable in CUDA graphs (one allocation size per row count, no host sync); M is not specialized on and the split
depends on N's tiles only, so one variant per row bucket (start-up's warm-up: tiles.warmup_rows builds them). x is
copied first where its rows are not 16-element aligned (the launches are specialized on it)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from radixlm.runtime.kernels.numerics import div_rn_f32
from radixlm.runtime.kernels.quant import fp8_act, splitk, tiles
from radixlm.runtime.kernels.quant.reference import ACT_EPS, FP8_DTYPE, FP8_MAX
from radixlm.runtime.kernels.quant.splitk import store_tile, tile_range

ROW_BOUNDS = (8, 16, 64, 256)  # the row buckets (tiles.ROW_BUCKETS) a table entry may name: 5..256 rows
BLOCK_KS = (64, 128, 256)  # an 8-bit dot's K is at least 32; the block weights' tile is their block K (128)
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)  # float32: the interpreter


class _Act:
    """The activations' quantization (the kernel's ACT): already quantized (x is e4m3, XS its scales), quantized per
    row in each K tile (block weights, fused), or with a static scale at XS (fused)."""
    PRE, TILE, STATIC = 0, 1, 2


@dataclass(frozen=True)
class Fp8MmaConfig:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    split_k: int = 0  # 0: tiles.split_k's (about two programs an SM); 1: none; more: at most this many
    fused_act: bool = False  # quantize the activations in the K loop where the scheme allows (blocks, static scale)

    def __post_init__(self):
        tiles.check_mma_config(self, BLOCK_KS)
        if not isinstance(self.fused_act, bool):
            raise ValueError(f"Fp8MmaConfig.fused_act must be true or false, got {self.fused_act!r}")


@triton.jit(do_not_specialize=["M", "stride_ys"])
def _fp8_mma_kernel(X, XS, W, WS, Bias, Y, M, N, K, stride_xm, stride_xsm, stride_wn, stride_wsn, stride_wsk,
                    stride_ym, stride_ys, k_tiles_per_split, eps, fp8_max, ACT: tl.constexpr,
                    BLOCKWISE: tl.constexpr, GROUP_N: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr,
                    EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """y = (q * a_s) @ (w * w_s)^T, accumulated as acc[BLOCK_N, BLOCK_M]. BLOCKWISE: w_s (ceil(N / GROUP_N), K /
    BLOCK_K) and (ACT PRE) a_s (M, K / BLOCK_K), applied per K tile; else w_s (N,) or one value (stride 0) and a_s
    (M,) or one value, applied once after the loop."""
    offs_m, offs_n, offs_k, m_mask, n_mask, t0, t1, pid_k = tile_range(M, N, K, k_tiles_per_split, BLOCK_M,
                                                                        BLOCK_N, BLOCK_K)
    x_ptrs = X + offs_m[:, None] * stride_xm + offs_k[None, :]
    w_ptrs = W + offs_n[:, None] * stride_wn + offs_k[None, :]
    if ACT == 2:
        static = tl.load(XS).to(tl.float32)
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for t in range(t0, t1):
        k0 = t * BLOCK_K
        if EVEN_K:
            x_mask = m_mask[:, None]
            w_mask = n_mask[:, None]
        else:
            k_mask = (k0 + offs_k) < K
            x_mask = m_mask[:, None] & k_mask[None, :]
            w_mask = n_mask[:, None] & k_mask[None, :]
        w = tl.load(w_ptrs + k0, mask=w_mask, other=0.0)
        x = tl.load(x_ptrs + k0, mask=x_mask, other=0.0)
        if ACT == 1:
            xf = x.to(tl.float32)
            a_s = tl.maximum(tl.max(tl.abs(xf), axis=1), eps) / fp8_max
            q = tl.clamp(div_rn_f32(xf, a_s[:, None]), -fp8_max, fp8_max).to(W.dtype.element_ty)
        elif ACT == 2:
            q = tl.clamp(div_rn_f32(x.to(tl.float32), static), -fp8_max, fp8_max).to(W.dtype.element_ty)
        else:
            q = x
        if BLOCKWISE:
            if ACT == 0:
                a_s = tl.load(XS + offs_m * stride_xsm + t, mask=m_mask, other=0.0)
            w_s = tl.load(WS + (offs_n // GROUP_N) * stride_wsn + t * stride_wsk, mask=n_mask, other=0.0)
            acc += tl.dot(w, tl.trans(q)) * a_s[None, :] * w_s[:, None]
        else:
            acc += tl.dot(w, tl.trans(q))
    if not BLOCKWISE:
        if ACT == 2:
            a_s = tl.full([BLOCK_M], 0.0, tl.float32) + static
        else:
            a_s = tl.load(XS + offs_m * stride_xsm, mask=m_mask, other=0.0)
        w_s = tl.load(WS + offs_n * stride_wsn, mask=n_mask, other=0.0)
        acc = acc * a_s[None, :] * w_s[:, None]
    store_tile(tl.trans(acc), Y, Bias, offs_m, offs_n, m_mask, n_mask, stride_ym, stride_ys, pid_k, SPLIT, HAS_BIAS)


def takes(m: int, k: int, block: tuple[int, int] | None, dtype: torch.dtype, cfg: Fp8MmaConfig) -> bool:
    """Whether the kernel runs this GEMM at cfg: block weights need the K tile to be the block's K size."""
    return 0 < m and dtype in _DTYPES and (block is None or (block[0] > 0 and block[1] == cfg.block_k))


def act_mode(block: tuple[int, int] | None, input_scale: torch.Tensor | None, cfg: Fp8MmaConfig) -> int:
    """The kernel's ACT for this scheme: fused where cfg asks and the K tile's activation scale is known in it."""
    if cfg.fused_act and block is not None:
        return _Act.TILE
    if cfg.fused_act and input_scale is not None:
        return _Act.STATIC
    return _Act.PRE


def fp8_mma_linear(x2: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] | None,
                   bias: torch.Tensor | None, input_scale: torch.Tensor | None, cfg: Fp8MmaConfig,
                   rows: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """x2 (M, K) bfloat16 / float16 (float32: the interpreter) -> (M, N) in x2's dtype; weight (N, K) float8_e4m3fn
    with unit column stride; scale one value, (N,) or the block grid (ceil(N / bn), ceil(K / bk)); input_scale: a
    static activation scale (per-tensor / per-channel weights only). rows: x2 already quantized per token (q, scale:
    fp8_prologue.quantized_rows; per-tensor / per-channel weights, dynamic activations), x2 then only their shape."""
    m, k = x2.shape
    n = weight.shape[0]
    if weight.dtype != FP8_DTYPE or weight.shape[1] != k or weight.stride(1) != 1 or not takes(m, k, block, x2.dtype,
                                                                                               cfg):
        raise ValueError(f"the FP8 tensor-core kernel takes float32/bfloat16/float16 rows and a ({n}, {k}) "
                         f"{FP8_DTYPE} weight with unit column stride, block weights with block_k their block's K "
                         f"size; got {m} rows {x2.dtype}, weight {tuple(weight.shape)} {weight.dtype}, block {block}, "
                         f"{cfg}")
    if block is not None and input_scale is not None:
        raise ValueError("block-scaled FP8 weights take dynamic activations: no static input scale")
    if input_scale is not None and input_scale.numel() != 1:
        raise ValueError(f"a static activation scale has one value, got shape {tuple(input_scale.shape)}")
    act = act_mode(block, input_scale, cfg)
    if rows is None and (x2.stride(1) != 1 or x2.data_ptr() % 16 or (x2.stride(0) % 16 and x2.stride(0) != k)):
        x2 = x2.clone(memory_format=torch.contiguous_format)  # the launches are specialized on 16-element rows
    if act == _Act.PRE:
        if rows is not None:
            x, x_scale = rows
        elif block is not None:
            x, x_scale = fp8_act.quant_fp8_per_group(x2, block[1])
        else:
            x, x_scale = fp8_act.quant_fp8_per_token(x2, input_scale)
        stride_xsm = x_scale.stride(0) if x_scale.dim() == 2 else 0
    else:
        x = x2
        x_scale = input_scale.to(torch.float32).reshape(1) if act == _Act.STATIC else x  # (TILE: unused)
        stride_xsm = 0
    if block is not None:
        w_scale, stride_wsn, stride_wsk = scale, scale.stride(0), scale.stride(1)
    else:
        w_scale = scale.reshape(-1)
        stride_wsn, stride_wsk = (w_scale.stride(0) if w_scale.numel() > 1 else 0), 0
    grid_n, grid_m = triton.cdiv(n, cfg.block_n), triton.cdiv(m, cfg.block_m)
    k_tiles = triton.cdiv(k, cfg.block_k)
    split = tiles.config_split(cfg.split_k, grid_n, k_tiles, x2.device)
    y, out = tiles.split_outputs(m, n, x2.dtype, x2.device, split)
    _fp8_mma_kernel[(grid_n, grid_m, split.splits)](
        x, x_scale, weight, w_scale, bias if bias is not None else y, out, m, n, k, x.stride(0), stride_xsm,
        weight.stride(0), stride_wsn, stride_wsk, out.stride(-2), out.stride(0) if split.splits > 1 else 0,
        split.k_tiles_per_split, ACT_EPS, FP8_MAX, ACT=act, BLOCKWISE=block is not None,
        GROUP_N=block[0] if block is not None else 1, HAS_BIAS=bias is not None, SPLIT=split.splits > 1,
        EVEN_K=k % cfg.block_k == 0, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if split.splits > 1:
        splitk.reduce_splits(out, bias, y)
    return y
