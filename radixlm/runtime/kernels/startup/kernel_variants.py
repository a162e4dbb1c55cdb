"""The Triton kernel variants serving can meet, so that start-up builds every one of them (issue 20). Imports no
Triton: the model runner plans its warm-up with it on any device, and CPU tests check the plan.

How Triton decides to compile (Triton 3.4 to 3.9: the rule is `native_specialize_impl`, python/src/specialize.cc,
called by the binder that `JITFunction.run` builds; 3.6 runs on the GPU machine, 3.9 on the CPU venv). A kernel's
in-memory cache key (and, hashed, its on-disk cache key) is the launch's specialization of every argument plus its
options (num_warps, num_stages, enable_fp_fusion, ...). Per argument:
  - `tl.constexpr`: its value;
  - int: its type, i32 / i64 / u64 by range; unless the kernel lists it in `do_not_specialize`, the value 1 becomes
    the constant 1, and a multiple of 16 gets a divisibility hint (not with `do_not_specialize_on_alignment`);
  - tensor: its dtype (a pointer type), and unless listed in either option, whether data_ptr() % 16 == 0;
  - float and bool: the type alone.
So a value that changes between passes builds a new kernel when it is a constexpr, an int that can be 1 or
both a multiple of 16 and not, or a tensor whose alignment changes (views at any offset). Each build costs
0.1-0.6 s on an H100 with an empty cache (issue 20 measured 0.83x SGLang's throughput on a cold machine).

PDL (kernels/pdl.py: the PDL constexpr and Triton's launch_pdl option, which is part of the key too) of the decode
stages, rmsnorm, silu_and_mul, the few-row GEMVs (skinny, FP8, W4A16) and splitk's reduction: on sm_90 and later True
at one row (pdl.PDL_MAX_ROWS), else False -> one-row passes build their own variant of each: the warm-up's one-row
eager passes (TOKEN_ROW_WARMUP), batch-1 capture, and quantized layers' first row bucket (1 row) build them.
  So the decode stages' split passes (WarmupPlan.split_passes) run twice where eager passes can be both: at one
  row (PDL), and at the fewest rows of an unchunked eager pass of 2+ rows (decode_split_passes).

Inventory (every @triton.jit kernel; "fixed": one value per model, dtype and rank, met by the first pass):

  decode.py  _decode_stage1, _decode_stage2 (split-K decode over the paged pool)
      num_splits: 1..16, from the batch size and the longest sequence (eager passes) or the captured batch size
        (graphs) -> a runtime int in do_not_specialize, with the log-sum-exp strides it sets (stride_mlb, stride_mlh);
        the partial outputs' strides (splits x head_dim) stay specialized: a multiple of 16 for every head dim
        served, whatever the split count.
      BLOCK_S = next_power_of_2(num_splits) (stage 2's tile): 1, 2, 4, 8, 16 -> built at start-up for every split
        count eager passes can meet (decode_eager_splits) and, for graphs, by capture.
      DIRECT (one split, no shared prefixes: stage 1 writes the output, no stage 2) follows the split count: the
        same passes build it.
      BLOCK_N, PREFETCH, KV_CVT, num_warps, num_stages (stage 1's launch, decode_splits.decode_kernel_config):
        one config per (pool dtype, wide pass: decode_wide_rows rows or more, no shared prefixes; one split) ->
        the pool's dtype is fixed per server, and one eager pass of decode_wide_rows rows at start-up builds the
        wide one where eager passes can be that wide (token_row_batches). KV_CVT (a float8 pool's inline
        conversion, span.kv_convert_asm) follows the pool's and the model's dtypes; Q_F16, SWAPPED and Q_FP8
        follow the config (its widen and swapped fields) and those dtypes.
      Req_pool_indices, Seq_lens: views at any offset -> do_not_specialize_on_alignment.
      GROUP, HEAD_DIM, BLOCK_D, BLOCK_H, PRECISION (dtype), strides of q and the pools: fixed. The pools' dtype (the
        model's or float8, --kv-cache-dtype) is fixed per server; their scales (k_scale folded into sm_scale, v_scale)
        are floats: every kernel that reads or writes the pool takes them unspecialized.
      Row_starts / HAS_ROW_STARTS: None / False, except in eager passes with shared prefixes (below).
      CHUNKED (2..DECODE_CHUNK_MAX_ROWS rows where decode_chunk_capacity is not 0, no shared prefixes; stage 2's
        BLOCK_S and BLOCK_B fixed; Work a fresh int32 table): one more variant of each stage, built by the warm-up's
        eager passes of 2-4 rows (token_row_batches) and by capture; the work list's capacity enters as num_splits.
  decode_work.py  _decode_work (a chunked pass's work list, once a pass): num_rows, capacity: do_not_specialize;
      Seq_lens, Req_pool_indices: no alignment; BLOCK_B, BLOCK_E, BLOCK_N: fixed -> one variant, built with the
      chunked passes. It runs inline in start-up's discovery run (kernel_builds.py: its table indexes memory).
  shared_prefix.py  _shared_prefix_stage1 (shared-prefix decode, eager decode passes with groups)
      num_tiles, num_splits (its prefix splits, 1..16), slot0 (the decode split count) and the log-sum-exp strides:
        do_not_specialize. Req_pool_indices, Tile_rows, Tiles (views of one copy): no alignment. GROUP, HEAD_DIM,
        BLOCK_D, BLOCK_M, BLOCK_N, PRECISION, strides: fixed. With it, decode stage 1 takes Row_starts
        (HAS_ROW_STARTS True: one more variant) and stage 2 merges splits + prefix splits slots: BLOCK_S up to 32.
        Start-up runs the kernels directly (TritonAttnBackend.warm_up_shared_prefix) at one (decode splits, prefix
        splits) pair per stage-2 tile that such passes can meet (shared_prefix_warmup).
  fixed_split_kernel.py  _fixed_split_attention_kernel (--enable-deterministic-inference, every pass): Row_req,
      Positions, Tile_start, Tile_rows: no alignment; GROUP, GROUP_P2, ROWS, HEAD_DIM, BLOCK_D, BLOCK_N
      (FIXED_SPLIT_SIZE), strides: fixed; SUB and num_stages: one pair for one-sub-tile launches and one for
      prefill launches (attention/fixed_split_config.py: the GPU's table or the default) -> two variants, built by
      the first passes. gemm/batch_invariant_mm.py's _batch_invariant_mm_kernel: M not specialized,
      A aligned (an unaligned input is copied); the tile config by the weight's shape (its tuned table or default),
      HAS_BIAS, EVEN_K: fixed per layer -> one variant per weight shape kind.
  extend.py  _extend_kernel (ragged extend over a cached prefix)
      BLOCK_M: 16 when the longest extend of the pass is <= 16 tokens, else 64 -> both built at start-up
        (EXTEND_WARMUP_LENS). Prefix, extend and start vectors and the work list (always int64, extend_blocks.py):
        no alignment. GROUP, HEAD_DIM, BLOCK_D, BLOCK_N,
        PRECISION and every stride: fixed. Token, prefix and batch counts enter through the grid and device vectors.
      USE_CUSTOM_MASK: True only in tree drafts' passes (ForwardBatch.tree_masks: EAGLE with
        --speculative-eagle-topk > 1, on a backend that supports_tree_mask): the target's verification passes and
        the EAGLE head's tree steps. Without masks the three mask arguments are None (constexpr None): passes without
        tree drafts build the same two variants as before. With tree drafts configured, start-up also builds both
        tiles with masks (WarmupPlan.tree_masks: the target's warm_up_extend; the head's in EagleRunner._warm_up).
        The mask (uint8, any length) and its start/offset vectors: no alignment.
  mla_decode.py  _mla_decode_stage1, _mla_decode_stage2 (MLA's split-K decode over the latent pool)
      num_splits and the log-sum-exps' strides: do_not_specialize (a graph's split count or an eager pass's);
        stage 2's tile (MLA_STAGE2_BLOCK_S) is fixed, so one stage-2 variant serves every split count.
      DIRECT (one split: stage 1 writes the output, no stage 2): two stage-1 variants.
      NUM_HEADS, R, P, BLOCK_R, BLOCK_P, PRECISION, KV_CVT, the config (mla_decode_config: one per head count) and
        the strides of q, the pool and the table: fixed. Req_pool_indices, Seq_lens: no alignment.
  mla_extend.py  _mla_extend_kernel: one variant (mla_extend_config per head count; BLOCK_M does not follow the
      extend lengths), two with tree drafts (USE_CUSTOM_MASK, as extend.py's); its index vectors, work list and
      mask vectors: no alignment.
      mla.warm_up_mla builds them all (decode at 1 and 2 splits, extend, with tree_masks the masked extend) on the
      real pool and a table of the real row stride.
  fused_kernels.py  _rmsnorm_kernel, _silu_and_mul_kernel, _rotary_kernel, _store_kv_kernel
      rmsnorm: HAS_RESIDUAL (both in every pass), BLOCK, n_cols, strides: fixed per call site (hidden size, the
        q/k norms' head dim). silu_and_mul: d, strides fixed. rotary: Pos and Loc views -> no alignment; heads,
        strides fixed (q, k, v are views of the qkv rows at fixed offsets); STORE (the KV store in the same launch,
        TokenToKVPool.set_rotated_kv_buffer) True in every pass of a model. store_kv: Loc (slices of the
        allocator's free list) -> no alignment; width, strides fixed. Row counts enter through the grid only.
  quant/fp8_prologue.py  _norm_quant_kernel, _silu_quant_kernel (the norm or SiLU-and-mul before a per-token FP8
      GEMM, quantizing its rows): as rmsnorm's and silu_and_mul's (HAS_RESIDUAL, BLOCK from the width); row counts
      enter through the grid only -> built by every pass with an FP8 GEMM past its few-row kernels.
  skinny_gemm.py  _skinny_kernel (autotuned; key N, K, M, PRO)
      M (rows, constexpr) 1..4: graphs pad decode batches to 1, 2, 4 rows; 3 rows (eager passes: a prefill
        sampling three requests) run the 4-row kernel on a padded copy. PRO (the fused prologue: none, RMSNorm,
        RMSNorm of x + residual, SiLU-and-mul; fused at PROLOGUE_MAX_M rows only) and HAS_BIAS: fixed per layer;
        EPI with HEAD_DIM (the qkv GEMM's rotary embedding and KV store, kernels/gemm/epilogue.py; one row, one config,
        not autotuned): fixed per layer, its Pos and Loc (views of a pass's rows) not specialized on alignment, its
        widths and strides fixed; prebuild builds every combination that gemm.linear launches.
        gemm.linear times its kernels once per layer kind and row count: start-up runs eager passes of
        1..SKINNY_MAX_M rows (TOKEN_ROW_WARMUP) so that no timing (nor autotuning) happens while serving. N, K,
        strides: fixed per layer.
  skinny_mma.py  _skinny_mma_kernel (the tensor-core kernel of MMA_MIN_M..MMA_MAX_M rows; one config)
      M: do_not_specialize; BLOCK_M (MMA_ROWS: 16, 32, the padded row count) the only shape rows reach. HAS_BIAS
        fixed per layer, EVEN_K (K a multiple of BLOCK_K) per shape: prebuild builds both BLOCK_Ms x bias flags x
        EVEN_K. gemm.linear times it with the skinny kernel and cuBLAS once per layer kind and choice key (the row
        count up to SKINNY_MAX_M, then BLOCK_M): start-up runs an eager pass per BLOCK_M too (mma_warmup_rows, at most
        max_rows rows). N, K, strides: fixed per layer.
  argmax.py  _block_max_kernel, _pick_block_kernel (the sampler's greedy choice)
      vocab width, row stride, block count: do_not_specialize (logits after penalties and verify rows' views
        differ); logits: no alignment. Built by the eager warm-up passes (warmup.warm_up_passes).
  moe/fused_moe.py  _count_kernel, _offsets_kernel, _scatter_kernel, _grouped_gemm_kernel
      num_pairs (tokens x top_k), num_blocks -> do_not_specialize (they bound masks and loops only).
      The GEMM config (BLOCK_M/N/K, num_warps, num_stages; BLOCK_M also in _offsets_kernel) follows the rows per
        expert: up to 4 configs (3 in float32) -> start-up runs every one a pass can reach (reachable_configs).
      A_ROW_DIV, MUL_WEIGHT (the two launches), IEEE_FP32 (dtype), N, K, expert_start, n_local, strides: fixed.

  moe/quant_moe.py  _quant_grouped_kernel (quantized experts: FP8, INT8, INT4), with fused_moe's three sorting kernels,
      fp8_act's quantization (w8a8) and splitk's reduction
      num_pairs, k_tiles_per_split, the split partials' stride: do_not_specialize. The GEMM config follows the rows
        per expert as fused_moe's; with it w8a8 or weight-only (FP8 experts, W8A8_MIN_PAIRS_PER_EXPERT) and, in the
        decode config, SPLIT (K split where the grid is small: both reachable) -> start-up runs every variant a pass
        can reach (quant_moe.reachable_variants, warm_up_grouped: one token each, config, w8a8 and split forced).
      Format, scale granularity, block and group size, act-order perm, static input scale, N, K, strides: fixed per
        layer (the experts' tensors as loaded).

  quant/ (fp8_act.py, fp8_gemm.py, int4_gemm.py, splitk.py)  _quant_rows_kernel, _quant_groups_kernel,
      _w8a8_kernel, _w4a16_kernel, _reduce_splits_kernel (quantized linear layers)
      The tile config and the K split follow the row bucket (quant/tiles.ROW_BUCKETS: <= 16, <= 64, <= 256, more);
        M and the split partials' stride: do_not_specialize; the activation: no alignment. Weight shape, group or
        block size, bias, permutation, dtype: fixed per layer -> warmup.warm_up_quantized runs each quantized layer
        at each bucket's first row count (quant.warm_up_linear), which prefill passes can reach beyond the passes
        above.
  quant/fp8_gemv.py  _fp8_gemv_kernel (FP8 at 1..4 rows where the tuned table names a config)
      ROWS (the row bucket), the config and the K split follow the tuned entry; PRO and EPI (the qkv GEMM's norm and
        rotary epilogue, fused at one row where the table has an entry for those steps: quant_tuned.STEPS) are fixed
        per layer and pass kind -> built by the one-row warm-up and capture passes, which run the model's layers as
        serving does; M, the partials' stride: do_not_specialize; x, Pos, Loc: no alignment.
  quant/fp8_mma.py, int4_mma.py  _fp8_mma_kernel, _w4a16_mma_kernel (5..256 rows where the tuned table names a config)
      The config follows the row bucket (8, 16, 64, 256) and the table; the K split follows N's tiles only (not the
        rows); M and the partials' stride: do_not_specialize; x copied where its rows are not 16-element aligned ->
        built by warm_up_quantized's call per bucket, as above.
  quant/int4_dequant.py  _dequant_int4_kernel (W4A16 from a weight's min_rows rows: dequantize, then cuBLAS)
      Nothing follows the row count: weight shape, group size, strides, dtype are fixed per layer (the scratch's
        address is one per device) -> warm_up_quantized also runs each INT4 layer at its min_rows
        (quant.int4_warmup_rows), which also grows the scratch to the largest layer before graph capture.

How they are built: warmup.warm_up_kernels hands the skinny GEMM's configs and, but for MoE models, what a
discovery run of the warm-up passes launches unbuilt to a thread pool (kernel_builds.py), then runs the passes; CUDA
graph capture builds its own variants one after another, as before.

Not covered here: a vision tower's first image (its norms and activations at the tower's widths; multimodal
models' encoders) and the draft and EAGLE runners beyond their extend kernels (the draft model calls
warm_up_extend; the EAGLE head builds its tree steps' masked extend kernels, its catch-up passes build theirs at the
first one).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from radixlm.runtime.kernels.attention import (
    DECODE_BLOCK_N, decode_chunk_capacity, decode_num_splits, decode_wide_rows, shared_prefix_num_splits)
from radixlm.runtime.kernels.attention.decode_splits import DECODE_CHUNK_MAX_ROWS, DECODE_TARGET_PROGRAMS
from radixlm.runtime.kernels.gemm import MMA_ROWS, SKINNY_MAX_M

# Extend passes of these per-request new-token counts build both of the extend kernel's tiles (BLOCK_M 16, 64).
EXTEND_WARMUP_LENS = ([16, 16], [17])
# Eager passes of one row per request at these batch sizes set every layer kind's few-row GEMM choice at each row
# count up to skinny_gemm.SKINNY_MAX_M (gemm.linear); mma_warmup_rows adds one per tensor-core BLOCK_M past it.
TOKEN_ROW_WARMUP = (1, 2, 3, 4)


def mma_warmup_rows(max_rows: int | None) -> tuple[int, ...]:
    """One eager pass's row count per BLOCK_M of the tensor-core kernel (skinny_mma.MMA_ROWS: gemm.linear's choice
    keys past SKINNY_MAX_M rows) that a decode pass of at most max_rows rows can reach: the BLOCK_M itself, or
    max_rows where that is fewer."""
    rows, low = [], SKINNY_MAX_M + 1
    for block_m in MMA_ROWS:
        if max_rows is not None and max_rows < low:
            break
        rows.append(block_m if max_rows is None else min(block_m, max_rows))
        low = block_m + 1
    return tuple(rows)


def decode_eager_splits(context_len: int, num_kv_heads: int, graph_max_bs: int) -> list[int]:
    """The split counts of decode passes run without a CUDA graph: decode_num_splits over every longest sequence up
    to context_len and every batch of more than graph_max_bs rows (0: passes of any size run eagerly). The count is
    non-increasing in the batch size and non-decreasing in the length, and the length reaches every count up to
    the longest's, so the set is 1..decode_num_splits(context_len, graph_max_bs + 1)."""
    top = decode_num_splits(max(context_len, 1), graph_max_bs + 1, num_kv_heads)
    return list(range(1, top + 1))


def split_seq_len(splits: int) -> int:
    """The sequence length at which one request's decode pass takes `splits` splits (where the batch allows it)."""
    return 4 * DECODE_BLOCK_N * (splits - 1) + 1


def decode_split_passes(splits: list[int], context_len: int, num_kv_heads: int, eager_from: int,
                        max_rows: int | None) -> list:
    """(rows, seq_len) of the eager passes that build decode stages 1 and 2 at each split count an eager pass can
    meet (eager passes: more than eager_from rows, at most max_rows; `splits`: decode_eager_splits of them): one
    request per split count past one (one-row passes launch with PDL on sm_90), and, at the fewest rows of an
    unchunked eager pass of 2+ rows (decode_chunk_capacity 0), one pass per split count such passes reach (PDL off;
    the split count is non-increasing in the rows, so the fewest reach them all)."""
    passes = [(1, split_seq_len(s)) for s in splits if s > 1]
    rows = max(2, eager_from + 1)
    if decode_chunk_capacity(rows, num_kv_heads):
        rows = min(DECODE_CHUNK_MAX_ROWS + 1, -(-DECODE_TARGET_PROGRAMS // max(1, num_kv_heads)))
    if max_rows is None or rows <= max_rows:
        passes += [(rows, split_seq_len(s)) for s in decode_eager_splits(context_len, num_kv_heads, rows - 1)]
    return passes


@dataclass
class WarmupPlan:
    """What warmup.warm_up_kernels runs before CUDA-graph capture."""

    extend_lens: tuple = EXTEND_WARMUP_LENS
    token_row_batches: tuple = TOKEN_ROW_WARMUP
    decode_splits: list[int] = field(default_factory=list)
    split_passes: list[tuple[int, int]] = field(default_factory=list)  # decode_split_passes: (rows, seq_len)
    moe: bool = False  # every reachable GEMM config of each MoE layer shape (fused_moe.reachable_configs)
    tree_masks: bool = False  # extend_lens passes again with tree masks (the extend kernel's USE_CUSTOM_MASK)
    shared_prefix: list[tuple[int, int]] = field(default_factory=list)  # shared_prefix_warmup's pairs


def shared_prefix_warmup(context_len: int, num_kv_heads: int, splits: list[int]) -> list[tuple[int, int]]:
    """(decode splits, prefix splits) pairs, one per stage-2 tile (next_power_of_2 of their sum) that an eager
    decode pass with shared prefixes can meet: decode splits among `splits` (decode_eager_splits), prefix splits
    1..shared_prefix_num_splits of the longest prefix in one tile."""
    top = shared_prefix_num_splits(max(context_len, 1), 1, num_kv_heads)
    pairs: dict[int, tuple[int, int]] = {}
    for s in splits:
        for p in range(1, top + 1):
            pairs.setdefault(1 << (s + p - 1).bit_length(), (s, p))
    return sorted(pairs.values())


def warmup_plan(context_len: int, num_kv_heads: int, graph_max_bs: int, eager_token_rows_any_size: bool,
                has_moe: bool, tree_masks: bool = False, shared_prefix: bool = False,
                max_rows: int | None = None) -> WarmupPlan:
    """graph_max_bs: the largest captured batch (0 without graphs); eager_token_rows_any_size: passes of any row
    count may run without a graph (media or multimodal positions); tree_masks: tree drafts are configured and the
    attention backend takes their masks (uses_tree_masks); shared_prefix: eager decode passes may carry shared
    prefixes (shared-prefix decode, not --disable-shared-prefix-decode, on a backend that supports_shared_prefix);
    max_rows: the most rows a decode pass can have (None: no bound)."""
    eager_from = 0 if eager_token_rows_any_size else graph_max_bs
    splits = decode_eager_splits(context_len, num_kv_heads, eager_from)
    wide = decode_wide_rows(num_kv_heads)
    rows = TOKEN_ROW_WARMUP + mma_warmup_rows(max_rows)
    if max_rows is None or max_rows >= max(wide, eager_from + 1):
        rows += (wide,)
    return WarmupPlan(token_row_batches=rows, decode_splits=splits,
                      split_passes=decode_split_passes(splits, context_len, num_kv_heads, eager_from, max_rows),
                      moe=has_moe, tree_masks=tree_masks,
                      shared_prefix=shared_prefix_warmup(context_len, num_kv_heads, splits) if shared_prefix else [])


def uses_tree_masks(server_args, supports_tree_mask: bool) -> bool:
    """Whether serving runs tree drafts' masked passes: EAGLE / EAGLE3 with --speculative-eagle-topk > 1 on a
    backend that supports_tree_mask (otherwise the head drafts chains)."""
    algo = getattr(server_args, "speculative_algorithm", None)
    return (supports_tree_mask and algo is not None and getattr(algo, "is_eagle", False)
            and getattr(server_args, "speculative_eagle_topk", 1) > 1)
