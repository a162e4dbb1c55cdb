"""The experts' computation: for each token and each of its top-k experts e, weight * down_e(silu(gate_e(x)) * up_e(x)),
summed over the k experts. w13 (E_local, 2 * I, H) holds each expert's gate rows then its up rows; w2 (E_local, H, I).

Expert ids are global; this rank holds experts [expert_start, expert_start + E_local). A (token, expert) pair whose
expert lives elsewhere contributes zero here (expert parallelism: another rank adds it in the all-reduce).

Two paths behind `fused_experts`, picked by device:
  - CUDA: a Triton grouped GEMM. The (token, slot) pairs are sorted by expert and each expert's run padded to a whole
    number of row blocks, so that every block of rows belongs to one expert (three small kernels: count, offsets,
    scatter); one launch computes gate|up for every block, SiLU-and-mul runs over the result, a second launch
    computes down (times the routing weight). Sizes depend on the token count alone and nothing syncs with the host,
    so a decode pass can be captured in a CUDA graph.
  - CPU (and the reference for tests): a loop over the experts that received tokens, torch matmuls for each."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

# Tokens per Triton launch pair: bounds the (pairs, 2 * I) and (pairs, H) intermediates of a long prefill.
TRITON_CHUNK_TOKENS = 8192


def _check(hidden, w13, w2, topk_weights, topk_ids) -> None:
    if w13.dim() != 3 or w2.dim() != 3 or w13.shape[0] != w2.shape[0]:
        raise ValueError(f"w13 {tuple(w13.shape)} and w2 {tuple(w2.shape)} must be (E, 2I, H) and (E, H, I)")
    e, two_i, h = w13.shape
    if two_i % 2 or tuple(w2.shape) != (e, h, two_i // 2) or hidden.shape[-1] != h:
        raise ValueError(f"shapes do not agree: hidden {tuple(hidden.shape)}, w13 {tuple(w13.shape)}, "
                         f"w2 {tuple(w2.shape)}")
    if topk_ids.shape != topk_weights.shape or topk_ids.shape[0] != hidden.shape[0]:
        raise ValueError(f"topk_ids {tuple(topk_ids.shape)} and topk_weights {tuple(topk_weights.shape)} must be "
                         f"({hidden.shape[0]}, top_k)")


def fused_experts(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor, expert_start: int = 0, num_experts: int | None = None,
                  use_triton: bool | None = None) -> torch.Tensor:
    """hidden (T, H), topk_weights / topk_ids (T, k) -> (T, H) in hidden's dtype: this rank's experts' share of the
    MoE output. num_experts: the model's expert count (None: this rank holds them all). use_triton: None picks by
    device (Triton on CUDA, torch elsewhere)."""
    _check(hidden, w13, w2, topk_weights, topk_ids)
    if use_triton is None:
        use_triton = hidden.is_cuda
    if hidden.shape[0] == 0:
        return hidden.new_zeros(hidden.shape)
    if not use_triton:
        return fused_experts_torch(hidden, w13, w2, topk_weights, topk_ids, expert_start)
    if hidden.shape[0] <= TRITON_CHUNK_TOKENS:
        return fused_experts_triton(hidden, w13, w2, topk_weights, topk_ids, expert_start, num_experts)
    return torch.cat([
        fused_experts_triton(hidden[s : s + TRITON_CHUNK_TOKENS], w13, w2, topk_weights[s : s + TRITON_CHUNK_TOKENS],
                             topk_ids[s : s + TRITON_CHUNK_TOKENS], expert_start, num_experts)
        for s in range(0, hidden.shape[0], TRITON_CHUNK_TOKENS)
    ])


# ---------------------------------------------------------------------------------------------------- torch path
def fused_experts_torch(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                        topk_ids: torch.Tensor, expert_start: int = 0) -> torch.Tensor:
    """Per expert that got tokens: gather its tokens, two matmuls, scatter-add the weighted result (float32 sum).
    Reads the per-expert counts back to the host (a sync on CUDA: not for graph capture)."""
    t, k = topk_ids.shape
    n_local = w13.shape[0]
    inter = w2.shape[2]
    flat = topk_ids.reshape(-1).long() - expert_start
    flat = torch.where((flat >= 0) & (flat < n_local), flat, n_local)  # n_local: held by another rank
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=n_local + 1).tolist()
    weights = topk_weights.reshape(-1).float()
    out = torch.zeros(t, hidden.shape[1], dtype=torch.float32, device=hidden.device)
    start = 0
    for e in range(n_local):
        c = counts[e]
        if not c:
            continue
        pairs = order[start : start + c]
        start += c
        tokens = pairs // k
        gate_up = F.linear(hidden[tokens], w13[e])
        y = F.linear(F.silu(gate_up[:, :inter]) * gate_up[:, inter:], w2[e])
        out.index_add_(0, tokens, y.float() * weights[pairs, None])
    return out.to(hidden.dtype)


# ---------------------------------------------------------------------------------------------------- Triton path
@dataclass(frozen=True)
class ExpertBlocks:
    """The (token, slot) pairs laid out by expert in blocks of block_m rows (see align_pairs)."""

    sorted_pairs: torch.Tensor  # (rows,) int32: pair index (token * k + slot), or num_pairs in padding rows
    block_expert: torch.Tensor  # (rows / block_m,) int32: the local expert of each block, -1 for unused blocks
    num_pairs: int
    block_m: int


def align_pairs(topk_ids: torch.Tensor, n_local: int, expert_start: int, block_m: int) -> ExpertBlocks:
    """Sorts the pairs by local expert and pads each expert's run to a multiple of block_m. Pairs of experts held
    elsewhere are left out. Sizes depend on the pair count only: an upper bound of rows, unused blocks marked -1."""
    device = topk_ids.device
    num_pairs = topk_ids.numel()
    flat = topk_ids.reshape(-1).long() - expert_start
    flat = torch.where((flat >= 0) & (flat < n_local), flat, n_local)
    counts = torch.zeros(n_local + 1, dtype=torch.long, device=device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts[:n_local] + block_m - 1) // block_m * block_m
    padded_end = torch.cumsum(padded, 0)
    rows = -(-(num_pairs + min(n_local, num_pairs) * (block_m - 1)) // block_m) * block_m
    # Each pair's destination: its expert's padded start plus its rank among that expert's pairs.
    order = torch.argsort(flat, stable=True)
    sorted_expert = flat[order]
    count_start = torch.cumsum(counts, 0) - counts
    rank = torch.arange(num_pairs, device=device) - count_start[sorted_expert]
    padded_start = torch.cat([padded_end - padded, padded_end.new_full((1,), rows)])
    dest = torch.where(sorted_expert < n_local, padded_start[sorted_expert] + rank, rows)
    sorted_pairs = torch.full((rows + 1,), num_pairs, dtype=torch.int32, device=device)
    sorted_pairs.scatter_(0, dest, order.to(torch.int32))
    block_start = torch.arange(0, rows, block_m, device=device)
    block_expert = torch.searchsorted(padded_end, block_start, right=True)
    block_expert = torch.where(block_expert < n_local, block_expert, -1).to(torch.int32)
    return ExpertBlocks(sorted_pairs[:rows], block_expert, num_pairs, block_m)


# Counts that follow the pass's token count are not specialized (a count of 1 would become a constant, a multiple of
# 16 a divisibility hint: new kernels in the middle of serving); they only bound loops and masks.
@triton.jit(do_not_specialize=["num_pairs"])
def _count_kernel(Ids, Counts, num_pairs, expert_start, n_local, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    in_range = offs < num_pairs
    e = tl.load(Ids + offs, mask=in_range, other=0) - expert_start
    held = in_range & (e >= 0) & (e < n_local)
    tl.atomic_add(Counts + e, 1, mask=held)


@triton.jit(do_not_specialize=["num_blocks"])
def _offsets_kernel(Counts, Cursor, BlockExpert, n_local, num_blocks, BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr,
                    BLOCK_B: tl.constexpr):
    """One program: each expert's padded start (the scatter's cursor) and each row block's expert."""
    offs_e = tl.arange(0, BLOCK_E)
    e_ok = offs_e < n_local
    c = tl.load(Counts + offs_e, mask=e_ok, other=0)
    padded = (c + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    end = tl.cumsum(padded, 0)
    tl.store(Cursor + offs_e, end - padded, mask=e_ok)
    end_block = end // BLOCK_M
    for b0 in range(0, num_blocks, BLOCK_B):
        offs_b = b0 + tl.arange(0, BLOCK_B)
        # A block's expert: how many experts end at or before it.
        before = (end_block[None, :] <= offs_b[:, None]) & e_ok[None, :]
        e_of_b = tl.sum(before.to(tl.int32), axis=1)
        tl.store(BlockExpert + offs_b, tl.where(e_of_b < n_local, e_of_b, -1), mask=offs_b < num_blocks)


@triton.jit(do_not_specialize=["num_pairs"])
def _scatter_kernel(Ids, Cursor, SortedPairs, num_pairs, expert_start, n_local, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    in_range = offs < num_pairs
    e = tl.load(Ids + offs, mask=in_range, other=0) - expert_start
    held = in_range & (e >= 0) & (e < n_local)
    pos = tl.atomic_add(Cursor + e, 1, mask=held)
    tl.store(SortedPairs + pos, offs, mask=held)


def align_pairs_triton(topk_ids: torch.Tensor, n_local: int, expert_start: int, block_m: int) -> ExpertBlocks:
    """align_pairs in three small kernels (the torch version is some forty launches, which at decode cost more than
    the experts' GEMMs). Within an expert the pairs' order depends on the atomics' (each pair's row is computed the
    same wherever it sits)."""
    device = topk_ids.device
    num_pairs = topk_ids.numel()
    ids = topk_ids.reshape(-1).to(torch.int32).contiguous()
    rows = -(-(num_pairs + min(n_local, num_pairs) * (block_m - 1)) // block_m) * block_m
    counts = torch.zeros(n_local, dtype=torch.int32, device=device)
    cursor = torch.empty(n_local, dtype=torch.int32, device=device)
    sorted_pairs = torch.full((rows,), num_pairs, dtype=torch.int32, device=device)
    block_expert = torch.empty(rows // block_m, dtype=torch.int32, device=device)
    block = 256
    grid = (triton.cdiv(num_pairs, block),)
    _count_kernel[grid](ids, counts, num_pairs, expert_start, n_local, BLOCK=block)
    _offsets_kernel[(1,)](counts, cursor, block_expert, n_local, rows // block_m, BLOCK_M=block_m,
                          BLOCK_E=max(16, triton.next_power_of_2(n_local)), BLOCK_B=64)
    _scatter_kernel[grid](ids, cursor, sorted_pairs, num_pairs, expert_start, n_local, BLOCK=block)
    return ExpertBlocks(sorted_pairs, block_expert, num_pairs, block_m)


@triton.jit(do_not_specialize=["num_pairs"])
def _grouped_gemm_kernel(A, B, C, SortedPairs, BlockExpert, PairWeights, N, K, num_pairs,
                         stride_am, stride_be, stride_bn, stride_bk, stride_cm,
                         A_ROW_DIV: tl.constexpr, MUL_WEIGHT: tl.constexpr, IEEE_FP32: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """C[pair, n] = (w[pair] *) sum_k A[pair // A_ROW_DIV, k] * B[expert, n, k] for the pairs of one row block."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(BlockExpert + pid_m)
    if expert < 0:
        return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pairs = tl.load(SortedPairs + offs_m)
    row_ok = pairs < num_pairs
    a_rows = tl.where(row_ok, pairs // A_ROW_DIV, 0).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = A + a_rows[:, None] * stride_am + offs_k[None, :]
    b_ptrs = B + expert.to(tl.int64) * stride_be + offs_n[None, :] * stride_bn + offs_k[:, None] * stride_bk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        k_ok = offs_k < K - kb * BLOCK_K
        a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if IEEE_FP32:
            acc += tl.dot(a, b, input_precision="ieee")
        else:
            acc += tl.dot(a, b)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K * stride_bk
    if MUL_WEIGHT:
        w = tl.load(PairWeights + pairs, mask=row_ok, other=0.0)
        acc = acc * w[:, None]
    c_ptrs = C + pairs.to(tl.int64)[:, None] * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=row_ok[:, None] & n_ok[None, :])


CONFIG_BOUNDS = (16, 48, 128)  # pick_config's steps, in (token, expert) pairs per local expert


@dataclass(frozen=True)
class GemmConfig:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


def pick_config(num_pairs: int, n_local: int, dtype: torch.dtype) -> GemmConfig:
    """By the mean rows per expert. Few (decode): 16-row blocks, long K tiles (the weights' bytes dominate); many:
    large tiles for tensor-core reuse. From a sweep of Qwen3-30B-A3B's layer (128 experts, top-8, 2048 x 768, bf16)
    on an H100 (benchmarks/offline/gpu_moe.py --tune)."""
    per_expert = num_pairs / max(n_local, 1)
    fp32 = dtype == torch.float32
    if per_expert <= CONFIG_BOUNDS[0]:
        return GemmConfig(16, 64, 128, 4, 2 if fp32 else 4)
    if per_expert <= CONFIG_BOUNDS[1]:
        return GemmConfig(32, 64, 128, 4, 2 if fp32 else 4)
    if per_expert <= CONFIG_BOUNDS[2] or fp32:
        return GemmConfig(64, 128, 64, 4, 2 if fp32 else 3)
    return GemmConfig(128, 256, 64, 8, 3)


def reachable_configs(max_tokens: int, top_k: int, n_local: int, dtype: torch.dtype) -> list[GemmConfig]:
    """Every config pick_config gives a launch of 1..max_tokens tokens (at most TRITON_CHUNK_TOKENS a launch): the
    kernels start-up builds. pick_config steps up at CONFIG_BOUNDS rows per expert, so the pair counts just past
    each bound, and the first, stand for all."""
    max_pairs = min(max_tokens, TRITON_CHUNK_TOKENS) * top_k
    counts = [top_k] + [int(b * n_local) + 1 for b in CONFIG_BOUNDS]
    out: list[GemmConfig] = []
    for pairs in counts:
        cfg = pick_config(min(pairs, max_pairs), n_local, dtype)
        if cfg not in out:
            out.append(cfg)
    return out


def _launch(a, b, c, blocks: ExpertBlocks, weights, a_row_div: int, cfg: GemmConfig) -> None:
    n, k = b.shape[1], b.shape[2]
    grid = (blocks.block_expert.numel(), triton.cdiv(n, cfg.block_n))
    _grouped_gemm_kernel[grid](
        a, b, c, blocks.sorted_pairs, blocks.block_expert, weights if weights is not None else c, n, k,
        blocks.num_pairs, a.stride(0), b.stride(0), b.stride(1), b.stride(2), c.stride(0),
        A_ROW_DIV=a_row_div, MUL_WEIGHT=weights is not None,
        IEEE_FP32=a.dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages)


def _silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    from radixlm.runtime.kernels.elementwise import silu_and_mul

    return silu_and_mul(x)


def fused_experts_triton(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                         topk_ids: torch.Tensor, expert_start: int = 0, num_experts: int | None = None,
                         config: GemmConfig | None = None) -> torch.Tensor:
    t, k = topk_ids.shape
    n_local, two_i, h = w13.shape
    num_pairs = t * k
    hidden = hidden.contiguous()
    cfg = config or pick_config(num_pairs, n_local, hidden.dtype)
    blocks = align_pairs_triton(topk_ids, n_local, expert_start, cfg.block_m)
    gate_up = torch.empty(num_pairs, two_i, dtype=hidden.dtype, device=hidden.device)
    _launch(hidden, w13, gate_up, blocks, None, k, cfg)
    act = _silu_and_mul(gate_up)
    # Pairs of other ranks' experts are never written: their rows must read as zero in the sum below.
    every_pair_here = expert_start == 0 and num_experts in (None, n_local)
    down = (torch.empty if every_pair_here else torch.zeros)(num_pairs, h, dtype=hidden.dtype, device=hidden.device)
    _launch(act, w2, down, blocks, topk_weights.reshape(-1).float().contiguous(), 1, cfg)
    return down.view(t, k, h).sum(dim=1)

