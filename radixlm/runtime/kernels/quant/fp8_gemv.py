"""FP8 weights, 16-bit activations, for the few rows of decode (1..4), shaped like the bf16 skinny GEMM
(kernels/gemm/skinny_gemm.py): reference.fp8_linear's result (activations not quantized) in one launch, or two with a
split K. Off unless this GPU model's tuned table (quant_tuned.py) names a config for the GEMM's shape and row bucket.
At one row it also runs the skinny kernel's fused steps (the norm or SiLU-and-mul before the GEMM, the qkv GEMM's
rotary epilogue; gemm/fused_steps.py) where the table names a launch for them (fp8_gemm.tuned_fused): fused, the
norm is recomputed by every program, which paid for qkv_proj only (fp8_gemv_fused_sweep.py).

Why the W8A8 path ran ~2.2x its bytes floor at one row (102.5 us a Llama-8B layer against 45.5, H200) while the bf16
skinny kernel ran 1.38x: three launches a GEMM (activation quantization, the GEMM, the split-K reduction; each ~2 us
of a CUDA graph's device time, against floors of 3.5-24.5 us), and 16-row tensor-core tiles that keep ~8 KB of weight
in flight a program (BLOCK_N 16 x 128 bytes x 4 stages) at ~2 programs an SM on down_proj (no split there), where an
SM needs ~40 KB in flight to stream its share of 4.8 TB/s. The first weight-only kernel (fp8_w8a16.py) ran one or
two warps a program at ~3 programs an SM: at ~4 instructions a weight it could not issue the ~20 weights a clock an SM
that FP8 at 4.8 TB/s needs.

Here, as in the skinny kernel, many narrow programs (N / BLOCK_N x SPLIT_K) each stream a [BLOCK_N, K / SPLIT_K] band
of the weight in [BLOCK_N, BLOCK_K] tiles, the next tile's load issued before this tile's arithmetic (a register
double buffer: loads that feed no tl.dot are not staged by Triton's pipeliner). Compiled for sm_90 (Triton 3.9,
ptxas 13; the loop's SASS), three things made the difference:
  - the weight is loaded as int32 words (4 channels) and x as int64 words (four 16-bit values), two words a thread:
    loaded as fp8 and bf16 tiles, Triton gave them different vector widths and converted x's tile through shared
    memory (STS/LDS and two barriers) every step; with BLOCK_K = 256 x num_warps both tiles share one layout;
  - each word widens to four float32 in inline PTX (two packed cvt.rn.f16x2.e4m3x2, four cvt.f32.f16: 1.5
    instructions a weight); Triton's own cast unpacked the bytes one by one first (PRMT, LOP3, IMAD per pair);
  - one elementwise [BLOCK_N, BLOCK_K / 4] float32 accumulator a row (the skinny kernel's acc0..acc3), reduced once
    after the loop; a [ROWS, BLOCK_N, BLOCK_K] one compiled to shared-memory layout conversions in the loop.
The loop then runs ~3.9 instructions a weight at one row (HADD2.F32 1, FFMA 1, F2FP 0.5, the rest addressing),
~6.2 at two, ~11.6 at four (BLOCK_N 2), no shared memory. More rows than 4 stay on the tensor-core paths.
Scales: per tensor or per channel once after the loop; blocks (BLOCK_N dividing the block's N size) scale x per word
by its block's scale (a program's channels lie in one block row). The bias is added before the one rounding to the
output dtype (or by splitk.reduce_splits after the partials)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.runtime.kernels.gemm.epilogue import MAX_ROWS as EPILOGUE_MAX_ROWS, RotaryStore
from radixlm.runtime.kernels.gemm.epilogue import kernel_args as epilogue_args
from radixlm.runtime.kernels.gemm.fused_steps import epilogue_columns, rotary_store
from radixlm.runtime.kernels.gemm.prologue import Prologue, PrologueKind
from radixlm.runtime.kernels.pdl import pdl_options, pdl_wait
from radixlm.runtime.kernels.quant import splitk, tiles
from radixlm.runtime.kernels.quant.x_words import inv_rms_words, prologue_quarters, store_rows, x_quarters

MAX_ROWS = 4  # the CUDA cores' row counts (one accumulator a row); more rows take the tensor-core paths


class Fp8GemvConfig(tiles.SkinnyConfig):
    """fp8_gemv's launch."""


# 4 packed e4m3 to 4 float32: two packed cvt.rn.f16x2.e4m3x2 (sm_89), then cvt.f32.f16 (HADD2.F32). Triton's own cast
# unpacks the bytes one by one first (a PRMT, a LOP3 and an IMAD per pair: ~2 more instructions a weight, sm_90).
F32_CVT = ("{\n.reg .b16 lo, hi, a0, a1, a2, a3;\n.reg .b32 h0, h1;\nmov.b32 {lo, hi}, $4;\n"
           "cvt.rn.f16x2.e4m3x2 h0, lo;\ncvt.rn.f16x2.e4m3x2 h1, hi;\nmov.b32 {a0, a1}, h0;\nmov.b32 {a2, a3}, h1;\n"
           "cvt.f32.f16 $0, a0;\ncvt.f32.f16 $1, a1;\ncvt.f32.f16 $2, a2;\ncvt.f32.f16 $3, a3;\n}")


def cvt_asm(x: torch.Tensor) -> str:
    """The CVT constexpr of a launch: F32_CVT where the device has the packed cvt (sm_89), else "" (Triton's cast:
    the interpreter, older GPUs)."""
    if not x.is_cuda or torch.cuda.get_device_capability(x.device) < (8, 9):
        return ""
    return F32_CVT


@triton.jit
def _load_w(w_ptrs, k0, k_next, k_end, n_mask, offs_k, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr):
    """The tile at k_next (EVEN_K: clamped to the split's last tile, so no mask along K; EVEN_N: none at all, no
    registers zeroed before each load)."""
    if EVEN_K and EVEN_N:
        return tl.load(w_ptrs + tl.minimum(k_next, k_end - offs_k.shape[0]))
    elif EVEN_K:
        return tl.load(w_ptrs + tl.minimum(k_next, k_end - offs_k.shape[0]), mask=n_mask[:, None], other=0.0)
    else:
        return tl.load(w_ptrs + k_next, mask=n_mask[:, None] & (k_next + offs_k < k_end)[None, :], other=0.0)


@triton.jit
def _row_fma(x0, x1, x2, x3, s0, d0, d1, d2, d3, acc, BLOCKWISE: tl.constexpr):
    """acc + sum_j d_j * x_j (x_j: x[row, 4 i + j]; elementwise: reduced once after the loop), x scaled per column
    by its block's scale."""
    if BLOCKWISE:
        x0 = x0 * s0  # a block's K size is a multiple of 4: one scale a word
        x1 = x1 * s0
        x2 = x2 * s0
        x3 = x3 * s0
    return acc + d0 * x0[None, :] + d1 * x1[None, :] + d2 * x2[None, :] + d3 * x3[None, :]


@triton.jit
def _bytes_f32(words, CVT: tl.constexpr):
    """The four e4m3 bytes of each int32 word (byte j: channel 4 i + j) as float32."""
    if CVT == "":
        d0 = (words & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)
        d1 = ((words >> 8) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)
        d2 = ((words >> 16) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)
        d3 = ((words >> 24) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)
        return d0, d1, d2, d3
    else:
        return tl.inline_asm_elementwise(CVT, "=r,=r,=r,=r,r", [words], dtype=(tl.float32,) * 4, is_pure=True,
                                         pack=1)


@triton.jit(do_not_specialize=["M", "stride_ys", "tiles_per_split"], do_not_specialize_on_alignment=["X", "Pos", "Loc"])
def _fp8_gemv_kernel(X, W, WS, Bias, Y, NW, R, RO, Pos, CosSin, Loc, KBuf, VBuf, M, N, K, stride_xm, stride_wn,
                     stride_wsn, stride_wsk, stride_ym, stride_ys, tiles_per_split, eps, n_q, n_kv, stride_cs,
                     stride_kb, stride_vb, k_scale, v_scale, ROWS: tl.constexpr, BLOCKWISE: tl.constexpr,
                     GROUP_N: tl.constexpr, GROUP_K: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr,
                     EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, XKIND: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, CVT: tl.constexpr, PRO: tl.constexpr = 0, EPI: tl.constexpr = False,
                     HEAD_DIM: tl.constexpr = 0, NORM_WORDS: tl.constexpr = 1024, PDL: tl.constexpr = False):
    """y[:M] = x[:M] @ (w * ws).T (+ bias) on the CUDA cores. W: the weight as int32 words of four channels (N, K / 4);
    X: XKIND's words (stride_xm in words). Program (pid_n, pid_k) sums tiles_per_split BLOCK_K tiles from tile
    pid_k * tiles_per_split (in tiles, so that Triton knows the offsets' alignment: vector loads). Rows past M (up to
    ROWS <= 4) repeat row M - 1 and are not stored. One [BLOCK_N, BLOCK_K / 4] accumulator a row, as the skinny
    kernel (a 3D [ROWS, BLOCK_N, BLOCK_K] one compiled to shared-memory layout conversions in the loop). Weights and
    x are loaded as words, in one layout: as fp8 and bf16 tiles Triton gave them different vector widths and converted
    x through shared memory every step, and unpacked the fp8 bytes one by one (~2 more instructions a weight).
    One row (ROWS 1) may take the skinny kernel's prologue (PRO; NW, R, RO in X's words; x the step's input, K the
    GEMM's) and, unsplit, its epilogue (EPI: the rotary embedding and KV store, fused_steps.rotary_store).
    PDL (pdl.py): the first weight tile is loaded before the wait for the previous kernel."""
    tl.static_assert(ROWS == 1 or (PRO == 0 and not EPI))
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    if EPI:
        offs_n, head0, j0 = epilogue_columns(pid_n, HEAD_DIM, BLOCK_N)
        first_n = head0  # a head lies in one block row (the launch checks)
    else:
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        first_n = pid_n * BLOCK_N
    offs_i = tl.arange(0, BLOCK_K // 4)
    n_mask = offs_n < N
    k_start = pid_k * tiles_per_split * BLOCK_K
    k_end = tl.minimum(k_start + tiles_per_split * BLOCK_K, K)
    i_end = k_end // 4  # K % 4 == 0 (the launch checks)
    # Two words (8 weights) a thread along K, as x's 16-byte loads hold two int64 words: with 16-byte weight loads the
    # vector widths differ and Triton converts x's tile through shared memory every step.
    w_ptrs = W + offs_n[:, None] * stride_wn + tl.max_contiguous(offs_i, 2)[None, :]
    ws_row = WS + (first_n // GROUP_N) * stride_wsn  # BLOCKWISE: the program's block row
    w_next = _load_w(w_ptrs, 0, k_start // 4, i_end, n_mask, offs_i, EVEN_K, EVEN_N)
    pdl_wait(PDL)
    r1 = tl.minimum(1, M - 1) * stride_xm
    r2 = tl.minimum(2, M - 1) * stride_xm
    r3 = tl.minimum(3, M - 1) * stride_xm
    res_end = tl.where(pid_n == 0, i_end, 0)  # PRO 2: program column 0 stores the new residual
    inv = 1.0
    if PRO == 1 or PRO == 2:  # every program computes the row's norm (a few KiB, from L2), as the skinny kernel
        inv = inv_rms_words(X, R, K, eps, PRO, XKIND, NORM_WORDS)
    acc0 = tl.zeros([BLOCK_N, BLOCK_K // 4], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_N, BLOCK_K // 4], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_N, BLOCK_K // 4], dtype=tl.float32)
    acc3 = tl.zeros([BLOCK_N, BLOCK_K // 4], dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        words = w_next
        w_next = _load_w(w_ptrs, 0, (k0 + BLOCK_K) // 4, i_end, n_mask, offs_i, EVEN_K, EVEN_N)
        i = k0 // 4 + offs_i
        i_mask = i < i_end
        s0 = 1.0
        if BLOCKWISE:
            g = ws_row + ((4 * i) // GROUP_K) * stride_wsk  # a block's K size is a multiple of 4
            if EVEN_K:
                s0 = tl.load(g)
            else:
                s0 = tl.load(g, mask=i_mask, other=0.0)
        d0, d1, d2, d3 = _bytes_f32(words, CVT)
        x0, x1, x2, x3 = x_quarters(X, 0, i, i_mask, k_end, XKIND, EVEN_K)
        if PRO != 0:
            x0, x1, x2, x3 = prologue_quarters(X, R, NW, RO, i, i_mask, k_end, K, inv, i < res_end,
                                               x0, x1, x2, x3, PRO, XKIND, EVEN_K)
        acc0 = _row_fma(x0, x1, x2, x3, s0, d0, d1, d2, d3, acc0, BLOCKWISE)
        if ROWS > 1:
            x0, x1, x2, x3 = x_quarters(X, r1, i, i_mask, k_end, XKIND, EVEN_K)
            acc1 = _row_fma(x0, x1, x2, x3, s0, d0, d1, d2, d3, acc1, BLOCKWISE)
        if ROWS > 2:
            x0, x1, x2, x3 = x_quarters(X, r2, i, i_mask, k_end, XKIND, EVEN_K)
            acc2 = _row_fma(x0, x1, x2, x3, s0, d0, d1, d2, d3, acc2, BLOCKWISE)
            x0, x1, x2, x3 = x_quarters(X, r3, i, i_mask, k_end, XKIND, EVEN_K)
            acc3 = _row_fma(x0, x1, x2, x3, s0, d0, d1, d2, d3, acc3, BLOCKWISE)
    if not BLOCKWISE:
        ws = tl.load(WS + offs_n * stride_wsn, mask=n_mask, other=0.0)
    else:
        ws = tl.full([BLOCK_N], 1.0, tl.float32)
    if EPI:
        y = tl.sum(acc0, axis=1) * ws
        if HAS_BIAS:
            y += tl.load(Bias + offs_n).to(tl.float32)
        rotary_store(y.to(Y.dtype.element_ty), Y, offs_n, head0, j0, Pos, CosSin, Loc, KBuf, VBuf, n_q, n_kv,
                     stride_cs, stride_kb, stride_vb, k_scale, v_scale, HEAD_DIM, BLOCK_N)
    else:
        store_rows(Y, Bias, offs_n, n_mask, pid_k, M, stride_ym, stride_ys, tl.sum(acc0, axis=1) * ws,
                   tl.sum(acc1, axis=1) * ws, tl.sum(acc2, axis=1) * ws, tl.sum(acc3, axis=1) * ws, ROWS, HAS_BIAS,
                   SPLIT)


def takes(m: int, n: int, k: int, block: tuple[int, int] | None, cfg: Fp8GemvConfig) -> bool:
    """Whether the kernel runs m rows of this weight at cfg: 1..MAX_ROWS rows, K a multiple of 4 (words); block
    weights need a program's channels in one block row and a block K size that is a multiple of 4."""
    if not 0 < m <= MAX_ROWS or k % 4:
        return False
    return block is None or (block[0] % cfg.block_n == 0 and block[1] % 4 == 0)


def split_len(k: int, cfg: Fp8GemvConfig) -> int:
    """Channels a split program sums: whole BLOCK_K tiles."""
    tiles_k = triton.cdiv(k, cfg.block_k)
    return triton.cdiv(tiles_k, min(cfg.split_k, tiles_k)) * cfg.block_k


_XKIND = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}
PROLOGUE_MAX_ROWS = 1  # as the skinny kernel's (skinny_gemm.PROLOGUE_MAX_M): at 2-4 rows a fused step loses there


def _word_aligned(t: torch.Tensor) -> bool:
    return t.stride(-1) == 1 and t.data_ptr() % 8 == 0 and (t.dim() == 1 or t.stride(0) % 4 == 0)


def takes_prologue(prologue: Prologue, x2: torch.Tensor) -> bool:
    """Whether fp8_gemv_linear runs the step on x2 (the step's input) in its loads: one row of unit column stride, a
    step that reads its inputs in place (Prologue.fits), no pending sum over ranks, 16-bit rows read as words."""
    if x2.dim() != 2 or x2.shape[0] > PROLOGUE_MAX_ROWS or prologue.reduce is not None or not prologue.fits(x2):
        return False
    if x2.dtype == torch.float32:
        return True
    parts = [x2] + ([] if prologue.kind is PrologueKind.SILU_MUL else [prologue.norm_weight])
    return all(_word_aligned(t) for t in parts + ([prologue.residual] if prologue.residual is not None else []))


def step_name(prologue: str | None, rotary: bool) -> str:
    """The tuned table's name of a one-row launch's fused steps (quant_tuned.STEPS): the prologue kind's name in lower
    case, "+rotary" with the epilogue ("" for the plain GEMM)."""
    return "+".join(([prologue] if prologue else []) + (["rotary"] if rotary else []))


def epilogue_tiles(k: int, block: tuple[int, int] | None, head_dim: int, cfg: Fp8GemvConfig) -> bool:
    """Whether a launch at cfg can apply the epilogue: unsplit, its column blocks tiling a head
    (fused_steps.epilogue_columns), each head in one block row of block weights."""
    return (split_len(k, cfg) >= k and 2 <= cfg.block_n <= head_dim and head_dim % cfg.block_n == 0
            and (block is None or block[0] % head_dim == 0))


def takes_epilogue(x2: torch.Tensor, weight: torch.Tensor, block: tuple[int, int] | None, epilogue: RotaryStore,
                   cfg: Fp8GemvConfig) -> bool:
    """Whether fp8_gemv_linear applies the epilogue to x2 @ weight.T (x2: the GEMM's input rows)."""
    return (x2.shape[0] <= EPILOGUE_MAX_ROWS and epilogue.fits(x2, weight)
            and epilogue_tiles(x2.shape[1], block, epilogue.head_dim, cfg))


def _words(t: torch.Tensor, xkind: int) -> torch.Tensor:
    return t if xkind == 2 else t.view(torch.int64)


def fp8_gemv_linear(x2: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] | None,
                    bias: torch.Tensor | None, cfg: Fp8GemvConfig, prologue: Prologue | None = None,
                    epilogue: RotaryStore | None = None) -> torch.Tensor:
    """x2 (M, K) bfloat16/float16 (float32: the interpreter) with unit column stride, M <= MAX_ROWS -> (M, N) in x2's
    dtype; weight (N, K) float8_e4m3fn, contiguous rows; scale one value, (N,), or block scales
    (ceil(N / bn), ceil(K / bk)). prologue (takes_prologue): x2 is the step's input ((M, 2K) for SiLU-and-mul); an
    ADD_RMSNORM step's residual_out is set. epilogue (takes_epilogue): applied and marked so."""
    if prologue is not None and not takes_prologue(prologue, x2):
        raise ValueError(f"the FP8 few-row kernel fuses a {prologue.kind.name} step on {PROLOGUE_MAX_ROWS} row of "
                         f"word-aligned inputs, got {tuple(x2.shape)} {x2.dtype}")
    m, k = x2.shape[0], (prologue.in_features(x2) if prologue is not None else x2.shape[1])
    n = weight.shape[0]
    if (not takes(m, n, k, block, cfg) or weight.shape[1] != k or weight.stride(1) != 1 or weight.stride(0) % 4
            or x2.stride(1) != 1 or x2.dtype not in _XKIND):
        raise ValueError(f"the FP8 few-row kernel takes 1..{MAX_ROWS} rows of float32/bfloat16/float16, K a multiple "
                         f"of 4, unit column strides (block weights: BLOCK_N dividing the block's N size), got "
                         f"{m} rows {x2.dtype}, K {k}, blocks {block}, config {cfg}")
    if epilogue is not None and (m > EPILOGUE_MAX_ROWS or not epilogue_tiles(k, block, epilogue.head_dim, cfg)):
        raise ValueError(f"the FP8 few-row kernel applies the rotary epilogue on one row, unsplit, BLOCK_N tiling "
                         f"a head, got {m} rows, config {cfg}, head dim {epilogue.head_dim}, blocks {block}")
    xkind = _XKIND[x2.dtype]
    if xkind != 2 and (x2.stride(0) % 4 or x2.data_ptr() % 8):
        x2 = x2.contiguous() if x2.data_ptr() % 8 == 0 and k % 4 == 0 else x2.clone()
    xw = _words(x2, xkind)
    blockwise = block is not None
    if blockwise:
        ws, s_n, s_k = scale, scale.stride(0), scale.stride(1)
    else:
        ws = scale.reshape(-1)
        s_n, s_k = (1 if ws.numel() > 1 else 0), 0
    per = split_len(k, cfg)
    splits = triton.cdiv(k, per)
    y = torch.empty(m, n, dtype=x2.dtype, device=x2.device)
    out = y if splits == 1 else torch.empty(splits, m, n, dtype=torch.float32, device=x2.device)
    nw = r = r_out = xw
    eps = 0.0
    if prologue is not None and prologue.kind is not PrologueKind.SILU_MUL:
        nw, eps = _words(prologue.norm_weight, xkind), prologue.eps
        if prologue.residual is not None:
            r = _words(prologue.residual, xkind)
            prologue.residual_out = torch.empty(m, k, dtype=x2.dtype, device=x2.device)
            r_out = _words(prologue.residual_out, xkind)
    epi_ptrs, epi_ints, head_dim = epilogue_args(epilogue, y)
    _fp8_gemv_kernel[(triton.cdiv(n, cfg.block_n), splits)](
        xw, weight.view(torch.int32), ws, bias if bias is not None else y, out, nw, r, r_out, *epi_ptrs, m, n, k,
        xw.stride(0), weight.stride(0) // 4, s_n, s_k, out.stride(-2), out.stride(0) if splits > 1 else 0,
        per // cfg.block_k, eps, *epi_ints, ROWS=tiles.ROW_BUCKETS[tiles.bucket_of(m)], BLOCKWISE=blockwise,
        GROUP_N=block[0] if blockwise else 1, GROUP_K=block[1] if blockwise else 1, HAS_BIAS=bias is not None,
        SPLIT=splits > 1, EVEN_K=k % cfg.block_k == 0, EVEN_N=n % cfg.block_n == 0, XKIND=xkind,
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, CVT=cvt_asm(x2), PRO=int(prologue.kind) if prologue else 0,
        EPI=epilogue is not None, HEAD_DIM=head_dim, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **pdl_options(x2.device, m))
    if splits > 1:
        splitk.reduce_splits(out, bias, y)
    if epilogue is not None:
        epilogue.applied = True
    return y
