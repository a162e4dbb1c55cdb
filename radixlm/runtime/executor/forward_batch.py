"""One forward pass: its rows on the host as the scheduler plans them (ModelWorkerBatch), and the tensors models
and attention backends read (ForwardBatch), in the layout the executor chooses. Nothing here knows about requests
or the radix tree."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from radixlm.runtime.cache.kv_pool import KVPool
    from radixlm.runtime.cache.layer_load import LayerLoadWaiter
    from radixlm.runtime.cache.memory_pool import ReqToTokenPool
    from radixlm.runtime.executor.logits import LogitsPlan
    from radixlm.runtime.layers.attention.base import AttentionBackend
    from radixlm.runtime.lora.ops import LoraBatchInfo
    from radixlm.runtime.lora.slots import LoraBatch
    from radixlm.runtime.multimodal.inputs import MultimodalSpan


from radixlm.runtime.host_to_device import rows_to_device

# ModelWorkerBatch.input_ids: the token was sampled by a pass whose result the host has not read yet (overlap).
IN_FLIGHT = -1


@dataclass(frozen=True)
class TreeMask:
    """Attention of one request's rows in a pass (REQUEST_SPANS): every row sees the request's KV at table indices
    below `start`; at indices [start, seq_len) row j sees index start + c where mask[j, c]. Replaces the causal rule
    for that request; the rows' own KV is written at their table indices as usual (tree drafts: spec/tree.py)."""

    start: int
    mask: torch.Tensor  # (rows, seq_len - start) bool


class ForwardMode(enum.IntEnum):
    """The attention layout of a pass (chosen by the ModelRunner). Both compute the same thing for any rows."""

    REQUEST_SPANS = 1  # each request's rows as one span after its cached prefix (ragged extend kernels)
    TOKEN_ROWS = 2  # one row per token, attending to its request's KV up to its own position (decode kernels)
    IDLE = 3  # nothing to run

    def is_request_spans(self) -> bool:
        return self == ForwardMode.REQUEST_SPANS

    def is_token_rows(self) -> bool:
        return self == ForwardMode.TOKEN_ROWS


@dataclass
class ModelWorkerBatch:
    """A pass's rows on the host, set by the scheduler's planner; read by the ModelRunner. A row is one token;
    each request's rows are consecutive, requests in order."""

    input_ids: list[int]  # per row; IN_FLIGHT where the token is on the device (token_buf[its req_to_token row])
    positions: list[int]  # per row
    req_pool_indices: list[int]  # per request
    prefix_lens: list[int]  # per request: the position of its first row
    extend_lens: list[int]  # per request: its rows
    seq_lens: list[int]  # per request: prefix + rows
    out_cache_loc: torch.Tensor  # per row: the KV slot its token is written to
    logits: "LogitsPlan"
    has_in_flight: bool = False  # some row is IN_FLIGHT
    token_buf: torch.Tensor | None = None  # the last token sampled for each req_to_token row, on the device
    mm_spans: list["MultimodalSpan"] = field(default_factory=list)  # rows that take an item's encoder output
    mrope_positions: list[list[int]] | None = None  # per row, three positions (Qwen2-VL), when a request has them
    rope_offsets: list[int] | None = None  # per row, added to its position for the rotary only (see ForwardBatch)
    # Per request, where its rows attend otherwise than causally (tree drafts, spec/tree.py), else None;
    # such a pass runs in REQUEST_SPANS on a backend that supports_tree_mask.
    tree_masks: list[TreeMask | None] | None = None
    # Decode passes (one row per request): (prefix_len, request indices) per group of requests whose
    # req_to_token rows hold the same slots over [0, prefix_len) (scheduler/shared_prefix.py), else None.
    shared_prefixes: list[tuple[int, list[int]]] | None = None
    # Under --enable-lora: each request's adapter slot and the adapters to swap in first (lora/slots.py).
    lora: "LoraBatch | None" = None
    token_type_ids: list[int] | None = None  # per row, when a request has them (an encoder's sentence pairs)
    # KV loaded back into the pool (a hierarchical cache's host hits) still arriving layer by layer, else None.
    layer_loads: "LayerLoadWaiter | None" = None

    @property
    def num_rows(self) -> int:
        return len(self.input_ids)


@dataclass
class ForwardBatch:
    """Set by ForwardBatch.build (executor); read-only for everything below.

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
    token_to_kv_pool: "KVPool"
    attn_backend: "AttentionBackend"
    # Extend only (for decode: prefix = seq_len - 1, extend = 1).
    extend_prefix_lens_cpu: list[int] = field(default_factory=list)
    extend_seq_lens_cpu: list[int] = field(default_factory=list)
    extend_start_loc: torch.Tensor | None = None  # (bs,) int64 exclusive cumsum of extend_seq_lens
    # TOKEN_ROWS (when built from a ModelWorkerBatch): (4, bs) int64 whose rows are input_ids, positions,
    # req_pool_indices and seq_lens (those four are its views): a CUDA-graph replay takes them in one copy.
    decode_rows: torch.Tensor | None = None
    # Rows that take an encoder's output instead of a token embedding, and the embeddings of all rows when there are
    # any (set by the ModelRunner before the model runs).
    mm_spans: list["MultimodalSpan"] = field(default_factory=list)
    input_embeds: torch.Tensor | None = None
    mrope_positions: torch.Tensor | None = None  # (3, num_tokens) int64: multimodal rotary positions (Qwen2-VL)
    # (num_tokens,) int64: Qwen2-VL rows past their prompt, whose three positions are equal: M-RoPE there is RoPE at
    # position + offset (the request's delta). Kept apart from `positions`, which also gives the sequence lengths.
    # In TOKEN_ROWS it is the fifth row of decode_rows, so a CUDA graph takes it as one more input.
    rope_offsets: torch.Tensor | None = None
    tree_masks: list[TreeMask | None] | None = None  # ModelWorkerBatch.tree_masks
    # ModelWorkerBatch.shared_prefixes in TOKEN_ROWS passes of one row per request (batch rows = requests).
    shared_prefixes: list[tuple[int, list[int]]] | None = None
    # Under --enable-lora: the rows' adapter slots (set by the ModelRunner from ModelWorkerBatch.lora).
    lora: "LoraBatchInfo | None" = None
    token_type_ids: torch.Tensor | None = None  # (num_tokens,) int64, ModelWorkerBatch.token_type_ids
    # ModelWorkerBatch.layer_loads: an attention layer waits for its layer's (layer_load.wait_layer) before it stores
    # or reads that layer's KV.
    layer_loads: "LayerLoadWaiter | None" = None
    # Set by the attention backend in init_forward_metadata; opaque to everyone else.
    attn_metadata: object = None
    # Set by layers.attention.mla.latent_attention on the pass's first MLA layer, read by the later ones.
    latent_attn_metadata: object = None

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @classmethod
    def build(cls, wb: ModelWorkerBatch, mode: ForwardMode, req_to_token_pool: "ReqToTokenPool",
              token_to_kv_pool: "KVPool", attn_backend: "AttentionBackend", device: str) -> "ForwardBatch":
        """The device tensors of a pass in `mode`, in as few host-to-device copies as the layout allows."""
        pool_rows, seq_rows = wb.req_pool_indices, wb.seq_lens
        token_rows = mode.is_token_rows()
        if token_rows and wb.num_rows > len(pool_rows):  # a request with several rows: a row per token
            pool_rows = [i for i, e in zip(pool_rows, wb.extend_lens) for _ in range(e)]
            seq_rows = [pos + 1 for pos in wb.positions]
        decode_rows = extend_start_loc = rope_offsets = None
        offsets = [] if wb.rope_offsets is None else [wb.rope_offsets]
        if token_rows:  # the four (five) vectors in one copy (and one graph input copy)
            decode_rows = rows_to_device([wb.input_ids, wb.positions, pool_rows, seq_rows, *offsets], device)
            input_ids, positions, req_pool_indices, seq_lens = decode_rows[:4]
            rope_offsets = decode_rows[4] if offsets else None
        else:
            extend_start = [0]
            for e in wb.extend_lens[:-1]:
                extend_start.append(extend_start[-1] + e)
            per_row = rows_to_device([pool_rows, seq_rows, extend_start], device)
            per_token = rows_to_device([wb.input_ids, wb.positions, *offsets], device)
            input_ids, positions, req_pool_indices, seq_lens = per_token[0], per_token[1], per_row[0], per_row[1]
            rope_offsets = per_token[2] if offsets else None
            extend_start_loc = per_row[2]
        if wb.has_in_flight and wb.token_buf is not None:
            token_pool_rows = req_pool_indices if token_rows else torch.repeat_interleave(
                req_pool_indices, rows_to_device([wb.extend_lens], device)[0])
            # In place: in TOKEN_ROWS, input_ids stays a row of decode_rows.
            torch.where(input_ids >= 0, input_ids, wb.token_buf[token_pool_rows], out=input_ids)
        return cls(
            forward_mode=mode,
            batch_size=len(pool_rows),
            input_ids=input_ids,
            positions=positions,
            req_pool_indices=req_pool_indices,
            seq_lens=seq_lens,
            seq_lens_cpu=list(seq_rows),
            out_cache_loc=wb.out_cache_loc.to(device),
            req_to_token_pool=req_to_token_pool,
            token_to_kv_pool=token_to_kv_pool,
            attn_backend=attn_backend,
            extend_prefix_lens_cpu=list(wb.prefix_lens),
            extend_seq_lens_cpu=list(wb.extend_lens),
            extend_start_loc=extend_start_loc,
            decode_rows=decode_rows,
            mm_spans=wb.mm_spans,
            mrope_positions=None if wb.mrope_positions is None else rows_to_device(wb.mrope_positions, device),
            rope_offsets=rope_offsets,
            tree_masks=wb.tree_masks,
            shared_prefixes=wb.shared_prefixes if token_rows and len(pool_rows) == len(wb.req_pool_indices) else None,
            token_type_ids=None if wb.token_type_ids is None else rows_to_device([wb.token_type_ids], device)[0],
            layer_loads=wb.layer_loads,
        )
