"""Reference attention backend over the paged KV pool, built on torch's scaled_dot_product_attention.

Device-agnostic and exact (it gathers each request's whole sequence); slow for long contexts."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from radixlm.runtime.layers.attention.base import AttentionBackend

if TYPE_CHECKING:
    from radixlm.runtime.executor.forward_batch import ForwardBatch
    from radixlm.runtime.layers.radix_attention import RadixAttention


@dataclass
class TorchNativeMetadata:
    extend_start_loc_cpu: list[int]  # first token row of each request in q (extend)
    req_pool_indices_cpu: list[int]
    max_seq_len: int
    # Decode only: (bs, max_seq_len) KV slots, padding pointed at the dummy slot 0, and its validity mask.
    decode_slots: torch.Tensor | None = None
    decode_mask: torch.Tensor | None = None
    # Decode only: KV slots that every request of the batch starts with (a shared radix prefix), read
    # once for the whole batch; decode_slots/decode_mask then cover only what follows it.
    shared_slots: torch.Tensor | None = None


def kv_scaling(layer: "RadixAttention", fb: "ForwardBatch") -> tuple[float, float]:
    """(the softmax scale times the pool's k_scale, the pool's v_scale): a float8 pool's stored K and V are read
    as they are and their scales applied to the scores and the output (1.0 for other pools)."""
    scales = fb.token_to_kv_pool.kv_scales(layer.layer_id)
    return layer.scaling * scales.k_scale, scales.v_scale


def scaled_out(out: torch.Tensor, v_scale: float) -> torch.Tensor:
    return out if v_scale == 1.0 else out.mul_(v_scale)


def gather_kv(buf: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """buf[slots] for a (size, H, D) pool; index_select on a 2-D view is several times faster on CPU. A float8 pool's
    rows are gathered as bytes (torch's index kernels do not take every float8 dtype on every device)."""
    raw = buf.view(torch.uint8) if buf.element_size() == 1 else buf
    rows = raw.view(buf.shape[0], -1).index_select(0, slots.reshape(-1))
    return rows.view(buf.dtype).view(*slots.shape, *buf.shape[1:])


class TorchNativeAttnBackend(AttentionBackend):
    supports_tree_mask = True  # ForwardBatch.tree_masks, in forward_extend
    def __init__(self, model_runner: object | None = None, shared_prefix_min: int = 64, batched_extend_max: int = 64):
        # model_runner is accepted for a uniform backend constructor; nothing is read from it.
        self.model_runner = model_runner
        # A decode batch whose requests share at least this many leading KV slots reads them once.
        self.shared_prefix_min = shared_prefix_min
        # An extend batch whose requests each add at most this many tokens (a decode pass carrying jump-forward
        # tokens) runs as one padded attention call instead of one call per request.
        self.batched_extend_max = batched_extend_max

    def init_forward_metadata(self, forward_batch: "ForwardBatch") -> None:
        forward_batch.attn_metadata = self._build_metadata(forward_batch)

    def _build_metadata(self, fb: "ForwardBatch") -> TorchNativeMetadata:
        seq_lens = fb.seq_lens_cpu
        max_len = max(seq_lens, default=0)
        if fb.forward_mode.is_token_rows():
            starts = list(range(fb.batch_size))
            rows = fb.req_to_token_pool.req_to_token[fb.req_pool_indices, :max_len]
            pos = torch.arange(max_len, device=rows.device)
            mask = pos[None, :] < fb.seq_lens.to(rows.device)[:, None]
            slots = torch.where(mask, rows, torch.zeros_like(rows))
            shared = self._shared_prefix_len(slots, min(seq_lens)) if fb.batch_size > 1 else 0
            if shared >= self.shared_prefix_min:
                return TorchNativeMetadata(starts, [], max_len, slots[:, shared:], mask[:, shared:], slots[0, :shared])
            return TorchNativeMetadata(starts, [], max_len, slots, mask)
        starts, acc = [], 0
        for n in fb.extend_seq_lens_cpu:
            starts.append(acc)
            acc += n
        return TorchNativeMetadata(starts, fb.req_pool_indices.tolist(), max_len)

    @staticmethod
    def _shared_prefix_len(slots: torch.Tensor, limit: int) -> int:
        # Keep the last token of the shortest request out: each request must own a non-empty suffix.
        same = (slots[:, : limit - 1] == slots[:1, : limit - 1]).all(0)
        return int(same.long().cumprod(0).sum()) if same.numel() else 0

    def _metadata(self, fb: "ForwardBatch") -> TorchNativeMetadata:
        if not isinstance(fb.attn_metadata, TorchNativeMetadata):
            self.init_forward_metadata(fb)
        return fb.attn_metadata

    @staticmethod
    def _save_kv(k, v, layer: "RadixAttention", fb: "ForwardBatch", save_kv_cache: bool) -> None:
        if save_kv_cache and k is not None:
            fb.token_to_kv_pool.set_kv_buffer(layer.layer_id, fb.out_cache_loc, k, v)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True) -> torch.Tensor:
        fb = forward_batch
        self._save_kv(k, v, layer, fb, save_kv_cache)
        meta = self._metadata(fb)
        q = q.reshape(-1, layer.num_heads, layer.head_dim)
        out = torch.empty_like(q)
        k_buf = fb.token_to_kv_pool.get_key_buffer(layer.layer_id)
        v_buf = fb.token_to_kv_pool.get_value_buffer(layer.layer_id)
        req_to_token = fb.req_to_token_pool.req_to_token
        gqa = layer.num_heads != layer.num_kv_heads
        trees = fb.tree_masks
        scaling, v_scale = kv_scaling(layer, fb)
        if trees is None and fb.batch_size > 1 and max(fb.extend_seq_lens_cpu) <= self.batched_extend_max:
            return scaled_out(self._extend_padded(q, k_buf, v_buf, layer, fb, meta, scaling), v_scale)
        for i in range(fb.batch_size):
            seq_len = fb.seq_lens_cpu[i]
            ext = fb.extend_seq_lens_cpu[i]
            prefix = fb.extend_prefix_lens_cpu[i]
            if ext == 0:
                continue
            start = meta.extend_start_loc_cpu[i]
            slots = req_to_token[meta.req_pool_indices_cpu[i], :seq_len]
            qi = q[start : start + ext].transpose(0, 1)  # (H, ext, D)
            ki = gather_kv(k_buf, slots).to(q.dtype).transpose(0, 1)  # (Hkv, seq, D)
            vi = gather_kv(v_buf, slots).to(q.dtype).transpose(0, 1)
            tree = trees[i] if trees is not None else None
            if tree is not None:
                mask = torch.ones(ext, seq_len, dtype=torch.bool, device=q.device)
                mask[:, tree.start :] = tree.mask.to(q.device)
                causal = False
            elif prefix == 0:
                mask, causal = None, True
            else:
                # New token j (position prefix + j) sees keys at positions <= prefix + j.
                mask = torch.ones(ext, seq_len, dtype=torch.bool, device=q.device).tril(diagonal=prefix)
                causal = False
            o = F.scaled_dot_product_attention(
                qi, ki, vi, attn_mask=mask, is_causal=causal, scale=scaling, enable_gqa=gqa
            )
            out[start : start + ext] = o.transpose(0, 1)
        return scaled_out(out, v_scale).reshape(-1, layer.num_heads * layer.head_dim)

    @staticmethod
    def _extend_padded(q, k_buf, v_buf, layer, fb: "ForwardBatch", meta: TorchNativeMetadata,
                       scaling: float) -> torch.Tensor:
        """All requests in one call: queries padded to the longest extend, keys to the longest sequence; new
        token j of request i (position prefix_i + j) sees key positions <= prefix_i + j."""
        dev = q.device
        ext = torch.tensor(fb.extend_seq_lens_cpu, device=dev)
        prefix = torch.tensor(fb.extend_prefix_lens_cpu, device=dev)
        starts = torch.tensor(meta.extend_start_loc_cpu, device=dev)
        max_ext, max_len = int(max(fb.extend_seq_lens_cpu)), meta.max_seq_len
        j = torch.arange(max_ext, device=dev)
        q_valid = j[None, :] < ext[:, None]  # (bs, max_ext)
        q_rows = torch.where(q_valid, starts[:, None] + j[None, :], torch.zeros_like(q_valid, dtype=torch.long))
        qs = q[q_rows].transpose(1, 2)  # (bs, H, max_ext, D)
        table = fb.req_to_token_pool.req_to_token[fb.req_pool_indices, :max_len]
        pos = torch.arange(max_len, device=dev)
        k_valid = pos[None, :] < (prefix + ext)[:, None]
        slots = torch.where(k_valid, table, torch.zeros_like(table))
        ks = gather_kv(k_buf, slots).to(q.dtype).transpose(1, 2)  # (bs, Hkv, max_len, D)
        vs = gather_kv(v_buf, slots).to(q.dtype).transpose(1, 2)
        mask = pos[None, None, :] <= (prefix[:, None] + j[None, :])[:, :, None]  # (bs, max_ext, max_len)
        mask |= ~q_valid[:, :, None] & (pos == 0)[None, None, :]  # padded queries see one key: no NaN
        o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask[:, None], scale=scaling,
                                           enable_gqa=layer.num_heads != layer.num_kv_heads)
        out = torch.empty_like(q)
        out[q_rows[q_valid]] = o.transpose(1, 2)[q_valid]
        return out.reshape(-1, layer.num_heads * layer.head_dim)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True) -> torch.Tensor:
        fb = forward_batch
        self._save_kv(k, v, layer, fb, save_kv_cache)
        meta = self._metadata(fb)
        bs = fb.batch_size
        q = q.reshape(bs, layer.num_heads, 1, layer.head_dim)
        if bs == 0:
            return q.reshape(0, layer.num_heads * layer.head_dim)
        k_buf = fb.token_to_kv_pool.get_key_buffer(layer.layer_id)
        v_buf = fb.token_to_kv_pool.get_value_buffer(layer.layer_id)
        scaling, v_scale = kv_scaling(layer, fb)
        if meta.shared_slots is not None:
            return scaled_out(self._decode_with_shared_prefix(q, k_buf, v_buf, layer, meta, scaling), v_scale)
        # (bs, max_len, Hkv, D) -> (bs, Hkv, max_len, D); padded keys are masked out.
        ks = gather_kv(k_buf, meta.decode_slots).to(q.dtype).transpose(1, 2)
        vs = gather_kv(v_buf, meta.decode_slots).to(q.dtype).transpose(1, 2)
        mask = meta.decode_mask[:, None, None, :]
        o = F.scaled_dot_product_attention(
            q, ks, vs, attn_mask=mask, scale=scaling, enable_gqa=layer.num_heads != layer.num_kv_heads
        )
        return scaled_out(o, v_scale).reshape(bs, layer.num_heads * layer.head_dim)

    @staticmethod
    def _decode_with_shared_prefix(q, k_buf, v_buf, layer, meta: TorchNativeMetadata, scaling: float) -> torch.Tensor:
        """One softmax over [shared prefix keys, own keys]: the same attention, with the prefix read once."""
        bs, hkv = q.shape[0], layer.num_kv_heads
        g = layer.num_heads // hkv
        qg = q.reshape(bs, hkv, g, layer.head_dim)
        kp = gather_kv(k_buf, meta.shared_slots).to(q.dtype)  # (P, Hkv, D)
        vp = gather_kv(v_buf, meta.shared_slots).to(q.dtype)
        ks = gather_kv(k_buf, meta.decode_slots).to(q.dtype)  # (bs, L, Hkv, D)
        vs = gather_kv(v_buf, meta.decode_slots).to(q.dtype)
        s_prefix = torch.einsum("bhgd,phd->bhgp", qg, kp)
        s_own = torch.einsum("bhgd,blhd->bhgl", qg, ks).masked_fill(~meta.decode_mask[:, None, None, :], float("-inf"))
        p = torch.cat([s_prefix, s_own], dim=-1).mul_(scaling).softmax(-1)
        n = kp.shape[0]
        o = torch.einsum("bhgp,phd->bhgd", p[..., :n], vp) + torch.einsum("bhgl,blhd->bhgd", p[..., n:], vs)
        return o.reshape(bs, layer.num_heads * layer.head_dim)
