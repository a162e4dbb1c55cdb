"""Multi-head latent attention's core, in the absorbed form (DeepSeek-V2/V3 MLA), for decode and extend alike.

Every query row arrives already in the latent space: per head [W_UK^T q_nope (kv_lora_rank) | rotated q_pe
(qk_rope_head_dim)], and every key is a row of the layer's latent cache [c_kv | k_pe] (cache.kv_pool.MLATokenToKVPool),
the pass's own rows already stored. A row's scores are q . row over the keys it sees, its output the softmax-weighted
sum of the keys' c_kv (the values are the latent itself: W_UV is applied by the caller, after). A row sees its
request's cache positions up to its own (causal), or as the request's tree mask says (tree drafts).

`latent_attention` is the one entry point (the seam). On CUDA, where the latent widths suit them (multiples of 16),
the Triton kernels run (kernels/attention/mla.py: split-K decode for TOKEN_ROWS passes, extend for REQUEST_SPANS
passes); they read nothing from the host during a decode pass, so CUDA graphs capture them (a captured pass fixes
its split count from the batch size alone). Elsewhere the torch path here runs: exact, it gathers each request's
rows and reads host-side lengths."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixlm.runtime.host_to_device import host_to_device
from radixlm.runtime.kernels.attention.mla import (
    MlaExtendConfig, mla_decode, mla_decode_num_splits, mla_extend, mla_extend_blocks, mla_extend_config,
)
from radixlm.runtime.layers.attention.torch_native import gather_kv
from radixlm.runtime.layers.attention.triton_backend import tree_mask_inputs

if TYPE_CHECKING:
    from radixlm.runtime.executor.forward_batch import ForwardBatch


def latent_attention(q: torch.Tensor, kv_buffer: torch.Tensor, forward_batch: "ForwardBatch", scale: float,
                     kv_lora_rank: int) -> torch.Tensor:
    """q: (T, H, kv_lora_rank + qk_rope_head_dim), the pass's rows; kv_buffer: the layer's latent cache
    (slots, 1, kv_lora_rank + qk_rope_head_dim), holding this pass's rows at forward_batch.out_cache_loc already;
    scale: the softmax scale (DeepSeek's: qk_head_dim ** -0.5, times YaRN's mscale squared). Returns (T, H,
    kv_lora_rank) in q's dtype: each row's attention-weighted sum of c_kv."""
    if q.dim() != 3 or kv_buffer.dim() != 3 or kv_buffer.shape[1] != 1 or q.shape[-1] != kv_buffer.shape[-1]:
        raise ValueError(f"latent attention takes q (T, H, D) and a (slots, 1, D) latent cache; got q "
                         f"{tuple(q.shape)}, cache {tuple(kv_buffer.shape)}")
    if not 0 < kv_lora_rank < q.shape[-1]:
        raise ValueError(f"kv_lora_rank {kv_lora_rank} must be within the latent row's width {q.shape[-1]}")
    if q.is_cuda and kernels_fit(kv_lora_rank, q.shape[-1] - kv_lora_rank):
        return latent_attention_cuda(q, kv_buffer, forward_batch, scale, kv_lora_rank)
    return latent_attention_torch(q, kv_buffer, forward_batch, scale, kv_lora_rank)


def kernels_fit(kv_lora_rank: int, rope_dim: int) -> bool:
    """Whether the Triton kernels take these latent widths (check_mla_args' rule)."""
    return kv_lora_rank >= 16 and rope_dim >= 16 and kv_lora_rank % 16 == 0 and rope_dim % 16 == 0


def latent_attention_supports_cuda_graph(kv_lora_rank: int, rope_dim: int) -> bool:
    """Whether a CUDA pass through latent_attention can be captured: the kernels' path can, the torch path (host-side
    lengths) cannot."""
    return kernels_fit(kv_lora_rank, rope_dim)


def latent_attention_cuda(q: torch.Tensor, kv_buffer: torch.Tensor, fb: "ForwardBatch", scale: float,
                          kv_lora_rank: int) -> torch.Tensor:
    num_heads = q.shape[1]
    out = q.new_empty(q.shape[0], num_heads, kv_lora_rank)
    if q.shape[0] == 0:
        return out
    req_to_token = fb.req_to_token_pool.req_to_token
    if fb.forward_mode.is_token_rows():
        if torch.cuda.is_current_stream_capturing():  # a replay meets any lengths: splits from the batch size alone
            splits = mla_decode_num_splits(q.shape[0], num_heads)
            return mla_decode(q, kv_buffer, req_to_token, fb.req_pool_indices, fb.seq_lens, scale, out,
                              num_kv_splits=splits)
        return mla_decode(q, kv_buffer, req_to_token, fb.req_pool_indices, fb.seq_lens, scale, out,
                          max_seq_len=max(fb.seq_lens_cpu, default=1))
    meta = fb.latent_attn_metadata
    if not isinstance(meta, LatentKernelMetadata):
        meta = fb.latent_attn_metadata = _kernel_metadata(fb, mla_extend_config(num_heads))
    return mla_extend(q, kv_buffer, req_to_token, fb.req_pool_indices, meta.prefix_lens, meta.extend_lens,
                      fb.extend_start_loc, scale, out, blocks=meta.blocks, config=meta.config,
                      custom_mask=meta.custom_mask, mask_starts=meta.mask_starts, mask_offsets=meta.mask_offsets)


@dataclass
class LatentKernelMetadata:
    """An extend pass's kernel inputs, built at its first MLA layer (one host-to-device copy), read by the later
    ones."""

    prefix_lens: torch.Tensor
    extend_lens: torch.Tensor
    blocks: torch.Tensor
    config: MlaExtendConfig
    custom_mask: torch.Tensor | None = None
    mask_starts: torch.Tensor | None = None
    mask_offsets: torch.Tensor | None = None


def _kernel_metadata(fb: "ForwardBatch", config: MlaExtendConfig) -> LatentKernelMetadata:
    prefix, ext = fb.extend_prefix_lens_cpu, fb.extend_seq_lens_cpu
    bs = len(ext)
    flat = host_to_device(list(prefix) + list(ext) + mla_extend_blocks(list(ext), config), torch.int64,
                          fb.input_ids.device)
    meta = LatentKernelMetadata(flat[:bs], flat[bs : 2 * bs], flat[2 * bs :], config)
    if fb.tree_masks is not None:
        meta.custom_mask, meta.mask_starts, meta.mask_offsets = tree_mask_inputs(fb, fb.input_ids.device)
    return meta


@dataclass
class LatentAttnMetadata:
    """What every MLA layer of one pass reads (built once, at the first)."""

    # TOKEN_ROWS: per row, its request's cache slots padded to the longest (padding on the dummy slot 0) and which
    # of them it sees.
    slots: torch.Tensor | None = None  # (rows, max_len) int64
    mask: torch.Tensor | None = None  # (rows, max_len) bool
    # REQUEST_SPANS: per request, its first row in q and its req_to_token row.
    starts: list[int] | None = None
    table_rows: list[int] | None = None


def _metadata(fb: "ForwardBatch") -> LatentAttnMetadata:
    if isinstance(fb.latent_attn_metadata, LatentAttnMetadata):
        return fb.latent_attn_metadata
    if fb.forward_mode.is_token_rows():
        max_len = max(fb.seq_lens_cpu, default=0)
        table = fb.req_to_token_pool.req_to_token[fb.req_pool_indices, :max_len]
        pos = torch.arange(max_len, device=table.device)
        mask = pos[None, :] < fb.seq_lens.to(table.device)[:, None]
        meta = LatentAttnMetadata(slots=torch.where(mask, table, torch.zeros_like(table)), mask=mask)
    else:
        starts, acc = [], 0
        for n in fb.extend_seq_lens_cpu:
            starts.append(acc)
            acc += n
        meta = LatentAttnMetadata(starts=starts, table_rows=fb.req_pool_indices.tolist())
    fb.latent_attn_metadata = meta
    return meta


def _attend(q: torch.Tensor, kv: torch.Tensor, mask: torch.Tensor | None, scale: float,
            kv_lora_rank: int) -> torch.Tensor:
    """q (B, H, R, D) over kv (B, L, D) with mask (B, R, L) or None -> (B, R, H, kv_lora_rank)."""
    scores = torch.matmul(q, kv.unsqueeze(1).transpose(-1, -2)) * scale  # (B, H, R, L)
    if mask is not None:
        scores = scores.masked_fill(~mask[:, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    out = torch.matmul(probs, kv[..., :kv_lora_rank].unsqueeze(1))  # (B, H, R, rank)
    return out.transpose(1, 2)


def latent_attention_torch(q: torch.Tensor, kv_buffer: torch.Tensor, fb: "ForwardBatch", scale: float,
                           kv_lora_rank: int) -> torch.Tensor:
    meta = _metadata(fb)
    num_heads = q.shape[1]
    if fb.forward_mode.is_token_rows():
        if q.shape[0] == 0:
            return q.new_empty(0, num_heads, kv_lora_rank)
        kv = gather_kv(kv_buffer, meta.slots).squeeze(-2).to(q.dtype)  # (rows, L, D)
        out = _attend(q[:, :, None], kv, meta.mask[:, None], scale, kv_lora_rank)  # (rows, 1, H, rank)
        return out.squeeze(1)
    out = q.new_zeros(q.shape[0], num_heads, kv_lora_rank)
    req_to_token = fb.req_to_token_pool.req_to_token
    trees = fb.tree_masks
    for i in range(fb.batch_size):
        ext, seq_len, prefix = fb.extend_seq_lens_cpu[i], fb.seq_lens_cpu[i], fb.extend_prefix_lens_cpu[i]
        if ext == 0:
            continue
        start = meta.starts[i]
        kv = gather_kv(kv_buffer, req_to_token[meta.table_rows[i], :seq_len]).squeeze(-2).to(q.dtype)  # (L, D)
        tree = trees[i] if trees is not None else None
        mask = torch.ones(ext, seq_len, dtype=torch.bool, device=q.device)
        if tree is not None:
            mask[:, tree.start :] = tree.mask.to(q.device)
        else:
            mask = mask.tril(diagonal=prefix)  # new row j (position prefix + j) sees positions <= prefix + j
        qi = q[start : start + ext].transpose(0, 1)[None]  # (1, H, ext, D)
        out[start : start + ext] = _attend(qi, kv[None], mask[None], scale, kv_lora_rank)[0]
    return out
