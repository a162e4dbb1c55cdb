"""Attention on CUDA with Triton kernels over the paged KV pool: split-K decode, and extend (prefill chunks over a
cached prefix, and decode passes carrying jump-forward tokens) in one ragged launch. Tree drafts' passes
(ForwardBatch.tree_masks, REQUEST_SPANS, run eagerly) give the extend kernel their masks (extend_attention's custom
mask: each TreeMask flattened, concatenated, with per-request starts and offsets)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from radixlm.runtime.host_to_device import host_to_device, rows_to_device
from radixlm.runtime.layers.attention.base import AttentionBackend
from radixlm.runtime.kernels.attention import (
    decode_chunk_capacity, decode_num_splits, shared_prefix_num_splits, shared_prefix_rows_per_tile)
from radixlm.runtime.kernels.attention import extend_block_m, extend_blocks

if TYPE_CHECKING:
    from radixlm.runtime.executor.forward_batch import ForwardBatch
    from radixlm.runtime.kernels.attention import DecodeWork


@dataclass
class SharedPrefixes:
    """Decode rows grouped by a shared KV prefix, as the shared-prefix kernel reads them (views of one copy).
    Invariant (ForwardBatch.shared_prefixes, set by scheduler/shared_prefix.py): the rows of a group have identical
    req_to_token slots over [0, prefix_len), prefix_len >= SHARED_PREFIX_MIN_LEN, and a group has >= 2 rows; a row is
    in one group at most."""

    row_starts: torch.Tensor  # (bs,): a grouped row's prefix_len (where its decode stage 1 starts), else 0
    tile_rows: torch.Tensor  # batch rows, group after group
    tiles: torch.Tensor  # (3 * num_tiles,): per tile its first index into tile_rows, its row count, its prefix_len
    num_tiles: int
    num_splits: int  # prefix splits: partial slots after the decode kernel's


def shared_prefixes(groups: list[tuple[int, list[int]]], bs: int, group: int, num_kv_heads: int,
                    device) -> SharedPrefixes:
    """groups: (prefix_len, batch rows) each; group: query heads per kv head (the tile's rows per request)."""
    per_tile = shared_prefix_rows_per_tile(group)
    starts, tile_rows, firsts, counts, lens = [0] * bs, [], [], [], []
    for prefix_len, rows in groups:
        for i in range(0, len(rows), per_tile):
            firsts.append(len(tile_rows) + i)
            counts.append(min(per_tile, len(rows) - i))
            lens.append(prefix_len)
        for r in rows:
            starts[r] = prefix_len
        tile_rows += rows
    flat = host_to_device(starts + tile_rows + firsts + counts + lens, torch.int64, device)
    n = len(tile_rows)
    return SharedPrefixes(flat[:bs], flat[bs : bs + n], flat[bs + n :], len(firsts),
                          shared_prefix_num_splits(max(lens), len(firsts), num_kv_heads))


@dataclass
class TritonMetadata:
    max_seq_len: int  # decode: the split-K sizing
    # decode: a fixed split count (CUDA graphs); None derives it from max_seq_len. Chunked batch sizes
    # (decode_chunk_capacity) take no split count: their work list, built once for the pass's layers.
    num_splits: int | None = None
    decode_work: "DecodeWork | None" = None
    max_extend_len: int = 0
    prefix_lens: torch.Tensor | None = None  # extend, on the device
    extend_lens: torch.Tensor | None = None
    extend_blocks: torch.Tensor | None = None  # extend: the kernel's work list (extend_blocks.py), on the device
    # Tree masks (extend passes with ForwardBatch.tree_masks): the masks flattened and concatenated (uint8), and per
    # request the mask's start (table index) and its offset in custom_mask (-1: causal).
    custom_mask: torch.Tensor | None = None
    mask_starts: torch.Tensor | None = None
    mask_offsets: torch.Tensor | None = None
    # Eager decode passes with ForwardBatch.shared_prefixes: the groups, and their device form (built at the first
    # layer, whose GQA group sets the tiles). CUDA-graph passes keep the plain kernel.
    shared_groups: list | None = None
    shared: SharedPrefixes | None = None


def tree_mask_inputs(fb: "ForwardBatch", device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(custom_mask, mask_starts, mask_offsets) of extend_attention from fb.tree_masks: request i's TreeMask (ext_i
    rows, seq_len_i - start columns) flattened row-major at its offset. Masks built on the host (verification) go in
    one copy; masks on the device (the EAGLE head's tree steps) are concatenated there, with no sync."""
    parts, starts, offsets, at = [], [], [], 0
    for i, tree in enumerate(fb.tree_masks):
        if tree is None:
            starts.append(0)
            offsets.append(-1)
            continue
        rows, cols = fb.extend_seq_lens_cpu[i], fb.seq_lens_cpu[i] - tree.start
        if tuple(tree.mask.shape) != (rows, cols) or tree.start < 0:
            raise ValueError(f"tree mask of request {i}: shape {tuple(tree.mask.shape)} from index {tree.start}, "
                             f"expected ({rows}, {cols}) for {rows} new tokens of a sequence of {fb.seq_lens_cpu[i]}")
        parts.append(tree.mask.reshape(-1))
        starts.append(tree.start)
        offsets.append(at)
        at += rows * cols
    if not parts:
        mask = torch.zeros(1, dtype=torch.uint8, device=device)
    elif all(p.device.type == "cpu" for p in parts):
        mask = host_to_device(torch.cat(parts).view(torch.uint8), torch.uint8, device)
    else:
        mask = torch.cat([p.to(device, non_blocking=True) for p in parts]).view(torch.uint8)
    lens = rows_to_device([starts, offsets], device)
    return mask, lens[0], lens[1]


class TritonAttnBackend(AttentionBackend):
    supports_cuda_graph = True
    supports_tree_mask = True  # ForwardBatch.tree_masks, in forward_extend (extend_attention's custom mask)
    supports_shared_prefix = True  # ForwardBatch.shared_prefixes, in eager decode passes

    def __init__(self, model_runner):
        self.model_runner = model_runner
        # CUDA graphs size their split count for the longest sequence the model takes.
        self.context_len = model_runner.model_config.context_len
        self.num_kv_heads = model_runner.num_kv_heads  # this rank's: the pools' and the kernels' kv heads

    def init_forward_metadata_static(self, forward_batch: "ForwardBatch") -> None:
        """A CUDA graph's decode pass: the work list's launch is captured with it, and rebuilds it every replay."""
        bs = forward_batch.batch_size
        forward_batch.attn_metadata = TritonMetadata(
            self.context_len, num_splits=decode_num_splits(self.context_len, bs, self.num_kv_heads),
            decode_work=self._decode_work(forward_batch))

    def _decode_work(self, fb: "ForwardBatch") -> "DecodeWork | None":
        from radixlm.runtime.kernels.attention import decode_work_list

        capacity = decode_chunk_capacity(fb.batch_size, self.num_kv_heads)
        return decode_work_list(fb.seq_lens, fb.req_pool_indices, fb.batch_size, capacity) if capacity else None

    def init_forward_metadata(self, forward_batch: "ForwardBatch") -> None:
        fb = forward_batch
        max_len = max(fb.seq_lens_cpu, default=0)
        if fb.forward_mode.is_token_rows():
            fb.attn_metadata = TritonMetadata(max_len, shared_groups=fb.shared_prefixes or None,
                                              decode_work=None if fb.shared_prefixes else self._decode_work(fb))
            return
        dev = fb.input_ids.device
        prefix, ext = fb.extend_prefix_lens_cpu, fb.extend_seq_lens_cpu
        max_extend = max(ext, default=0)
        bs = len(ext)
        # One copy: the two length vectors, then the work list.
        flat = host_to_device(list(prefix) + list(ext) + extend_blocks(ext, extend_block_m(max_extend)),
                              torch.int64, dev)
        fb.attn_metadata = meta = TritonMetadata(max_len, max_extend_len=max_extend, prefix_lens=flat[:bs],
                                                 extend_lens=flat[bs : 2 * bs], extend_blocks=flat[2 * bs :])
        if fb.tree_masks is not None:
            meta.custom_mask, meta.mask_starts, meta.mask_offsets = tree_mask_inputs(fb, dev)

    def warm_up_shared_prefix(self, layer, pairs: list[tuple[int, int]]) -> None:
        """Builds the kernels of decode passes with shared prefixes (kernel_variants.shared_prefix_warmup's pairs of
        decode and prefix split counts): two rows on request row 0 sharing a one-token prefix, layer's shapes."""
        from radixlm.runtime.kernels.attention import decode_attention

        runner = self.model_runner
        k_buf = runner.token_to_kv_pool.get_key_buffer(layer.layer_id)
        v_buf = runner.token_to_kv_pool.get_value_buffer(layer.layer_id)
        dev = k_buf.device
        q = torch.zeros(2, layer.num_heads, layer.head_dim, dtype=runner.model_config.dtype, device=dev)
        scales = runner.token_to_kv_pool.kv_scales(layer.layer_id)
        rows = torch.zeros(2, dtype=torch.int64, device=dev)
        lens = torch.full((2,), 2, dtype=torch.int64, device=dev)
        shared = shared_prefixes([(1, [0, 1])], 2, layer.num_heads // k_buf.shape[1], k_buf.shape[1], dev)
        for splits, prefix_splits in pairs:
            decode_attention(q, k_buf, v_buf, runner.req_to_token_pool.req_to_token, rows, lens, layer.scaling, 2,
                             splits, replace(shared, num_splits=prefix_splits), k_scale=scales.k_scale,
                             v_scale=scales.v_scale)

    def _metadata(self, fb: "ForwardBatch") -> TritonMetadata:
        if not isinstance(fb.attn_metadata, TritonMetadata):
            self.init_forward_metadata(fb)
        return fb.attn_metadata

    @staticmethod
    def _save_kv(k, v, layer, fb: "ForwardBatch", save_kv_cache: bool) -> None:
        if save_kv_cache and k is not None:
            fb.token_to_kv_pool.set_kv_buffer(layer.layer_id, fb.out_cache_loc, k, v)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        from radixlm.runtime.kernels.attention import extend_attention

        fb = forward_batch
        # NOTE: the new tokens' K/V go to the pool first; the kernel reads every key through req_to_token.
        self._save_kv(k, v, layer, fb, save_kv_cache)
        meta = self._metadata(fb)
        scales = fb.token_to_kv_pool.kv_scales(layer.layer_id)
        o = extend_attention(
            q.reshape(-1, layer.num_heads, layer.head_dim), fb.token_to_kv_pool.get_key_buffer(layer.layer_id),
            fb.token_to_kv_pool.get_value_buffer(layer.layer_id), fb.req_to_token_pool.req_to_token,
            fb.req_pool_indices, meta.prefix_lens, meta.extend_lens, fb.extend_start_loc, layer.scaling,
            meta.max_extend_len, meta.custom_mask, meta.mask_starts, meta.mask_offsets, meta.extend_blocks,
            scales.k_scale, scales.v_scale)
        return o.reshape(-1, layer.num_heads * layer.head_dim)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        from radixlm.runtime.kernels.attention import decode_attention

        fb = forward_batch
        self._save_kv(k, v, layer, fb, save_kv_cache)
        bs = fb.batch_size
        meta = self._metadata(fb)
        if bs == 0:
            return q.reshape(0, layer.num_heads * layer.head_dim)
        k_buf = fb.token_to_kv_pool.get_key_buffer(layer.layer_id)
        scales = fb.token_to_kv_pool.kv_scales(layer.layer_id)
        if meta.shared_groups and meta.shared is None:
            meta.shared = shared_prefixes(meta.shared_groups, bs, layer.num_heads // k_buf.shape[1], k_buf.shape[1],
                                          q.device)
        o = decode_attention(
            q.reshape(bs, layer.num_heads, layer.head_dim), k_buf, fb.token_to_kv_pool.get_value_buffer(layer.layer_id),
            fb.req_to_token_pool.req_to_token, fb.req_pool_indices, fb.seq_lens, layer.scaling, meta.max_seq_len,
            meta.num_splits, meta.shared, meta.decode_work, k_scale=scales.k_scale, v_scale=scales.v_scale)
        return o.reshape(bs, layer.num_heads * layer.head_dim)
