"""The host tier of the hierarchical KV cache: a pool of the device pool's tokens, token-major (one row per slot holds
every per-layer buffer's row of that token: (size + page_size, buffers, *row_shape), buffers = the device pool's
`buffers()` in order: MHA's K of every layer then V, MLA's latent of every layer), pinned in place when CUDA is there,
so a run of consecutive host slots is one contiguous block and one DMA copy (SGLang's page-first layout); its own page
allocator; and the copies between the two pools.

Copies go straight between the pinned pool and the device, one copy per run of consecutive host slots (slots are
sorted first, the device slots permuted alike), never through a host-side gather or scatter on the scheduler's
thread. They keep stream order with the device's work:
- device -> host (a backup) is queued, and issued in batches (`flush`: when enough tokens are queued, and always
  before the device frees slots, a load or a host read or write): the device rows are gathered on the current stream
  (one gather per buffer for the whole batch), then copied into the pool's runs on a backup stream that waits for
  that gather. The device slots may be freed once the gather is queued: whatever reuses them runs later on the current
  stream. A host read of slots still being written waits for their copy; a load from them waits on the device.
  Host slots too fragmented for copies run by run (or a pool that could not be pinned) take one copy into a pinned
  buffer, scattered into the pool on the host once it has arrived (`poll`, or before anything touches those slots).
- host -> device (a load back) copies the runs into a device staging buffer on a load stream that first waits for
  the work queued so far (the fresh slots may have just been freed by it), scatters the staging into each buffer
  there, and the current stream waits for the load stream: the next pass reads the KV once it is in place and the
  host never blocks. A load whose slots are too fragmented (or a pool that could not be pinned) is gathered on the
  host into a pinned buffer first, then copied once.
On the CPU the same copies run synchronously."""
from __future__ import annotations

import contextlib
import logging
import weakref
from dataclasses import dataclass

import torch

from radixlm.runtime.cache.kv_pool import KVPool
from radixlm.runtime.cache.memory_pool import TokenToKVPoolAllocator

logger = logging.getLogger(__name__)

# Runs shorter than this on average are gathered on the host instead (a copy call costs ~10 us of host time).
MIN_AVG_RUN_TOKENS = 8
# Backups are issued at most this many tokens at a time (bounds the device's gather buffer: 128 MiB for 8B shapes).
FLUSH_TOKENS = 1024


def _pin(t: torch.Tensor) -> bool:
    """Page-locks t's memory in place (cudaHostRegister: pin_memory's allocator would round a large pool up to a
    power of two); whether it is."""
    try:
        err = torch.cuda.cudart().cudaHostRegister(t.data_ptr(), t.numel() * t.element_size(), 0)
        ok = int(getattr(err, "value", err)) == 0
    except (AttributeError, RuntimeError, TypeError) as e:
        ok, err = False, e
    if ok and not t.is_pinned():
        logger.warning("hierarchical cache: the host pool is registered but torch does not report it pinned")
    if not ok:
        logger.warning("hierarchical cache: the host pool could not be pinned (%s); it stays pageable and loads are "
                       "gathered through a pinned buffer", err)
    return ok


def _raw(t: torch.Tensor) -> torch.Tensor:
    """Bytes-compatible view for indexing (torch's index kernels do not take every float8 dtype)."""
    return t.view(torch.uint8) if t.element_size() == 1 and t.is_floating_point() else t


def contiguous_runs(sorted_slots: torch.Tensor) -> list[tuple[int, int, int]]:
    """(offset, first slot, length) of each maximal run of consecutive slots in an ascending 1-D CPU tensor."""
    n = sorted_slots.numel()
    if n == 0:
        return []
    starts = [0] + (torch.nonzero(sorted_slots[1:] - sorted_slots[:-1] != 1).flatten() + 1).tolist()
    ends = starts[1:] + [n]
    firsts = sorted_slots[starts].tolist()
    return [(s, f, e - s) for s, f, e in zip(starts, firsts, ends)]


@dataclass
class CopyStats:
    """What the copies cost, in calls (a fix that copies per token or per layer shows here)."""

    loads: int = 0
    load_tokens: int = 0
    h2d_copies: int = 0  # host -> device copy calls
    gathered_loads: int = 0  # loads gathered on the host first (fragmented slots or a pageable pool)
    scattered_backups: int = 0  # backup batches scattered on the host last (likewise)
    backups: int = 0  # nodes queued for a host copy
    backup_tokens: int = 0
    backup_batches: int = 0  # device gathers issued (each one gather per buffer)
    d2h_copies: int = 0  # device -> host copy calls

    def as_dict(self) -> dict[str, int]:
        return {f"host_{k}": v for k, v in vars(self).items()}


@dataclass
class _InFlight:
    event: "torch.cuda.Event"
    host_slots: torch.Tensor  # sorted
    staging: torch.Tensor | None = None  # pinned rows the host scatters into host_slots once the event is done


class HostKVPool:
    """The device pool's buffers' rows of `size` tokens in host memory, token-major, with a page allocator over
    [page_size, size + page_size) (the first page is never handed out, as on the device). Rows read and written:
    (n, buffers, *row_shape) in the pool's dtype (a float8 pool's as bytes where they come from read)."""

    def __init__(self, size: int, device_pool: KVPool):
        ps = device_pool.page_size
        if size < 2 * ps or size % ps:
            raise ValueError(f"host KV pool of {size} tokens: need a multiple of page_size {ps}, at least two pages")
        layout = device_pool.layout
        self.size = size
        self.page_size = ps
        self.dtype = layout.dtype
        self.layout = layout
        self.num_buffers = layout.num_layers * layout.buffers_per_layer
        self.device_pool = device_pool
        self.kv = torch.zeros((size + ps, self.num_buffers, *layout.row_shape), dtype=self.dtype)
        cuda = device_pool.device.type == "cuda"
        self.pinned = cuda and _pin(self.kv)
        if self.pinned:  # unlocked before the memory goes back
            weakref.finalize(self, torch.cuda.cudart().cudaHostUnregister, self.kv.data_ptr())
        self.allocator = TokenToKVPoolAllocator(size, ps, "cpu")
        self.stats = CopyStats()
        self._queued: list[tuple[torch.Tensor, torch.Tensor]] = []  # (device slots, host slots) not yet issued
        self._queued_tokens = 0
        self._inflight: list[_InFlight] = []
        self._load_stream = torch.cuda.Stream(device_pool.device) if cuda else None
        self._backup_stream = torch.cuda.Stream(device_pool.device) if cuda else None

    @staticmethod
    def bytes_per_token(device_pool: KVPool) -> int:
        return device_pool.layout.bytes_per_token

    def mem_bytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()

    def clear(self) -> None:
        """Forgets every slot (the tree is gone: queued backups are dropped) once the copies in flight are done."""
        self._queued, self._queued_tokens = [], 0
        self.synchronize()
        self.allocator.clear()

    def _device_buffers(self) -> list[torch.Tensor]:
        return [_raw(b) for b in self.device_pool.buffers()]

    # ------------------------------------------------------------------ host-side rows (storage pages use them)
    def read(self, slots: torch.Tensor, pinned: bool = False) -> torch.Tensor:
        """The rows of the host slots (pinned: in pinned memory). Waits for copies still writing them."""
        idx = slots.to(torch.int64)
        self.flush()
        self._wait_for(idx)
        kv = _raw(self.kv)
        out = torch.empty((len(idx), *kv.shape[1:]), dtype=kv.dtype, pin_memory=pinned)
        return torch.index_select(kv, 0, idx, out=out)

    def write(self, slots: torch.Tensor, rows: torch.Tensor) -> None:
        """Inverse of read. Every copy in flight ends first: a backup or a load may use slots freed and handed out
        again since."""
        self.synchronize()
        _raw(self.kv)[slots.to(torch.int64)] = _raw(rows)

    def gather_device(self, device_slots: torch.Tensor) -> torch.Tensor:
        """The device slots' rows, on the device (stream order)."""
        idx = device_slots.to(self.device_pool.device, torch.int64)
        return torch.stack([b.index_select(0, idx) for b in self._device_buffers()], dim=1)

    # ------------------------------------------------------------------ device -> host
    def backup(self, device_slots: torch.Tensor, host_slots: torch.Tensor) -> None:
        """Queues a copy of the device slots' rows into the host slots. The caller flushes before it frees the device
        slots (HiRadixCache.evict does)."""
        if len(device_slots) != len(host_slots):
            raise ValueError(f"backup of {len(device_slots)} device slots into {len(host_slots)} host slots")
        self._queued.append((device_slots, host_slots))
        self._queued_tokens += len(host_slots)
        self.stats.backups += 1
        self.stats.backup_tokens += len(host_slots)
        if self._queued_tokens >= FLUSH_TOKENS:
            self.flush()

    def flush(self) -> None:
        """Issues the queued backups: per FLUSH_TOKENS of them, one gather per device buffer on the current stream,
        then one copy per run of host slots on the backup stream."""
        if not self._queued:
            return
        queued, self._queued, self._queued_tokens = self._queued, [], 0
        dev = self.device_pool.device
        host, order = torch.sort(torch.cat([h for _, h in queued]).to(torch.int64))
        device = torch.cat([d for d, _ in queued]).to(dev, torch.int64)[order.to(dev)]
        kv, stream = _raw(self.kv), self._backup_stream
        if any(w.staging is not None for w in self._inflight):
            self._wait_for(host, staged_only=True)  # an older staged copy must not land over these slots' new rows
        for start in range(0, len(host), FLUSH_TOKENS):
            hs = host[start : start + FLUSH_TOKENS]
            rows = self.gather_device(device[start : start + FLUSH_TOKENS])
            runs = contiguous_runs(hs)
            direct = self._direct(runs, len(hs))
            self.stats.backup_batches += 1
            self.stats.d2h_copies += len(runs) if direct else 1
            self.stats.scattered_backups += not direct
            if stream is None:
                if direct:
                    for off, first, n in runs:
                        kv[first : first + n].copy_(rows[off : off + n])
                else:
                    kv.index_copy_(0, hs, rows)
                continue
            staging = None
            stream.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(stream):
                if direct:
                    for off, first, n in runs:
                        kv[first : first + n].copy_(rows[off : off + n], non_blocking=True)
                else:
                    staging = torch.empty(rows.shape, dtype=rows.dtype, pin_memory=True)
                    staging.copy_(rows, non_blocking=True)
                event = torch.cuda.Event()
                event.record(stream)
            rows.record_stream(stream)
            self._inflight.append(_InFlight(event, hs, staging))

    def _direct(self, runs: list, n: int) -> bool:
        """Whether to copy run by run between the pool and the device (else through a pinned buffer and an indexed
        copy on the host): the pool is pinned (or there is no device) and the runs are long enough on average."""
        long_runs = len(runs) * MIN_AVG_RUN_TOKENS <= max(n, MIN_AVG_RUN_TOKENS)
        return (self._load_stream is None or self.pinned) and long_runs

    def _land(self, w: _InFlight) -> None:
        if w.staging is not None:
            _raw(self.kv).index_copy_(0, w.host_slots, w.staging)

    def poll(self) -> None:
        """Lands the backups the device has finished, in order, without waiting."""
        while self._inflight and self._inflight[0].event.query():
            self._land(self._inflight.pop(0))

    def _overlapping(self, slots: torch.Tensor, staged_only: bool = False) -> int:
        """How many in-flight backups (from the oldest) must end before these slots are read or written: up to the
        newest one writing any of them (staged_only: of those that land through the host)."""
        self.poll()
        last = 0
        for i, w in enumerate(self._inflight):
            if (not staged_only or w.staging is not None) and bool(torch.isin(w.host_slots, slots).any()):
                last = i + 1
        return last

    def _wait_for(self, slots: torch.Tensor, staged_only: bool = False) -> None:
        last = self._overlapping(slots, staged_only)
        for w in self._inflight[:last]:
            w.event.synchronize()
            self._land(w)
        del self._inflight[:last]

    def synchronize(self) -> None:
        """Issues the queued backups and waits for every copy in flight, both ways."""
        self.flush()
        for w in self._inflight:
            w.event.synchronize()
            self._land(w)
        self._inflight.clear()
        if self._load_stream is not None:
            self._load_stream.synchronize()

    # ------------------------------------------------------------------ host -> device
    def load(self, host_slots: torch.Tensor, device_slots: torch.Tensor) -> None:
        """Copies the host slots' rows into the device slots, ordered before the next pass on the current stream."""
        n = len(host_slots)
        if n != len(device_slots):
            raise ValueError(f"load of {n} host slots into {len(device_slots)} device slots")
        if n == 0:
            return
        self.flush()
        dev = self.device_pool.device
        hs, order = torch.sort(host_slots.to(torch.int64))
        didx = device_slots.to(dev, torch.int64)[order.to(dev)]
        runs = contiguous_runs(hs)
        self.stats.loads += 1
        self.stats.load_tokens += n
        stream = self._load_stream
        kv = _raw(self.kv)
        if stream is not None:
            self._wait_for(hs, staged_only=True)
            main = torch.cuda.current_stream(dev)
            stream.wait_stream(main)
            last = self._overlapping(hs)
            if last:  # backups still writing these host slots (events on one stream end in order)
                stream.wait_event(self._inflight[last - 1].event)
            didx.record_stream(stream)
        direct = self._direct(runs, n)
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            staging = torch.empty((n, *kv.shape[1:]), dtype=kv.dtype, device=dev)
            if direct:
                for off, first, k in runs:
                    staging[off : off + k].copy_(kv[first : first + k], non_blocking=True)
                self.stats.h2d_copies += len(runs)
            else:
                self._wait_for(hs)  # the host reads these rows now: backups still writing them land first
                rows = torch.empty((n, *kv.shape[1:]), dtype=kv.dtype, pin_memory=stream is not None)
                torch.index_select(kv, 0, hs, out=rows)
                staging.copy_(rows, non_blocking=True)
                self.stats.h2d_copies += 1
                self.stats.gathered_loads += 1
            for i, b in enumerate(self._device_buffers()):
                b.index_copy_(0, didx, staging[:, i])
        if stream is not None:
            main.wait_stream(stream)
