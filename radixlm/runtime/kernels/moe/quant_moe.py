"""The experts' computation (fused_moe.fused_experts) on quantized expert weights, on CUDA: the same expert-sorted row
blocks (fused_moe.align_pairs_triton) and two grouped GEMM launches around SiLU-and-mul, with the weights dequantized
inside the K loop, so that a pass reads each touched expert's quantized bytes once and never writes a float copy.

One kernel, its weight format and activation handling constexpr switches:
  - 8-bit weights (E, N, K) with per-expert scales (kernels/quant/reference.py's FP8 layout per expert: one value,
    per output channel, or bn x bk blocks; INT8 per channel the same way), two activation modes (ActQuant):
      NONE   weight-only: the 8-bit tile converted to the activations' dtype in registers (exact: e4m3 and int8
             values are bfloat16 values), bfloat16 / float16 tensor-core dots, the scales applied to the float32
             products (per column after the loop; blocks: per K tile, BLOCK_K dividing bk);
      TOKEN / GROUP  w8a8 (FP8 only): the activations quantized per row (or with the static input scale) or per row
             group of bk channels (block weights) by kernels.quant.fp8_act, FP8 x FP8 tensor-core dots.
    Measured on the H200, w8a8 was the faster from a fraction of a row an expert up (8 tokens of a 128-expert top-8
    layer), weight-only only at a single token: W8A8_MIN_PAIRS_PER_EXPERT picks.
  - INT4 (kernels/quant/reference.py's layout per expert: qweight (E, K // 8, N) packed along K, scales / zeros
    (E, K // g, N), optional act-order perm (E, K) gathering the activation's channels in the loads): each K tile in
    one group. Large tiles dequantize each weight as reference.dequant_int4 does ((q - z) * s in float32, rounded to
    the activations' dtype) before the dot; configs up to INT4_FOLD_MAX_BLOCK_M rows (none by default: slower on the
    H200) would multiply the codes themselves and apply zero point and scale per tile and column (the weight then not
    rounded to the activations' dtype: float32 and bfloat16 roundings apart from the reference).
The experts' types (views of a MoE method's loaded tensors) and the choices that follow from them alone live in
quant_experts.py. Few-row launches whose grid cannot fill the GPU split K (tiles.split_k; float32 partials summed by
kernels.quant.splitk). Nothing syncs with the host and sizes follow the token count: CUDA graphs capture it."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from radixlm.runtime.kernels.moe.fused_moe import (
    CONFIG_BOUNDS, TRITON_CHUNK_TOKENS, ExpertBlocks, GemmConfig, align_pairs_triton, pick_config)
from radixlm.runtime.kernels.moe.quant_experts import (  # noqa: F401 - the experts' types, exported here too
    W8A8_MIN_PAIRS_PER_EXPERT, ActQuant, Int4Experts, QuantExperts, ScaledExperts, act_quant, grouped_supported,
    uses_w8a8)
from radixlm.runtime.kernels.quant import fp8_act, splitk, tiles
from radixlm.runtime.kernels.quant.int4_gemm import int4_block_k

W8A8_BLOCK_K = 128  # FP8 dots: the bytes of a 64-deep bfloat16 tile
SPLIT_MAX_BLOCK_M = 16  # split K only in the decode config (a grid of few programs)
# The split's aim: about this many programs an SM, each at least this many K tiles long. A lead, not a measurement:
# at one token Qwen3-30B-A3B's gate_up has 8 x 24 output tiles, two splits of 8 K tiles reach 384 programs, and
# benchmarks/kernels/quant_moe.py times the default beside *_nosplit.
SPLIT_PROGRAMS_PER_SM = 4
SPLIT_MIN_K_TILES = 2
# INT4 at few rows a block: the codes enter the dot as 16-bit floats v + q and the zero point and scale are applied
# per K tile and output column (BLOCK_M x BLOCK_N operations a tile instead of BLOCK_K x BLOCK_N): the dequantization,
# not the bytes, bounds a W4A16 tile loop at decode (int4_gemv.py counts ~9 instructions a weight). Up to this
# BLOCK_M (none: on the H200 the fold lost at every token count, 67.6 us against 49.1 at 1 token, 294 against 161
# at 8, benchmarks/results/kernels/h200/quant_moe_h200.json; kept for the benchmark's w4a16_fold).
INT4_FOLD_MAX_BLOCK_M = 0
# The 16-bit float whose unit in the last place is 1, as (bits, value): its bits | q are the float value + q, exactly.
FOLD_BASE = {torch.bfloat16: (0x4300, 128.0), torch.float16: (0x6400, 1024.0)}


@triton.jit(do_not_specialize=["num_pairs", "k_tiles_per_split", "stride_cs"])
def _quant_grouped_kernel(A, AS, B, BS, BZ, Perm, C, SortedPairs, BlockExpert, PairWeights, N, K, num_pairs,
                          group_size, k_tiles_per_split, stride_am, stride_asm, stride_be, stride_bn, stride_bk,
                          stride_se, stride_sn, stride_sk, stride_pe, stride_cm, stride_cs,
                          INT4: tl.constexpr, INT4_FOLD: tl.constexpr, FOLD_BITS: tl.constexpr,
                          FOLD_VALUE: tl.constexpr, BLOCK_SCALES: tl.constexpr, ACT: tl.constexpr,
                          SCALE_N: tl.constexpr, SCALE_K: tl.constexpr, HAS_PERM: tl.constexpr, A_ROW_DIV: tl.constexpr,
                          MUL_WEIGHT: tl.constexpr, IEEE_FP32: tl.constexpr, SPLIT: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """C[pair, n] = (w[pair] *) sum_k A[pair // A_ROW_DIV, k] * W_expert[n, k] over one row block's pairs, W
    dequantized per tile. 8-bit: B (E, N, K), BS the scales (block: SCALE_N x SCALE_K, indexed by stride_sn /
    stride_sk; else per column, stride_sn 0 for one value). INT4: B the packed (E, K / 8, N) words (stride_bk a word
    row), BS / BZ scales and zeros (E, K / group_size, N); INT4_FOLD: the codes multiplied as the 16-bit floats
    FOLD_VALUE + q (bits FOLD_BITS | q), zero point and scale applied per tile and column. ACT: 0 A in float, 1 A FP8
    with AS per row (stride_asm 0: one static value), 2 A FP8 with AS (rows, K / SCALE_K). SPLIT: program_id(2) sums
    k_tiles_per_split tiles into float32 partials at C + pid_k * stride_cs."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    expert = tl.load(BlockExpert + pid_m)
    if expert < 0:
        return
    e64 = expert.to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pairs = tl.load(SortedPairs + offs_m)
    row_ok = pairs < num_pairs
    a_rows = tl.where(row_ok, pairs // A_ROW_DIV, 0).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    k_tiles = tl.cdiv(K, BLOCK_K)
    t0 = pid_k * k_tiles_per_split
    t1 = tl.minimum(t0 + k_tiles_per_split, k_tiles)
    b_base = B + e64 * stride_be
    s_base = BS + e64 * stride_se
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for t in range(t0, t1):
        k = t * BLOCK_K + offs_k
        k_ok = k < K
        if HAS_PERM:
            ka = tl.load(Perm + e64 * stride_pe + k, mask=k_ok, other=0)
        else:
            ka = k
        a = tl.load(A + a_rows[:, None] * stride_am + ka[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        if INT4:
            kp = t * (BLOCK_K // 8) + tl.arange(0, BLOCK_K // 8)
            packed = tl.load(b_base + kp[:, None] * stride_bk + offs_n[None, :],
                             mask=(kp < K // 8)[:, None] & n_ok[None, :], other=0)
            shifts = tl.arange(0, 8) * 4
            q = tl.reshape((packed[:, None, :] >> shifts[None, :, None]) & 0xF, [BLOCK_K, BLOCK_N])
            g = (t * BLOCK_K) // group_size
            s = tl.load(s_base + g * stride_sk + offs_n, mask=n_ok, other=0.0).to(tl.float32)
            z = tl.load(BZ + e64 * stride_se + g * stride_sk + offs_n, mask=n_ok, other=0.0).to(tl.float32)
            if INT4_FOLD:
                # The codes as the 16-bit floats v + q (bits FOLD_BITS | q, exact), multiplied as they are; the
                # tile lies in one group, so sum_k x (q - z) s = s (sum_k x (v + q) - (v + z) sum_k x).
                b = (q | FOLD_BITS).to(tl.int16).to(A.dtype.element_ty, bitcast=True)
                x_sum = tl.sum(a.to(tl.float32), axis=1)
                acc += (tl.dot(a, b) - x_sum[:, None] * (z[None, :] + FOLD_VALUE)) * s[None, :]
            else:
                # float(q) as the bits 0x4B000000 | q (2^23 + q) minus 2^23: no int-to-float conversion (int4_gemm).
                q_f = (q | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
                b = ((q_f - z[None, :]) * s[None, :]).to(A.dtype.element_ty)
                if IEEE_FP32:
                    acc += tl.dot(a, b, input_precision="ieee")
                else:
                    acc = tl.dot(a, b, acc)
        else:
            b = tl.load(b_base + offs_n[None, :] * stride_bn + k[:, None] * stride_bk,
                        mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            if ACT == 0:
                b = b.to(A.dtype.element_ty)
            if BLOCK_SCALES:
                if IEEE_FP32:
                    part = tl.dot(a, b, input_precision="ieee")
                else:
                    part = tl.dot(a, b)
                kb = (t * BLOCK_K) // SCALE_K
                s = tl.load(s_base + (offs_n // SCALE_N) * stride_sn + kb * stride_sk, mask=n_ok, other=0.0)
                if ACT == 2:
                    a_s = tl.load(AS + a_rows * stride_asm + kb, mask=row_ok, other=0.0)
                    acc += part * a_s[:, None] * s[None, :]
                else:
                    acc += part * s[None, :]
            elif IEEE_FP32:
                acc += tl.dot(a, b, input_precision="ieee")
            else:
                acc = tl.dot(a, b, acc)
    if not INT4 and not BLOCK_SCALES:
        s = tl.load(s_base + offs_n * stride_sn, mask=n_ok, other=0.0)
        acc = acc * s[None, :]
        if ACT == 1:
            acc = acc * tl.load(AS + a_rows * stride_asm, mask=row_ok, other=0.0)[:, None]
    if MUL_WEIGHT:
        w = tl.load(PairWeights + pairs, mask=row_ok, other=0.0)
        acc = acc * w[:, None]
    c_ptrs = C + pairs.to(tl.int64)[:, None] * stride_cm + offs_n[None, :]
    mask = row_ok[:, None] & n_ok[None, :]
    if SPLIT:
        tl.store(c_ptrs + pid_k * stride_cs, acc, mask=mask)
    else:
        tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=mask)


def _block_k(w: QuantExperts, cfg: GemmConfig, act: ActQuant) -> int:
    k = w.shape[2]
    if isinstance(w, Int4Experts):
        return min(cfg.block_k, int4_block_k(k, w.group_size))
    bk = W8A8_BLOCK_K if act is not ActQuant.NONE else cfg.block_k
    return min(bk, w.block[1]) if w.block is not None else bk


def _quantized_act(a: torch.Tensor, w: QuantExperts, act: ActQuant) -> tuple[torch.Tensor, torch.Tensor | None]:
    if act is ActQuant.NONE:
        return a, None
    if act is ActQuant.GROUP:
        return fp8_act.quant_fp8_per_group(a, w.block[1])
    return fp8_act.quant_fp8_per_token(a, w.input_scale)


def split_plan(grid: int, k_tiles: int, cfg: GemmConfig, device: torch.device, split: bool | None) -> tiles.Split:
    """K split across programs in the decode config where the grid (an upper bound of the used row blocks times the N
    tiles) cannot fill the GPU; split True: the most the K tiles allow (the warm-up's SPLIT variant), False: none."""
    sms = tiles.sm_count(device)
    if split is None:
        return tiles.split_k(grid, k_tiles, sms, cfg.block_m <= SPLIT_MAX_BLOCK_M, SPLIT_PROGRAMS_PER_SM,
                             SPLIT_MIN_K_TILES)
    return tiles.split_k(1, k_tiles, sms, split, SPLIT_PROGRAMS_PER_SM, SPLIT_MIN_K_TILES)


def launch(a: torch.Tensor, w: QuantExperts, c: torch.Tensor, blocks: ExpertBlocks, weights: torch.Tensor | None,
           a_row_div: int, cfg: GemmConfig, act: ActQuant, split: bool | None = None,
           all_rows_written: bool = True) -> None:
    """One grouped GEMM into c (pairs, N). Rows of pairs this rank does not hold are left as they are, unless K is
    split: then all_rows_written False (such rows exist) zeroes the partials so that they come out zero."""
    _, n, k = w.shape
    qa, a_scale = _quantized_act(a, w, act)
    block_k = _block_k(w, cfg, act)
    grid_m, grid_n = blocks.block_expert.numel(), triton.cdiv(n, cfg.block_n)
    plan = split_plan(grid_m * grid_n, triton.cdiv(k, block_k), cfg, a.device, split)
    splits = plan.splits
    if splits > 1:
        out = (torch.empty if all_rows_written else torch.zeros)(splits, *c.shape, dtype=torch.float32,
                                                                 device=c.device)
    else:
        out = c
    int4 = isinstance(w, Int4Experts)
    fold = int4 and a.dtype in FOLD_BASE and cfg.block_m <= INT4_FOLD_MAX_BLOCK_M
    fold_bits, fold_value = FOLD_BASE.get(a.dtype, (0, 0.0))
    if int4:
        b, bs, bz = w.qweight, w.scales, w.zeros
        stride_bn, stride_bk = 1, w.qweight.stride(1)
        stride_se, stride_sn, stride_sk = w.scales.stride(0), 1, w.scales.stride(1)
        perm, group = w.perm, w.group_size
        scale_n, scale_k = 1, 1
    else:
        b, bs, bz = w.weight, w.scale, w.scale
        stride_bn, stride_bk = w.weight.stride(1), 1
        stride_se = w.scale.stride(0)
        if w.block is not None:
            stride_sn, stride_sk = w.scale.stride(1), w.scale.stride(2)
            scale_n, scale_k = w.block
        else:
            stride_sn, stride_sk = (1 if w.scale.dim() == 2 else 0), 0
            scale_n, scale_k = 1, 1
        perm, group = None, 1
    stride_asm = 0 if a_scale is None or a_scale.dim() < 2 else a_scale.stride(0)
    _quant_grouped_kernel[(grid_m, grid_n, splits)](
        qa, a_scale if a_scale is not None else qa, b, bs, bz, perm if perm is not None else b, out,
        blocks.sorted_pairs, blocks.block_expert, weights if weights is not None else out, n, k, blocks.num_pairs,
        group, plan.k_tiles_per_split, qa.stride(0), stride_asm, b.stride(0), stride_bn, stride_bk, stride_se,
        stride_sn, stride_sk, perm.stride(0) if perm is not None else 0, c.stride(0),
        out.stride(0) if splits > 1 else 0, INT4=int4, INT4_FOLD=fold,
        FOLD_BITS=fold_bits, FOLD_VALUE=fold_value, BLOCK_SCALES=not int4 and w.block is not None, ACT=int(act),
        SCALE_N=scale_n, SCALE_K=scale_k, HAS_PERM=perm is not None, A_ROW_DIV=a_row_div,
        MUL_WEIGHT=weights is not None,
        IEEE_FP32=a.dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32,
        SPLIT=splits > 1, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=block_k, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages)
    if splits > 1:
        splitk.reduce_splits(out.view(splits, -1, n), None, c.view(-1, n))


def _check(hidden: torch.Tensor, w13: QuantExperts, w2: QuantExperts, topk_weights, topk_ids) -> None:
    w13.check("experts' w13")
    w2.check("experts' w2")
    e, two_i, h = w13.shape
    if two_i % 2 or w2.shape != (e, h, two_i // 2) or hidden.dim() != 2 or hidden.shape[1] != h:
        raise ValueError(f"shapes do not agree: hidden {tuple(hidden.shape)}, w13 (E, 2I, H) {w13.shape}, "
                         f"w2 (E, H, I) {w2.shape}")
    if topk_ids.shape != topk_weights.shape or topk_ids.shape[0] != hidden.shape[0]:
        raise ValueError(f"topk_ids {tuple(topk_ids.shape)} and topk_weights {tuple(topk_weights.shape)} must be "
                         f"({hidden.shape[0]}, top_k)")


def fused_experts_quant(hidden: torch.Tensor, w13: QuantExperts, w2: QuantExperts, topk_weights: torch.Tensor,
                        topk_ids: torch.Tensor, expert_start: int = 0, num_experts: int | None = None,
                        config: GemmConfig | None = None, w8a8: bool | None = None,
                        split: bool | None = None) -> torch.Tensor:
    """fused_moe.fused_experts on quantized experts (CUDA, or CPU tensors under TRITON_INTERPRET=1): (T, H) in
    hidden's dtype. config / w8a8 / split: the pass's choices unless given (the warm-up, tests and benchmarks)."""
    _check(hidden, w13, w2, topk_weights, topk_ids)
    if hidden.shape[0] == 0:
        return hidden.new_zeros(hidden.shape)
    chunk = TRITON_CHUNK_TOKENS
    if hidden.shape[0] > chunk:
        return torch.cat([
            fused_experts_quant(hidden[s : s + chunk], w13, w2, topk_weights[s : s + chunk],
                                topk_ids[s : s + chunk], expert_start, num_experts, config, w8a8, split)
            for s in range(0, hidden.shape[0], chunk)])
    from radixlm.runtime.kernels.elementwise import silu_and_mul

    t, k = topk_ids.shape
    n_local, two_i, h = w13.shape
    num_pairs = t * k
    hidden = hidden.contiguous()
    cfg = config or pick_config(num_pairs, n_local, hidden.dtype)
    if w8a8 is None:
        w8a8 = uses_w8a8(num_pairs, n_local)
    blocks = align_pairs_triton(topk_ids, n_local, expert_start, cfg.block_m)
    gate_up = torch.empty(num_pairs, two_i, dtype=hidden.dtype, device=hidden.device)
    launch(hidden, w13, gate_up, blocks, None, k, cfg, act_quant(w13, w8a8, hidden.dtype), split)
    inter = silu_and_mul(gate_up)
    # Pairs of other ranks' experts are never written: their rows must read as zero in the sum below.
    every_pair_here = expert_start == 0 and num_experts in (None, n_local)
    down = (torch.empty if every_pair_here else torch.zeros)(num_pairs, h, dtype=hidden.dtype, device=hidden.device)
    launch(inter, w2, down, blocks, topk_weights.reshape(-1).float().contiguous(), 1, cfg,
           act_quant(w2, w8a8, hidden.dtype), split, every_pair_here)
    return down.view(t, k, h).sum(dim=1)


@dataclass(frozen=True)
class Variant:
    """One launch pair's kernel choices: the GEMM config, w8a8 or not, the K split (None: as split_plan decides,
    which never splits outside the decode config)."""

    config: GemmConfig
    w8a8: bool
    split: bool | None


def reachable_variants(max_tokens: int, top_k: int, n_local: int, dtype: torch.dtype) -> list[Variant]:
    """Every variant a launch of 1..max_tokens tokens can take (at most TRITON_CHUNK_TOKENS a launch): the config and
    w8a8 step at CONFIG_BOUNDS / W8A8_MIN_PAIRS_PER_EXPERT pairs per expert, so the pair counts just past each bound,
    and the first, stand for all; the decode config splits K or not by the token count, so both."""
    max_pairs = min(max_tokens, TRITON_CHUNK_TOKENS) * top_k
    bounds = sorted(set(CONFIG_BOUNDS) | {W8A8_MIN_PAIRS_PER_EXPERT})
    out: list[Variant] = []
    for pairs in [top_k] + [int(b * n_local) + 1 for b in bounds]:
        pairs = min(pairs, max_pairs)
        cfg = pick_config(pairs, n_local, dtype)
        for split in ((True, False) if cfg.block_m <= SPLIT_MAX_BLOCK_M else (None,)):
            v = Variant(cfg, uses_w8a8(pairs, n_local), split)
            if v not in out:
                out.append(v)
    return out


def variant_key(w13: QuantExperts, w2: QuantExperts) -> tuple:
    """What fixes the kernels' variants of a layer's experts (layers alike in it build the same kernels)."""
    def key(w: QuantExperts) -> tuple:
        if isinstance(w, Int4Experts):
            return ("int4", w.shape, w.scales.dtype, w.group_size, w.perm is not None)
        return ("8bit", w.shape, w.weight.dtype, w.scale.dim(), w.block, w.input_scale is not None)
    return key(w13), key(w2)


def warm_up_grouped(w13: QuantExperts, w2: QuantExperts, top_k: int, expert_start: int, num_experts: int,
                    dtype: torch.dtype, device: torch.device | str, max_tokens: int = TRITON_CHUNK_TOKENS) -> int:
    """Runs one token through every reachable variant (the start-up rule: no Triton build once serving); returns
    how many ran."""
    hidden = torch.zeros(1, w13.shape[2], dtype=dtype, device=device)
    ids = (torch.arange(top_k, dtype=torch.int32, device=device) % num_experts).reshape(1, -1)
    weights = torch.ones(1, top_k, dtype=torch.float32, device=device)
    variants = reachable_variants(max_tokens, top_k, w13.shape[0], dtype)
    for v in variants:
        fused_experts_quant(hidden, w13, w2, weights, ids, expert_start, num_experts, v.config, v.w8a8, v.split)
    return len(variants)
