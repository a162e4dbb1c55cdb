"""The attention backend of --enable-deterministic-inference: every pass, in either layout, runs the batch-invariant
attention (kernels/attention/fixed_split.py: the Triton kernel on CUDA, the torch implementation elsewhere), so a
row's output is the same whether it is a prefill, a chunk, an extend over a radix-cache hit, a decode step or a
CUDA-graph replay, and whatever else the pass holds. It takes no tree masks (EAGLE drafts chains then) and no shared
prefixes (eager decode passes read each row's prefix itself), and attends causally only."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixlm.runtime.kernels.attention import fixed_split_attention_torch, row_requests
from radixlm.runtime.kernels.attention.fixed_split import row_tiles, span_launches
from radixlm.runtime.kernels.attention.fixed_split_config import FixedSplitConfig, config_for, default_config
from radixlm.runtime.host_to_device import host_to_device
from radixlm.runtime.layers.attention.base import AttentionBackend

if TYPE_CHECKING:
    from radixlm.runtime.executor.forward_batch import ForwardBatch
    from radixlm.runtime.layers.radix_attention import RadixAttention


@dataclass(frozen=True)
class FixedSplitMetadata:
    row_req: torch.Tensor  # (num_tokens,): each row's req_to_token row (the rows' positions: ForwardBatch.positions)
    # The Triton kernel's launches, each (first row, row count) int32 vectors, its sub-tiles per program and its
    # pipeline stages: a REQUEST_SPANS pass's requests cut into tiles by fixed_split.span_launches, else one tile per
    # row; empty off CUDA (the torch implementation takes rows one by one).
    launches: tuple[tuple[torch.Tensor, torch.Tensor, int, int], ...] = ()


class DeterministicAttnBackend(AttentionBackend):
    supports_cuda_graph = True  # the metadata is views of the graph's static request rows and of one-row tiles

    def __init__(self, model_runner: object | None = None):
        self.model_runner = model_runner
        cfg = getattr(model_runner, "model_config", None)
        # Every layer has the model's GQA group and head dim (deterministic mode refuses tensor parallelism); a
        # pass's tiles are cut for them (fixed_split.span_launches) before its layers run.
        self.group = cfg.num_heads // cfg.num_kv_heads if cfg is not None else None
        self.head_dim = cfg.head_dim if cfg is not None else None
        self.dtype = getattr(cfg, "dtype", None)
        self._config: FixedSplitConfig | None = None
        # Every one-row tile buffer built, the latest last: captured graphs read the one they were captured with, so
        # none is ever freed (a larger eager pass builds another).
        self._row_tiles: list[tuple[torch.Tensor, torch.Tensor]] = []

    def _one_row_tiles(self, n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of 0..n-1 and ones (built outside graph capture: a capture records and does not run)."""
        if not self._row_tiles or self._row_tiles[-1][0].shape[0] < n or self._row_tiles[-1][0].device != device:
            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError(f"one-row tiles for {n} rows first asked for inside a CUDA-graph capture")
            self._row_tiles.append(row_tiles(max(n, 256), device))
        starts, counts = self._row_tiles[-1]
        return starts[:n], counts[:n]

    def config(self, device: torch.device) -> FixedSplitConfig:
        """The model's attention shape's launch configuration on this GPU model (one for the process: it changes no
        row's bits, fixed_split_config)."""
        if self._config is None:
            if self.group is None:
                return default_config(128)
            self._config = (config_for(self.head_dim, self.group, self.dtype, device)
                            if isinstance(self.dtype, torch.dtype) else default_config(self.head_dim))
        return self._config

    def _launches(self, fb: "ForwardBatch", spans: list[int] | None) -> tuple:
        """FixedSplitMetadata.launches for a pass (spans: its requests' rows; None: one row each)."""
        if not fb.req_pool_indices.is_cuda:
            return ()
        cfg = self.config(fb.req_pool_indices.device)
        if spans is None or self.group is None:
            starts, counts = self._one_row_tiles(fb.num_tokens, fb.req_pool_indices.device)
            return ((starts, counts, 1, cfg.decode_stages),)
        prefix = fb.extend_prefix_lens_cpu if len(fb.extend_prefix_lens_cpu) == len(spans) else None
        launches = span_launches(spans, self.group, self.head_dim, prefix, cfg)
        if not launches:
            return ()
        flat = host_to_device([x for launch in launches for x in launch.starts + launch.counts], torch.int32,
                              fb.req_pool_indices.device)
        out, at = [], 0
        for launch in launches:
            n = len(launch.starts)
            out.append((flat[at : at + n], flat[at + n : at + 2 * n], launch.sub_tiles, launch.num_stages))
            at += 2 * n
        return tuple(out)

    def init_forward_metadata(self, forward_batch: "ForwardBatch") -> None:
        fb = forward_batch
        if fb.tree_masks is not None and any(t is not None for t in fb.tree_masks):
            raise ValueError("deterministic attention takes no tree masks (its backend declares none)")
        spans = None if fb.forward_mode.is_token_rows() else fb.extend_seq_lens_cpu
        fb.attn_metadata = FixedSplitMetadata(row_requests(fb.req_pool_indices, spans, fb.num_tokens),
                                              self._launches(fb, spans))

    def init_forward_metadata_static(self, forward_batch: "ForwardBatch") -> None:
        fb = forward_batch
        launches = ()
        if fb.req_pool_indices.is_cuda:
            starts, counts = self._one_row_tiles(fb.batch_size, fb.req_pool_indices.device)
            launches = ((starts, counts, 1, self.config(fb.req_pool_indices.device).decode_stages),)
        fb.attn_metadata = FixedSplitMetadata(fb.req_pool_indices, launches)

    def _attend(self, q, k, v, layer: "RadixAttention", fb: "ForwardBatch", save_kv_cache: bool) -> torch.Tensor:
        if save_kv_cache and k is not None:
            fb.token_to_kv_pool.set_kv_buffer(layer.layer_id, fb.out_cache_loc, k, v)
        if not isinstance(fb.attn_metadata, FixedSplitMetadata):
            self.init_forward_metadata(fb)
        scales = fb.token_to_kv_pool.kv_scales(layer.layer_id)
        q = q.reshape(-1, layer.num_heads, layer.head_dim)
        k_buf = fb.token_to_kv_pool.get_key_buffer(layer.layer_id)
        v_buf = fb.token_to_kv_pool.get_value_buffer(layer.layer_id)
        args = (q, k_buf, v_buf, fb.req_to_token_pool.req_to_token, fb.attn_metadata.row_req,
                fb.positions[: q.shape[0]], layer.scaling * scales.k_scale, scales.v_scale)
        if q.is_cuda:
            from radixlm.runtime.kernels.attention import fixed_split_attention

            if self.group is not None and layer.num_heads // k_buf.shape[1] != self.group:
                raise ValueError(f"layer {layer.layer_id} groups {layer.num_heads // k_buf.shape[1]} query heads per "
                                 f"kv head; the pass's tiles were cut for {self.group}")
            o = torch.empty_like(q)
            for starts, counts, sub, stages in fb.attn_metadata.launches:
                fixed_split_attention(*args, tiles=(starts, counts), sub_tiles=sub, out=o, num_stages=stages)
        else:
            o = fixed_split_attention_torch(*args)
        return o.reshape(-1, layer.num_heads * layer.head_dim)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True) -> torch.Tensor:
        return self._attend(q, k, v, layer, forward_batch, save_kv_cache)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True) -> torch.Tensor:
        return self._attend(q, k, v, layer, forward_batch, save_kv_cache)
