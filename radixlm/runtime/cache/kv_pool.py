"""What every KV pool shares, whatever it stores per token: its layout (KVLayout, known before the pool exists, so
the memory budget can size it), its per-layer buffers of (size + page_size, *row) slots, release and resume, slot
moves and byte counts. Two layouts:

  MHA: a K and a V buffer per layer, rows (num_kv_heads, head_dim) each (memory_pool.TokenToKVPool).
  MLA: one buffer per layer, rows (1, kv_lora_rank + qk_rope_head_dim): the normalized compressed latent c_kv, then
       the rotated shared rope key k_pe (MLATokenToKVPool here; SGLang's layout, which the MLA kernels read).

Slots are handed out by memory_pool.TokenToKVPoolAllocator whatever the layout: paging, accounting, eviction and
retraction do not know what a slot holds."""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import torch

from radixlm.runtime.cache.kv_quant import KVScales, is_fp8, quantize_kv
from radixlm.runtime.cache.zeroed import zeros

# Each buffer of a pool starts on a boundary of this many bytes (the CUDA caching allocator's block alignment).
BUFFER_ALIGN = 512


class KVLayoutKind(enum.Enum):
    MHA = "mha"
    MLA = "mla"


@dataclass(frozen=True)
class KVLayout:
    """One token's KV in one layer, per buffer; num_kv_heads / head_dim are this rank's (MLA: 1 and rank + rope)."""

    kind: KVLayoutKind
    num_layers: int
    dtype: torch.dtype
    num_kv_heads: int
    head_dim: int
    kv_lora_rank: int = 0  # MLA only
    qk_rope_head_dim: int = 0  # MLA only

    def __post_init__(self) -> None:
        if self.num_layers < 0 or self.num_kv_heads < 1 or self.head_dim < 1:
            raise ValueError(f"a KV layout needs num_layers >= 0, num_kv_heads >= 1 and head_dim >= 1; got {self}")
        if self.kind is KVLayoutKind.MLA:
            if self.kv_lora_rank < 1 or self.qk_rope_head_dim < 1:
                raise ValueError(f"an MLA layout needs kv_lora_rank >= 1 and qk_rope_head_dim >= 1; got {self}")
            if (self.num_kv_heads, self.head_dim) != (1, self.kv_lora_rank + self.qk_rope_head_dim):
                raise ValueError(f"an MLA layout's row is (1, kv_lora_rank + qk_rope_head_dim); got {self}")

    @classmethod
    def mha(cls, num_layers: int, dtype: torch.dtype, num_kv_heads: int, head_dim: int) -> "KVLayout":
        return cls(KVLayoutKind.MHA, num_layers, dtype, num_kv_heads, head_dim)

    @classmethod
    def mla(cls, num_layers: int, dtype: torch.dtype, kv_lora_rank: int, qk_rope_head_dim: int) -> "KVLayout":
        return cls(KVLayoutKind.MLA, num_layers, dtype, 1, kv_lora_rank + qk_rope_head_dim, kv_lora_rank,
                   qk_rope_head_dim)

    @property
    def buffers_per_layer(self) -> int:
        return 2 if self.kind is KVLayoutKind.MHA else 1

    @property
    def row_shape(self) -> tuple[int, int]:
        return self.num_kv_heads, self.head_dim

    @property
    def bytes_per_token(self) -> int:
        """Over all layers: MHA 2 x heads x head_dim, MLA (kv_lora_rank + qk_rope_head_dim), times the dtype's bytes."""
        return self.num_layers * self.buffers_per_layer * math.prod(self.row_shape) * self.dtype.itemsize

    def describe(self) -> dict:
        """As /server_info reports it."""
        out = {"layout": self.kind.value, "dtype": str(self.dtype).removeprefix("torch."),
               "num_layers": self.num_layers, "buffers_per_layer": self.buffers_per_layer,
               "row_shape": list(self.row_shape), "bytes_per_token": self.bytes_per_token}
        if self.kind is KVLayoutKind.MLA:
            out.update(kv_lora_rank=self.kv_lora_rank, qk_rope_head_dim=self.qk_rope_head_dim)
        return out


class KVPool:
    """Per-layer buffers of shape (size + page_size, *layout.row_shape), named by `buffer_names` (one list of
    num_layers tensors per name). Slots [0, page_size) form a dummy page that is never handed out: padded tokens may
    write there."""

    buffer_names: tuple[str, ...] = ()

    def __init__(self, layout: KVLayout, size: int, page_size: int, device: str | torch.device = "cpu"):
        if len(self.buffer_names) != layout.buffers_per_layer:
            raise ValueError(f"{type(self).__name__} holds {len(self.buffer_names)} buffers per layer; the layout "
                             f"has {layout.buffers_per_layer}")
        if size < 0 or page_size < 1:
            raise ValueError(f"a KV pool needs size >= 0 and page_size >= 1; got {size}, {page_size}")
        self.layout = layout
        self.size = size
        self.page_size = page_size
        self.dtype = layout.dtype
        self.is_fp8 = is_fp8(layout.dtype)
        self.num_layers = layout.num_layers
        self.device = torch.device(device)
        self._allocate()

    def _allocate(self) -> None:
        # One allocation, each buffer a view of it starting on a BUFFER_ALIGN-byte boundary (as its own allocation
        # would): copies that touch every buffer (the hierarchical cache's) index them all in one op (`stacked`).
        rows, row_numel = self.size + self.page_size, math.prod(self.layout.row_shape)
        per_elem = self.dtype.itemsize
        numel = rows * row_numel
        stride = -(-numel * per_elem // BUFFER_ALIGN) * BUFFER_ALIGN // per_elem
        count = len(self.buffer_names) * self.num_layers
        flat = zeros((count, stride), self.dtype, self.device)
        self._stacked = flat[:, :numel].view(count, rows, *self.layout.row_shape)
        views = self._stacked.unbind(0)
        for i, name in enumerate(self.buffer_names):
            setattr(self, name, list(views[i * self.num_layers : (i + 1) * self.num_layers]))

    def buffers(self) -> list[torch.Tensor]:
        """Every per-layer buffer, buffer name by buffer name."""
        return [buf for name in self.buffer_names for buf in getattr(self, name)]

    def stacked(self) -> torch.Tensor:
        """Every buffer as one (buffers, size + page_size, *row) view, in `buffers()` order (its first stride is a
        buffer's padded size): an op over it reaches every layer's rows at once."""
        bufs = self.buffers()
        stack = self._stacked
        if len(bufs) != stack.shape[0] or (bufs and (bufs[0].data_ptr() != stack.data_ptr() or
                                                     bufs[-1].data_ptr() != stack[-1].data_ptr())):
            raise RuntimeError("the KV pool's buffers are no longer views of its one allocation")
        return stack

    @property
    def released(self) -> bool:
        return self.num_layers > 0 and self.buffers()[0].numel() == 0

    def release(self) -> None:
        """Frees every layer's buffers (/release_memory_occupation); what they held is lost."""
        empty = torch.empty(0, dtype=self.dtype, device=self.device)
        for name in self.buffer_names:
            setattr(self, name, [empty] * self.num_layers)
        self._stacked = torch.empty((0, 0, *self.layout.row_shape), dtype=self.dtype, device=self.device)

    def resume(self) -> None:
        """Allocates the buffers again, zeroed (new addresses: graphs over them are captured again)."""
        self._allocate()

    def kv_scales(self, layer_id: int) -> KVScales:
        """What layer_id's stored values are multiplied by when read (1.0 unless a float8 pool says otherwise)."""
        return KVScales()

    def move_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copies every layer's rows at slots `src` to slots `dst`; all sources are read before any destination is
        written. Float8 rows move as bytes (torch's index kernels do not take every float8 dtype on every device)."""
        for buf in self.buffers():
            raw = buf.view(torch.uint8) if buf.element_size() == 1 else buf
            raw[dst] = raw[src]

    def mem_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.buffers())

    def _store(self, buf: torch.Tensor, loc: torch.Tensor, rows: torch.Tensor, scale: float) -> None:
        stored = quantize_kv(rows, scale, self.dtype)
        if self.is_fp8:  # as bytes: torch's index kernels do not take every float8 dtype on every device
            buf.view(torch.uint8)[loc] = stored.view(torch.uint8)
        else:
            buf[loc] = stored


class MLATokenToKVPool(KVPool):
    """MLA's latent cache: per layer kv_buffer[layer] of shape (size + page_size, 1, kv_lora_rank +
    qk_rope_head_dim); a row is [c_kv (kv_lora_rank) | k_pe (qk_rope_head_dim)], c_kv after kv_a_layernorm and k_pe
    after its rotary embedding. Float8 pools store the values saturated (scale 1.0)."""

    buffer_names = ("kv_buffer",)

    def __init__(self, size: int, page_size: int, dtype: torch.dtype, num_layers: int, kv_lora_rank: int,
                 qk_rope_head_dim: int, device: str | torch.device = "cpu"):
        super().__init__(KVLayout.mla(num_layers, dtype, kv_lora_rank, qk_rope_head_dim), size, page_size, device)
        self.kv_lora_rank = kv_lora_rank
        self.qk_rope_head_dim = qk_rope_head_dim

    def get_latent_buffer(self, layer_id: int) -> torch.Tensor:
        return self.kv_buffer[layer_id]

    def set_mla_kv_buffer(self, layer_id: int, loc: torch.Tensor, c_kv: torch.Tensor, k_pe: torch.Tensor) -> None:
        """c_kv: (n, kv_lora_rank), k_pe: (n, qk_rope_head_dim) (or with a head axis of 1); loc: (n,) slots."""
        n = loc.shape[0]
        c_kv, k_pe = c_kv.reshape(n, -1), k_pe.reshape(n, -1)
        if c_kv.shape[1] != self.kv_lora_rank or k_pe.shape[1] != self.qk_rope_head_dim:
            raise ValueError(f"latent rows of widths {c_kv.shape[1]} + {k_pe.shape[1]}; the pool holds "
                             f"{self.kv_lora_rank} + {self.qk_rope_head_dim}")
        rows = torch.cat([c_kv, k_pe.to(c_kv.dtype)], dim=-1).unsqueeze(1)
        self._store(self.kv_buffer[layer_id], loc, rows, 1.0)
