"""The warm-up's dummy passes (kernels/startup runs them through the ModelRunner): request row 0 and KV slot 0, as
padded CUDA-graph rows use them, before anything real is in the pool."""
from __future__ import annotations

from typing import Any, Protocol

import torch

from radixlm.runtime.executor.forward_batch import ForwardBatch, ForwardMode, TreeMask


class PassTarget(Protocol):
    """What a dummy pass reads of a runner."""

    device: str
    req_to_token_pool: Any
    token_to_kv_pool: Any
    attn_backend: Any


def token_rows_batch(runner: PassTarget, bs: int, seq_len: int) -> ForwardBatch:
    """A TOKEN_ROWS pass of bs requests, each at position seq_len - 1 of request row 0 (KV slot 0)."""
    z = torch.zeros(bs, dtype=torch.int64, device=runner.device)
    return ForwardBatch(
        forward_mode=ForwardMode.TOKEN_ROWS, batch_size=bs, input_ids=z, positions=z + (seq_len - 1),
        req_pool_indices=z, seq_lens=z + seq_len, seq_lens_cpu=[seq_len] * bs, out_cache_loc=z,
        req_to_token_pool=runner.req_to_token_pool, token_to_kv_pool=runner.token_to_kv_pool,
        attn_backend=runner.attn_backend)


def extend_batch(runner: PassTarget, extend_lens, tree_masks: bool = False) -> ForwardBatch:
    """A REQUEST_SPANS pass of len(extend_lens) requests with no prefix, all on request row 0 and KV slot 0; with
    tree_masks each request carries a (causal) TreeMask, as tree drafts' passes do."""
    device = runner.device
    n, bs = sum(extend_lens), len(extend_lens)
    zeros = torch.zeros(n, dtype=torch.int64, device=device)
    starts = [sum(extend_lens[:i]) for i in range(bs)]
    return ForwardBatch(
        forward_mode=ForwardMode.REQUEST_SPANS, batch_size=bs, input_ids=zeros,
        positions=torch.cat([torch.arange(e, device=device) for e in extend_lens]),
        req_pool_indices=torch.zeros(bs, dtype=torch.int64, device=device),
        seq_lens=torch.tensor(extend_lens, device=device), seq_lens_cpu=list(extend_lens),
        out_cache_loc=zeros, req_to_token_pool=runner.req_to_token_pool, token_to_kv_pool=runner.token_to_kv_pool,
        attn_backend=runner.attn_backend, extend_prefix_lens_cpu=[0] * bs, extend_seq_lens_cpu=list(extend_lens),
        extend_start_loc=torch.tensor(starts, device=device),
        tree_masks=[TreeMask(0, torch.ones(e, e, dtype=torch.bool).tril()) for e in extend_lens] if tree_masks
        else None)
