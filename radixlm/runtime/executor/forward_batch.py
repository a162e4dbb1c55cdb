"""The tensors one forward pass needs, built by the scheduler's ScheduleBatch and read by models and
attention backends. Nothing here knows about requests or the radix tree."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from radixlm.runtime.cache.memory_pool import ReqToTokenPool, TokenToKVPool
    from radixlm.runtime.layers.attention.base import AttentionBackend


class ForwardMode(enum.IntEnum):
    EXTEND = 1  # prefill of new tokens, possibly after a cached prefix (chunked prefill included)
    DECODE = 2  # exactly one new token per request
    IDLE = 3  # nothing to run

    def is_extend(self) -> bool:
        return self == ForwardMode.EXTEND

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE


@dataclass
class ForwardBatch:
    """Set by ScheduleBatch.get_forward_batch (scheduler); read-only for everything below.

    Token-major tensors have one row per new token, requests laid out one after another in batch order.
    For request i the new tokens sit at positions [extend_prefix_lens_cpu[i], seq_lens_cpu[i]); their KV
    goes to the pool slots out_cache_loc[extend_start_loc[i] : extend_start_loc[i] + extend_seq_lens_cpu[i]],
    which req_to_token[req_pool_indices[i]] already lists, so the whole sequence's slots are
    req_to_token[req_pool_indices[i], :seq_lens_cpu[i]]."""

    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor  # (num_tokens,) int64
    positions: torch.Tensor  # (num_tokens,) int64
    req_pool_indices: torch.Tensor  # (bs,) int64
    seq_lens: torch.Tensor  # (bs,) int64: prefix + new tokens
    seq_lens_cpu: list[int]
    out_cache_loc: torch.Tensor  # (num_tokens,) int64: KV slots for the new tokens
    req_to_token_pool: "ReqToTokenPool"
    token_to_kv_pool: "TokenToKVPool"
    attn_backend: "AttentionBackend"
    # Extend only (for decode: prefix = seq_len - 1, extend = 1).
    extend_prefix_lens_cpu: list[int] = field(default_factory=list)
    extend_seq_lens_cpu: list[int] = field(default_factory=list)
    extend_start_loc: torch.Tensor | None = None  # (bs,) int64 exclusive cumsum of extend_seq_lens
    # Decode (when built by ScheduleBatch): (4, bs) int64 whose rows are input_ids, positions, req_pool_indices and
    # seq_lens (those four are its views): a CUDA-graph replay takes them in one copy.
    decode_rows: torch.Tensor | None = None
    # Set by the attention backend in init_forward_metadata; opaque to everyone else.
    attn_metadata: object = None

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])
