"""Triton attention over the paged KV pool (CUDA): split-K decode (decode.py, with the chunked passes' work list,
decode_work.py, and shared-prefix groups, shared_prefix.py, over span.py's walk) and ragged extend over a cached
prefix (extend.py); the host-side sizing both read (decode_splits.py, extend_blocks.py: no Triton, any device).
MLA (DeepSeek's latent pool, absorbed queries): mla.py, the interface and sizing of mla_decode.py and mla_extend.py
(import the functions mla_decode and mla_extend from mla.py: in this package those names are the kernel modules).
Deterministic mode's batch-invariant attention: fixed_split.py (its rule, and the torch implementation the CPU runs)
and fixed_split_kernel.py (the Triton kernel).
The attention backends that call them are layers (layers/attention/)."""
from radixlm.runtime.kernels.attention.decode_splits import (
    DECODE_BLOCK_N, SHARED_PREFIX_MIN_LEN, decode_chunk_capacity, decode_num_splits, decode_wide_rows,
    shared_prefix_num_splits, shared_prefix_rows_per_tile)
from radixlm.runtime.kernels.attention.fixed_split import (
    FIXED_SPLIT_SIZE, fixed_split_attention_torch, row_requests)
from radixlm.runtime.kernels.attention.extend_blocks import extend_block_m, extend_blocks
from radixlm.runtime.kernels.lazy import lazy_names

__getattr__ = lazy_names(__name__, {
    "decode_attention": "decode", "DecodeWork": "decode_work", "decode_work_list": "decode_work",
    "inline_builds": "decode_work", "extend_attention": "extend", "MlaDecodeConfig": "mla", "MlaExtendConfig": "mla",
    "mla_decode_num_splits": "mla", "mla_extend_blocks": "mla", "mla_extend_config": "mla", "warm_up_mla": "mla",
    "fixed_split_attention": "fixed_split_kernel"})

__all__ = ["DECODE_BLOCK_N", "DecodeWork", "FIXED_SPLIT_SIZE", "MlaDecodeConfig", "MlaExtendConfig",
           "SHARED_PREFIX_MIN_LEN", "decode_attention", "decode_chunk_capacity", "decode_num_splits",
           "decode_wide_rows", "decode_work_list", "extend_attention", "extend_block_m", "extend_blocks",
           "fixed_split_attention", "fixed_split_attention_torch", "inline_builds", "mla_decode_num_splits",
           "mla_extend_blocks", "mla_extend_config", "row_requests", "shared_prefix_num_splits",
           "shared_prefix_rows_per_tile", "warm_up_mla"]
