"""Multi-head latent attention (DeepSeek-V2/V3's MLA) over the latent KV pool, in absorbed form: the public interface
of the Triton kernels (mla_decode.py, mla_extend.py) and their host-side sizing. Imports no Triton at module level:
the attention backend sizes CUDA graphs' splits and the extend work list with it on any device.

Layout (one layer): kv[num_slots, 1, R + P], R = kv_lora_rank (512 in DeepSeek), P = qk_rope_head_dim (64): a slot
holds the compressed latent c_kv (R values) then the rotated key k_pe (P values), in the model's dtype or float8
(read as stored times kv_scale, one scale per layer). Queries come absorbed: q[T, H, R + P] holds q_nope projected
by W_UK into the latent space, then the rotated q_pe. Every head shares the one latent (MQA with 576-wide keys and
512-wide values): score(t, h, s) = q[t, h] . kv[s] * sm_scale over all R + P values, output o[t, h] = softmax . kv[s,
:R], o[T, H, R] (the caller projects it back through W_UV). The kernels load each block of latents once for a block
of BLOCK_H heads."""
from __future__ import annotations

from dataclasses import dataclass

import torch

MLA_TARGET_PROGRAMS = 132  # stage-1 programs that fill an H200 (132 SMs) once; splits multiply too few up to it
MLA_MAX_SPLITS = 32
# Positions per split at least: a split writes R floats per head (16 heads: 32 KiB at R = 512) and stage 2 reads them
# back, against 128 positions' latents (144 KiB) read once for the head block.
MLA_MIN_SPLIT_LEN = 128
MLA_STAGE2_BLOCK_S = 8  # splits the merge loads per step (a fixed tile: one stage-2 variant for every split count)
FLOAT8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def _pow2(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


@dataclass(frozen=True)
class MlaDecodeConfig:
    """Stage 1's launch: heads per program (BLOCK_H, padded rows past the model's heads are masked), positions per
    block (BLOCK_N), warps and Triton's pipeline stages; inline_cvt: a float8 pool converted by span.kv_convert_asm
    on CUDA (False: the plain cast)."""

    block_h: int = 16
    block_n: int = 32
    num_warps: int = 4
    num_stages: int = 2
    inline_cvt: bool = True

    def __post_init__(self):
        if self.block_h not in (16, 32, 64):
            raise ValueError(f"MlaDecodeConfig.block_h: 16, 32 or 64 (tl.dot needs 16 rows), got {self.block_h}")
        if not _pow2(self.block_n) or not 16 <= self.block_n <= 128:
            raise ValueError(f"MlaDecodeConfig.block_n: a power of two in 16..128, got {self.block_n}")
        if self.num_warps not in (1, 2, 4, 8):
            raise ValueError(f"MlaDecodeConfig.num_warps: 1, 2, 4 or 8, got {self.num_warps}")
        if not 1 <= self.num_stages <= 4:
            raise ValueError(f"MlaDecodeConfig.num_stages: 1..4, got {self.num_stages}")


@dataclass(frozen=True)
class MlaExtendConfig:
    """The extend kernel's launch: a program's query rows are BLOCK_M new tokens x BLOCK_H heads (the latent block
    it loads serves all of them), so block_m * block_h >= 16 (one tl.dot operand)."""

    block_h: int = 16
    block_m: int = 2
    block_n: int = 32
    num_warps: int = 8
    num_stages: int = 2
    inline_cvt: bool = False  # as MlaDecodeConfig's: float8 at 16 heads x 2 tokens spills 536 bytes inline, 24 cast

    def __post_init__(self):
        if not _pow2(self.block_h) or not 1 <= self.block_h <= 64:
            raise ValueError(f"MlaExtendConfig.block_h: a power of two in 1..64, got {self.block_h}")
        if not _pow2(self.block_m) or not 1 <= self.block_m <= 128:
            raise ValueError(f"MlaExtendConfig.block_m: a power of two in 1..128, got {self.block_m}")
        if not 16 <= self.block_m * self.block_h <= 128:
            raise ValueError(f"MlaExtendConfig: block_m x block_h rows in 16..128, got {self.block_m * self.block_h}")
        if not _pow2(self.block_n) or not 16 <= self.block_n <= 128:
            raise ValueError(f"MlaExtendConfig.block_n: a power of two in 16..128, got {self.block_n}")
        if self.num_warps not in (1, 2, 4, 8):
            raise ValueError(f"MlaExtendConfig.num_warps: 1, 2, 4 or 8, got {self.num_warps}")
        if not 1 <= self.num_stages <= 4:
            raise ValueError(f"MlaExtendConfig.num_stages: 1..4, got {self.num_stages}")


# Timed on the H200 (benchmarks/results/kernels/h200/mla_decode_h200.json; bf16 pool, R=512, P=64): the fastest
# config over batch 1/32/256 x context 1k/4k (geometric mean, each case at its split rule). V2-Lite's 16 heads: the
# config below, 1.37-1.64x the latent bytes floor at batch 256. V3's 128 heads: 32-head blocks of 64 positions (1.48x
# faster than 32 x 32); at batch 256, 64-head blocks of 32 were faster still (6.5x the bytes floor against 8.4x), but
# slower at batch 1. At 128 heads the step is bound by the MMA work (2 x 128 x 1088 flops a position), not the bytes.
# Registers (sm_90, Triton 3.9 on a CPU): 16 x 32 x 4 warps x 3 stages 190, two programs per SM; a float8 pool at 16
# heads converts inline (248; the plain cast spills), at 32 heads casts (inline spills 480 bytes).
MLA_DECODE_DEFAULT = MlaDecodeConfig(16, 32, 4, 3)
MLA_MANY_HEADS = 32  # from this many heads a rank (V3 at TP=4, Kimi-K2 64, V3 128), MLA_DECODE_DEFAULT_MANY_HEADS
MLA_DECODE_DEFAULT_MANY_HEADS = MlaDecodeConfig(32, 64, 8, 3, inline_cvt=False)
# 64 query rows (16 heads x 4 tokens) over 8 warps: on the H200 (mla_extend_h200.json) 1.6-2.0x faster than 32 rows
# (16 x 2) at both head counts for prefill and chunked extend, and 1.1x for 4-token verify passes.
MLA_EXTEND_ROWS = 64


def mla_decode_config(num_heads: int) -> MlaDecodeConfig:
    """Stage 1's launch for a rank's query heads."""
    return MLA_DECODE_DEFAULT_MANY_HEADS if num_heads >= MLA_MANY_HEADS else MLA_DECODE_DEFAULT


def mla_extend_config(num_heads: int) -> MlaExtendConfig:
    """Heads per program: all of a rank's heads up to 16; tokens per program fill MLA_EXTEND_ROWS rows."""
    block_h = min(16, 1 << max(num_heads - 1, 0).bit_length())
    return MlaExtendConfig(block_h=block_h, block_m=max(1, MLA_EXTEND_ROWS // block_h))


def mla_decode_num_splits(bs: int, num_heads: int, max_seq_len: int | None = None,
                          config: MlaDecodeConfig | None = None) -> int:
    """Splits of each request's sequence: enough (head block, request, split) programs to fill the GPU once, no split
    shorter than MLA_MIN_SPLIT_LEN positions of max_seq_len (None: unbounded, a CUDA graph sized by the context
    length), at most MLA_MAX_SPLITS. A wide batch gets 1: stage 1 writes the output itself."""
    if bs < 1 or num_heads < 1:
        raise ValueError(f"mla_decode_num_splits: bs and num_heads >= 1, got {bs}, {num_heads}")
    config = config or mla_decode_config(num_heads)
    programs = bs * -(-num_heads // config.block_h)
    splits = min(MLA_MAX_SPLITS, -(-MLA_TARGET_PROGRAMS // programs))
    if max_seq_len is not None:
        splits = min(splits, -(-max(1, max_seq_len) // MLA_MIN_SPLIT_LEN))
    return max(1, splits)


def check_mla_args(q: torch.Tensor, kv: torch.Tensor, out: torch.Tensor) -> tuple[int, int]:
    """The shapes both kernels take (host checks only: no device sync); returns (R, P): R from out's width."""
    if q.dim() != 3 or kv.dim() != 3 or out.dim() != 3:
        raise ValueError(f"MLA: q (T, H, R+P), kv (slots, 1, R+P), out (T, H, R); got {tuple(q.shape)}, "
                         f"{tuple(kv.shape)}, {tuple(out.shape)}")
    width = q.shape[2]
    rank = out.shape[2]
    rope = width - rank
    if kv.shape[1] != 1 or kv.shape[2] != width:
        raise ValueError(f"MLA: kv must be (slots, 1, {width}) (one latent per slot), got {tuple(kv.shape)}")
    if out.shape != (q.shape[0], q.shape[1], rank):
        raise ValueError(f"MLA: out must be {(q.shape[0], q.shape[1], rank)}, got {tuple(out.shape)}")
    if rank < 16 or rope < 16 or rank % 16 or rope % 16:
        raise ValueError(f"MLA: kv_lora_rank and the rope width must be multiples of 16 (>= 16), got {rank}, {rope}")
    if q.dtype not in (torch.float32, torch.bfloat16, torch.float16) or out.dtype != q.dtype:
        raise ValueError(f"MLA: q and out in float32/bfloat16/float16 alike, got {q.dtype}, {out.dtype}")
    if kv.dtype != q.dtype and kv.dtype not in FLOAT8:
        raise ValueError(f"MLA: kv in q's dtype ({q.dtype}) or float8, got {kv.dtype}")
    if q.stride(2) != 1 or kv.stride(2) != 1 or out.stride(2) != 1:
        raise ValueError("MLA: q, kv and out must be contiguous in their last dimension")
    if q.device != kv.device or q.device != out.device:
        raise ValueError(f"MLA: q, kv, out on one device, got {q.device}, {kv.device}, {out.device}")
    return rank, rope


def mla_decode(q: torch.Tensor, kv: torch.Tensor, req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
               seq_lens: torch.Tensor, sm_scale: float, out: torch.Tensor, num_kv_splits: int | None = None,
               max_seq_len: int | None = None, kv_scale: float = 1.0,
               config: MlaDecodeConfig | None = None) -> torch.Tensor:
    """One query token per request (mla_decode.py). Returns out."""
    from radixlm.runtime.kernels.attention.mla_decode import mla_decode_attention

    return mla_decode_attention(q, kv, req_to_token, req_pool_indices, seq_lens, sm_scale, out, num_kv_splits,
                                max_seq_len, kv_scale, config)


def mla_extend(q: torch.Tensor, kv: torch.Tensor, req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
               prefix_lens: torch.Tensor, extend_lens: torch.Tensor, extend_start_loc: torch.Tensor,
               sm_scale: float, out: torch.Tensor, blocks: torch.Tensor | None = None, kv_scale: float = 1.0,
               config: MlaExtendConfig | None = None, custom_mask: torch.Tensor | None = None,
               mask_starts: torch.Tensor | None = None, mask_offsets: torch.Tensor | None = None) -> torch.Tensor:
    """Each request's new tokens over its prefix and, causally or as a tree draft's mask says, each other
    (mla_extend.py). Returns out."""
    from radixlm.runtime.kernels.attention.mla_extend import mla_extend_attention

    return mla_extend_attention(q, kv, req_to_token, req_pool_indices, prefix_lens, extend_lens, extend_start_loc,
                                sm_scale, out, blocks, kv_scale, config, custom_mask, mask_starts, mask_offsets)


def mla_extend_blocks(extend_lens: list[int], config: MlaExtendConfig) -> list[int]:
    """The extend kernel's work list (extend_blocks.extend_blocks at the config's block_m): [request, block, ...]."""
    from radixlm.runtime.kernels.attention.extend_blocks import extend_blocks

    return extend_blocks(extend_lens, config.block_m)


def warm_up_mla(kv: torch.Tensor, req_to_token: torch.Tensor, num_heads: int, kv_lora_rank: int, dtype: torch.dtype,
                index_dtype: torch.dtype = torch.int64, kv_scale: float = 1.0, tree_masks: bool = False) -> None:
    """Builds every MLA kernel variant a server with this pool, table and head count meets, before the first request:
    decode with one split (DIRECT) and with several (stage 1 and stage 2), and extend, at the default configs (the
    split count itself is a runtime value). A one-row table of the real table's row stride (its specialization)
    points every read at slot 0; nothing is written to the pool. dtype: the queries' (the model's); index_dtype: the
    backend's seq_lens / prefix_lens / req_pool_indices dtype; tree_masks: tree drafts are configured (extend with
    custom masks too)."""
    device = kv.device
    table = torch.zeros(1, req_to_token.stride(0), dtype=req_to_token.dtype, device=device)
    one = torch.ones(1, dtype=index_dtype, device=device)
    zero = torch.zeros(1, dtype=index_dtype, device=device)
    q = torch.zeros(1, num_heads, kv.shape[2], dtype=dtype, device=device)
    out = torch.empty(1, num_heads, kv_lora_rank, dtype=dtype, device=device)
    for splits in (1, 2):
        mla_decode(q, kv, table, zero, one, 1.0, out, num_kv_splits=splits, kv_scale=kv_scale)
    mla_extend(q, kv, table, zero, zero, one, zero, 1.0, out, kv_scale=kv_scale)
    if tree_masks:
        mla_extend(q, kv, table, zero, zero, one, zero, 1.0, out, kv_scale=kv_scale,
                   custom_mask=torch.ones(1, dtype=torch.uint8, device=device), mask_starts=zero, mask_offsets=zero)
