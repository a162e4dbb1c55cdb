"""The host tier of the hierarchical KV cache: a pool of the device pool's tokens, token-major (one row per slot holds
K of every layer, then V: (size + page_size, 2 * layers, num_kv_heads, head_dim), pinned when CUDA is there, so a
token's KV is one contiguous copy and SGLang's page-first layout with pages of one token), with its own page
allocator, and the copies between the two pools.

Copies keep stream order with the device's work, so no pass reads KV before it is in place and no copy reads slots a
later pass rewrites:
- device -> host (a backup) gathers the rows on the current stream into a pinned staging buffer without waiting; the
  rows reach the host pool when that copy has finished (`commit`, run before anything reads or frees host slots). The
  device slots may be freed at once: whatever reuses them runs later on the same stream.
- host -> device (a load back) gathers the rows on the host into a pinned buffer, copies them on a side stream that
  first waits for the work queued so far (the fresh slots may have just been freed by it), and the current stream
  waits for the side stream: the next pass reads them once they are there, and the host never blocks.
On the CPU both are plain indexed copies."""
from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass

import torch

from radixlm.runtime.cache.memory_pool import TokenToKVPool, TokenToKVPoolAllocator

logger = logging.getLogger(__name__)


def _pin(t: torch.Tensor) -> bool:
    """Page-locks t's memory in place (cudaHostRegister: pin_memory's allocator would round a large pool up to a
    power of two). Copies go through pinned staging buffers either way; a pool left pageable only costs a memcpy."""
    try:
        err = torch.cuda.cudart().cudaHostRegister(t.data_ptr(), t.numel() * t.element_size(), 0)
        ok = int(getattr(err, "value", err)) == 0
    except (AttributeError, RuntimeError, TypeError) as e:
        ok, err = False, e
    if not ok:
        logger.warning("hierarchical cache: the host pool could not be pinned (%s); it stays pageable", err)
    return ok


def _raw(t: torch.Tensor) -> torch.Tensor:
    """Bytes-compatible view for indexing (torch's index kernels do not take every float8 dtype)."""
    return t.view(torch.uint8) if t.element_size() == 1 and t.is_floating_point() else t


@dataclass
class _PendingWrite:
    event: "torch.cuda.Event"
    staging: torch.Tensor  # (n, 2 * layers, heads, dim) pinned
    host_slots: torch.Tensor


class HostKVPool:
    """K and V of `size` tokens in host memory, token-major, with a page allocator over [page_size, size + page_size)
    (the first page is never handed out, as on the device). Rows read and written: (n, 2 * layers, heads, dim), K of
    every layer then V, in the pool's dtype (a float8 pool's as bytes where they come from read)."""

    def __init__(self, size: int, device_pool: TokenToKVPool):
        ps = device_pool.page_size
        if size < 2 * ps or size % ps:
            raise ValueError(f"host KV pool of {size} tokens: need a multiple of page_size {ps}, at least two pages")
        self.size = size
        self.page_size = ps
        self.dtype = device_pool.dtype
        self.num_layers = device_pool.num_layers
        self.device_pool = device_pool
        shape = (size + ps, 2 * device_pool.num_layers, device_pool.num_kv_heads, device_pool.head_dim)
        self.kv = torch.zeros(shape, dtype=self.dtype)
        self.pinned = device_pool.device.type == "cuda" and _pin(self.kv)
        if self.pinned:  # unlocked before the memory goes back
            weakref.finalize(self, torch.cuda.cudart().cudaHostUnregister, self.kv.data_ptr())
        self.allocator = TokenToKVPoolAllocator(size, ps, "cpu")
        self._pending: list[_PendingWrite] = []
        self._side_stream = torch.cuda.Stream(device_pool.device) if device_pool.device.type == "cuda" else None

    @staticmethod
    def bytes_per_token(device_pool: TokenToKVPool) -> int:
        return 2 * device_pool.num_layers * device_pool.num_kv_heads * device_pool.head_dim * \
            torch.empty((), dtype=device_pool.dtype).element_size()

    def mem_bytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()

    def clear(self) -> None:
        self.commit()
        self.allocator.clear()

    def _device_buffers(self) -> list[torch.Tensor]:
        dev = self.device_pool
        return [_raw(b) for b in dev.k_buffer + dev.v_buffer]

    # ------------------------------------------------------------------ rows (storage pages use them too)
    def read(self, slots: torch.Tensor, pinned: bool = False) -> torch.Tensor:
        """The rows of the host slots (pinned: in pinned memory, for a copy to the device)."""
        idx = slots.to(torch.int64)
        self.poll()
        if any(bool(torch.isin(w.host_slots, idx).any()) for w in self._pending):
            self.commit()
        kv = _raw(self.kv)
        out = torch.empty((len(idx), *kv.shape[1:]), dtype=kv.dtype, pin_memory=pinned)
        return torch.index_select(kv, 0, idx, out=out)

    def write(self, slots: torch.Tensor, rows: torch.Tensor) -> None:
        """Inverse of read. Backups in flight land first: one may target slots freed and handed out again since."""
        self.commit()
        self._scatter(slots, rows)

    def _scatter(self, slots: torch.Tensor, rows: torch.Tensor) -> None:
        _raw(self.kv)[slots.to(torch.int64)] = _raw(rows)

    # ------------------------------------------------------------------ copies between the tiers
    def gather_device(self, device_slots: torch.Tensor) -> torch.Tensor:
        """The device slots' rows, on the device (stream order)."""
        idx = device_slots.to(self.device_pool.device, torch.int64)
        return torch.stack([b[idx] for b in self._device_buffers()], dim=1)

    def backup(self, device_slots: torch.Tensor, host_slots: torch.Tensor) -> None:
        """Copies the device slots' K and V into the host slots (see the module docstring for the order)."""
        rows = self.gather_device(device_slots)
        if self._side_stream is None:
            self._scatter(host_slots, rows)
            return
        staging = torch.empty(rows.shape, dtype=rows.dtype, pin_memory=True)
        staging.copy_(rows, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self._pending.append(_PendingWrite(event, staging, host_slots))

    def commit(self) -> None:
        """Lands every backup still in flight in the host pool (waits for the device where it must)."""
        pending, self._pending = self._pending, []
        for w in pending:
            w.event.synchronize()
            self._scatter(w.host_slots, w.staging)

    def poll(self) -> None:
        """Lands the backups the device has finished, in order, without waiting."""
        while self._pending and self._pending[0].event.query():
            w = self._pending.pop(0)
            self._scatter(w.host_slots, w.staging)

    def load(self, host_slots: torch.Tensor, device_slots: torch.Tensor) -> None:
        """Copies the host slots' K and V into the device slots, ordered before the next pass."""
        staging = self.read(host_slots, pinned=self._side_stream is not None)
        bufs = self._device_buffers()
        if self._side_stream is None:
            idx = device_slots.to(torch.int64)
            for i, b in enumerate(bufs):
                b[idx] = staging[:, i]
            return
        dev = self.device_pool.device
        main = torch.cuda.current_stream(dev)
        side = self._side_stream
        side.wait_stream(main)
        with torch.cuda.stream(side):
            idx = device_slots.to(dev, torch.int64, non_blocking=True)
            on_device = staging.to(dev, non_blocking=True)
            for i, b in enumerate(bufs):
                b[idx] = on_device[:, i]
        main.wait_stream(side)
