"""The two-level KV memory: request rows -> token slots (ReqToTokenPool) and slots -> KV (a kv_pool.KVPool:
TokenToKVPool's K and V, or MLATokenToKVPool's latent), with TokenToKVPoolAllocator handing out the slots page by
page whatever the pool stores."""
from __future__ import annotations

import torch

from radixlm.runtime.cache.kv_pool import KVLayout, KVLayoutKind, KVPool, MLATokenToKVPool
from radixlm.runtime.cache.kv_quant import KVScales
from radixlm.runtime.cache.zeroed import zeros
from radixlm.runtime.host_to_device import host_to_device


class ReqToTokenPool:
    """One row per running request; row[p] is the KV slot of the token at position p."""

    def __init__(self, size: int, max_context_len: int, device: str | torch.device = "cpu"):
        self.size = size
        self.max_context_len = max_context_len
        self.device = torch.device(device)
        self.req_to_token = zeros((size, max_context_len), torch.int64, self.device)
        self.clear()

    def clear(self) -> None:
        self.free_slots: list[int] = list(range(self.size))
        self._is_free = [True] * self.size

    def available_size(self) -> int:
        return len(self.free_slots)

    def alloc(self) -> int | None:
        if not self.free_slots:
            return None
        idx = self.free_slots.pop(0)
        self._is_free[idx] = False
        return idx

    def flat_index(self, spans: list[tuple[int, int, int]]) -> torch.Tensor:
        """The entries req_to_token[row, start:end] of each (row, start, end), in order, as positions in
        req_to_token.view(-1) on its device: one index copy, where a (rows, columns) pair would take more device
        operations."""
        width = self.req_to_token.stride(0)
        flat = [row * width + c for row, start, end in spans for c in range(start, end)]
        return host_to_device(flat, torch.int64, self.device)

    def free(self, idx: int) -> None:
        if self._is_free[idx]:
            raise RuntimeError(f"ReqToTokenPool: double free of row {idx}")
        self._is_free[idx] = True
        self.free_slots.append(idx)


class TokenToKVPool(KVPool):
    """Per-layer K and V buffers of shape (size + page_size, num_kv_heads, head_dim) (kv_pool.KVPool).

    A float8 pool (--kv-cache-dtype fp8_e4m3 / fp8_e5m2; kv_quant.py) stores k / k_scale and v / v_scale of each
    layer's scales, saturated; every reader multiplies back (kv_scales). Other pools ignore the scales."""

    buffer_names = ("k_buffer", "v_buffer")

    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        device: str | torch.device = "cpu",
        scales: list[KVScales] | None = None,
    ):
        if scales is not None and len(scales) != num_layers:
            raise ValueError(f"{len(scales)} KV scales for {num_layers} layers")
        super().__init__(KVLayout.mha(num_layers, dtype, num_kv_heads, head_dim), size, page_size, device)
        self._scales = [s if self.is_fp8 else KVScales() for s in (scales or [KVScales()] * num_layers)]
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim

    def kv_scales(self, layer_id: int) -> KVScales:
        """What layer_id's stored K and V are multiplied by when read (1.0 unless the pool is float8)."""
        return self._scales[layer_id]

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.k_buffer[layer_id]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self.v_buffer[layer_id]

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k_buffer[layer_id], self.v_buffer[layer_id]

    @staticmethod
    def _stores_rows(k: torch.Tensor, v: torch.Tensor) -> bool:
        """Whether one kernel launch stores these k and v rows (CUDA, (n, num_kv_heads * head_dim), any row stride)."""
        return k.is_cuda and k.dim() == 2 and k.stride(1) == 1 and v.stride(1) == 1

    def set_rotated_kv_buffer(self, layer_id: int, loc: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                              v: torch.Tensor, rope, positions: torch.Tensor) -> bool:
        """rope's rotation of q and k (in place) and the store of the rotated k and of v, in one launch; False, with
        nothing done, where that kernel does not apply (the caller rotates, then calls set_kv_buffer)."""
        if not (self._stores_rows(k, v) and rope.fused(positions, q)):
            return False
        rope.rotate_and_store_(positions, q, k, v, loc, self.k_buffer[layer_id], self.v_buffer[layer_id],
                               self._scales[layer_id])
        return True

    def set_kv_buffer(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v: (n, num_kv_heads, head_dim) or (n, num_kv_heads * head_dim); loc: (n,) slot indices."""
        if self._stores_rows(k, v):
            from radixlm.runtime.kernels.elementwise import store_kv

            store_kv(k, v, loc, self.k_buffer[layer_id], self.v_buffer[layer_id], self._scales[layer_id])
            return
        shape = (-1, self.num_kv_heads, self.head_dim)
        scales = self._scales[layer_id]
        self._store(self.k_buffer[layer_id], loc, k.reshape(shape), scales.k_scale)
        self._store(self.v_buffer[layer_id], loc, v.reshape(shape), scales.v_scale)


def make_kv_pool(layout: KVLayout, size: int, page_size: int, device: str | torch.device = "cpu",
                 scales: list[KVScales] | None = None) -> KVPool:
    """The pool of `layout` (scales: an MHA pool's per-layer float8 scales; an MLA pool takes none)."""
    if layout.kind is KVLayoutKind.MLA:
        if scales is not None and any(s != KVScales() for s in scales):
            raise ValueError("an MLA KV pool takes no K/V scales (the checkpoint's k_scale / v_scale)")
        return MLATokenToKVPool(size, page_size, layout.dtype, layout.num_layers, layout.kv_lora_rank,
                                layout.qk_rope_head_dim, device)
    return TokenToKVPool(size, page_size, layout.dtype, layout.num_layers, layout.num_kv_heads, layout.head_dim,
                         device, scales)


class TokenToKVPoolAllocator:
    """Hands out KV slots in [page_size, size + page_size), a whole page at a time.

    INVARIANT: the token at position p of a sequence lives at a slot s with s % page_size == p % page_size,
    and the tokens of one page are contiguous slots of that page. A page is owned whole, by exactly one
    owner (the radix tree or one request), so freeing any slot of a page frees the entire page.
    Page k covers slots [k * page_size, (k + 1) * page_size); page 0 is the reserved dummy page."""

    def __init__(self, size: int, page_size: int = 1, device: str | torch.device = "cpu", debug: bool = True):
        if size % page_size != 0:
            raise ValueError(f"size {size} must be a multiple of page_size {page_size}")
        self.size = size
        self.page_size = page_size
        self.num_pages = size // page_size
        self.device = torch.device(device)
        # The double-free check reads page_is_free back to the host (a sync on CUDA); debug=False skips it, and
        # then frees are only queued (no device work) and merged into the free list when an allocation needs them.
        self.debug = debug
        self.clear()

    def clear(self) -> None:
        self._free_pages = torch.arange(1, self.num_pages + 1, dtype=torch.int64, device=self.device)
        self._page_is_free = torch.ones(self.num_pages + 1, dtype=torch.bool, device=self.device)
        self._page_is_free[0] = False
        self._pending: list[torch.Tensor] = []
        self._pending_pages = 0

    def _merge_pending(self) -> None:
        if self._pending:
            pages = torch.cat(self._pending)
            self._pending, self._pending_pages = [], 0
            self._page_is_free.index_fill_(0, pages, True)
            self._free_pages = torch.cat([self._free_pages, pages])

    @property
    def free_pages(self) -> torch.Tensor:
        self._merge_pending()
        return self._free_pages

    @property
    def page_is_free(self) -> torch.Tensor:
        self._merge_pending()
        return self._page_is_free

    def available_size(self) -> int:
        return (int(self._free_pages.numel()) + self._pending_pages) * self.page_size

    def _take_pages(self, num_pages: int) -> torch.Tensor | None:
        if num_pages > self._free_pages.numel():
            self._merge_pending()
            if num_pages > self._free_pages.numel():
                return None
        pages = self._free_pages[:num_pages]
        self._free_pages = self._free_pages[num_pages:]
        # index_fill_, not `[pages] = False`: assigning a Python scalar on CUDA waits for the device.
        self._page_is_free.index_fill_(0, pages, False)
        return pages

    def _pages_to_slots(self, pages: torch.Tensor) -> torch.Tensor:
        if self.page_size == 1:
            return pages  # a page is a slot (no device work)
        offsets = torch.arange(self.page_size, dtype=torch.int64, device=self.device)
        return (pages[:, None] * self.page_size + offsets).reshape(-1)

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """need_size fresh slots (whole pages, in page order); None if not enough are free."""
        if need_size % self.page_size != 0:
            raise ValueError(f"alloc({need_size}) must be a multiple of page_size {self.page_size}")
        pages = self._take_pages(need_size // self.page_size)
        return None if pages is None else self._pages_to_slots(pages)

    def alloc_extend(
        self, prefix_lens: list[int], seq_lens: list[int], last_locs: list[int]
    ) -> torch.Tensor | None:
        """Slots for positions [prefix_lens[i], seq_lens[i]) of each request, concatenated in request order.

        A request first fills the rest of its partially used last page (last_locs[i] = slot of position
        prefix_lens[i] - 1, or -1 when prefix_lens[i] == 0), then takes fresh pages. All or nothing: None
        and no allocation when there are not enough free pages. Decode is prefix_len = seq_len - 1."""
        ps = self.page_size
        if ps == 1:
            return self.alloc(sum(s - p for p, s in zip(prefix_lens, seq_lens)))
        # Per request: tokens continuing the last page, then tokens on fresh pages.
        cont_lens, fresh_starts, page_counts = [], [], []
        for p, s, last in zip(prefix_lens, seq_lens, last_locs):
            aligned_start = -(-p // ps) * ps
            if p % ps != 0 and (last < 0 or last % ps != (p - 1) % ps):
                raise ValueError(f"last_loc {last} does not hold position {p - 1} (page_size {ps})")
            cont_lens.append(max(min(s, aligned_start) - p, 0))
            fresh_starts.append(max(aligned_start, p))
            page_counts.append(-(-max(s - aligned_start, 0) // ps))
        pages = self._take_pages(sum(page_counts))
        if pages is None:
            return None
        parts: list[torch.Tensor] = []
        page_off = 0
        for i, (p, s) in enumerate(zip(prefix_lens, seq_lens)):
            if cont_lens[i]:
                parts.append(torch.arange(1, cont_lens[i] + 1, dtype=torch.int64, device=self.device) + last_locs[i])
            n_fresh = s - fresh_starts[i]
            if n_fresh > 0:
                own = pages[page_off : page_off + page_counts[i]]
                parts.append(self._pages_to_slots(own)[:n_fresh])
            page_off += page_counts[i]
        if not parts:
            return torch.empty((0,), dtype=torch.int64, device=self.device)
        return torch.cat(parts)

    def free(self, indices: torch.Tensor) -> None:
        """Frees the slots (page_size 1) or the distinct pages the slots belong to (page_size > 1).

        Callers free only pages they own whole; a page freed twice, or the dummy page, raises (debug)."""
        if indices.numel() == 0:
            return
        indices = indices.to(self.device, torch.int64)
        pages = indices if self.page_size == 1 else torch.unique(indices // self.page_size)
        if self.debug:
            if self.page_size == 1 and torch.unique(pages).numel() != pages.numel():
                raise RuntimeError("TokenToKVPoolAllocator: slot freed twice in one call")
            if bool((pages <= 0).any()) or bool((pages > self.num_pages).any()):
                raise RuntimeError("TokenToKVPoolAllocator: freeing a slot outside the pool or the dummy page")
            if bool(self.page_is_free[pages].any()):
                raise RuntimeError("TokenToKVPoolAllocator: double free")
        self._pending.append(pages)
        self._pending_pages += int(pages.numel())
        if self.debug:
            self._merge_pending()

    def check_no_double_free(self) -> None:
        """Full check (O(pool)): the free list has no duplicates and agrees with page_is_free."""
        fp = self.free_pages
        assert torch.unique(fp).numel() == fp.numel(), "free list holds a page twice"
        mask = torch.zeros_like(self.page_is_free)
        mask[fp] = True
        assert torch.equal(mask, self.page_is_free), "free list and page_is_free disagree"
