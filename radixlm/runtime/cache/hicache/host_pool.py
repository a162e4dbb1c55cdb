"""The host tier of the hierarchical KV cache: a pool of the device pool's tokens, token-major (one row per slot holds
every per-layer buffer's row of that token: (size + page_size, buffers, *row_shape), buffers = the device pool's
`buffers()` in order: MHA's K of every layer then V, MLA's latent of every layer), pinned in place when CUDA is there
(SGLang's page-first layout); its own page allocator; and the copies between the two pools.

Copies keep stream order with the device's work and never block the scheduler's thread (index tensors go to the
device through pinned memory, host_to_device.py). When the device can address the pinned pool (host_memory.py,
`uva`), a copy is a gather kernel per layer or one scatter kernel reading or writing the host rows directly, so scattered host
slots cost what contiguous ones do; otherwise, DMA calls per run of consecutive host slots (slots sorted, device slots
permuted alike), or a gather on the host where runs are too short.
- device -> host (a backup) is queued, and issued in batches (`flush`: when enough tokens are queued, and always
  before the device frees slots, a load or a host read or write): the device rows are gathered on the current stream
  (one gather per buffer for the whole batch), then written into the pool on a backup stream that waits for that
  gather. The device slots may be freed once the gather is queued: whatever reuses them runs later on the current
  stream. A host read of slots still being written waits for their copy; a load from them waits on the device.
  Without `uva`, host slots too fragmented for copies run by run take one copy into a pinned buffer, scattered into
  the pool on the host once it has arrived (`poll`, or before anything touches those slots).
- host -> device (a load back) runs on a load stream that first waits for the work queued so far (the fresh slots
  may have just been freed by it), layer by layer in layer order, each layer ending with an event; a forward pass
  takes the events (`take_layer_loads`, a LayerLoadWaiter) and its attention of layer i waits for layer i's only, so
  the load overlaps the pass. Without `uva` the rows arrive in a device staging buffer first (all layers: the pool
  is token-major), scattered into each layer's buffers in layer order.
On the CPU the same copies run synchronously."""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from radixlm.runtime.cache.hicache.host_memory import as_words, contiguous_runs, device_view, pin, raw
from radixlm.runtime.cache.kv_pool import KVPool
from radixlm.runtime.cache.layer_load import LayerLoadWaiter
from radixlm.runtime.cache.memory_pool import TokenToKVPoolAllocator
from radixlm.runtime.host_to_device import host_to_device

__all__ = ["HostKVPool", "CopyStats", "contiguous_runs"]

# Runs shorter than this on average are gathered on the host instead (a copy call costs ~10 us of host time).
MIN_AVG_RUN_TOKENS = 8
# Backups are issued at most this many tokens at a time (bounds the device's gather buffer: 128 MiB for 8B shapes).
FLUSH_TOKENS = 1024


@dataclass
class CopyStats:
    """What the copies cost, in calls (a fix that copies per token or per layer shows here)."""

    loads: int = 0
    load_tokens: int = 0
    h2d_copies: int = 0  # host -> device copy calls (uva: gather kernels, one per layer)
    gathered_loads: int = 0  # loads gathered on the host first (fragmented slots or a pageable pool)
    scattered_backups: int = 0  # backup batches scattered on the host last (likewise)
    backups: int = 0  # nodes queued for a host copy
    backup_tokens: int = 0
    backup_batches: int = 0  # device gathers issued (each one gather per buffer)
    d2h_copies: int = 0  # device -> host copy calls (uva: one scatter kernel per batch)

    def as_dict(self) -> dict[str, int]:
        return {f"host_{k}": v for k, v in vars(self).items()}


@dataclass
class _InFlight:
    event: "torch.cuda.Event"
    host_slots: torch.Tensor
    staging: torch.Tensor | None = None  # pinned rows the host scatters into host_slots once the event is done
    seq: int = 0  # the batches put in flight are numbered 1, 2, ...


class HostKVPool:
    """The device pool's buffers' rows of `size` tokens in host memory, token-major, with a page allocator over
    [page_size, size + page_size) (the first page is never handed out, as on the device; the mapping's probe uses
    it). Rows read and written: (n, buffers, *row_shape) in the pool's dtype (a float8 pool's as bytes where they come
    from read). uva: let the device address the pinned pool where it can (else DMA calls per run)."""

    def __init__(self, size: int, device_pool: KVPool, uva: bool = True):
        ps = device_pool.page_size
        if size < 2 * ps or size % ps:
            raise ValueError(f"host KV pool of {size} tokens: need a multiple of page_size {ps}, at least two pages")
        layout = device_pool.layout
        self.size = size
        self.page_size = ps
        self.dtype = layout.dtype
        self.layout = layout
        self.num_buffers = layout.num_layers * layout.buffers_per_layer
        # Buffer b of device_pool.buffers() belongs to layer b % num_layers (name-major: every K, then every V).
        self.layer_buffers = [list(range(layer, self.num_buffers, layout.num_layers))
                              for layer in range(layout.num_layers)]
        self.device_pool = device_pool
        self.kv = torch.zeros((size + ps, self.num_buffers, *layout.row_shape), dtype=self.dtype)
        self._kv_words = as_words(self.kv, 2)  # (size + page_size, buffers, words): the copies move words
        self._dev_words: tuple[torch.Tensor, torch.Tensor] | None = None  # (device pool's stack, its words view)
        cuda = device_pool.device.type == "cuda"
        self.pinned = cuda and pin(self.kv)
        if self.pinned:  # unlocked before the memory goes back
            weakref.finalize(self, torch.cuda.cudart().cudaHostUnregister, self.kv.data_ptr())
        # (size + page_size, buffers, words): the pool's rows as the device addresses them, or None (no uva).
        self._host_words: torch.Tensor | None = None
        if self.pinned and uva:
            view = device_view(self.kv, device_pool.device)
            if view is not None:
                self._host_words = as_words(view.view(size + ps, self.num_buffers, -1), 2)
        # As the device's allocator on CUDA: frees queued and merged when an allocation needs them (the debug checks'
        # merge copies the whole free list at every free); the accounting check recounts both tiers.
        self.allocator = TokenToKVPoolAllocator(size, ps, "cpu", debug=not cuda)
        self.stats = CopyStats()
        self._queued: list[tuple[torch.Tensor, torch.Tensor]] = []  # (device slots, host slots) not yet issued
        self._queued_tokens = 0
        self._inflight: list[_InFlight] = []
        # Per host slot, the number of the latest batch put in flight that writes it (of those landing through the
        # host): which in-flight batches a read or write must wait for is a gather, not a search of every batch.
        self._batches = 0
        self._writer = torch.zeros(size + ps, dtype=torch.int64)
        self._staged_writer = torch.zeros(size + ps, dtype=torch.int64)
        self._load_stream = torch.cuda.Stream(device_pool.device) if cuda else None
        self._backup_stream = torch.cuda.Stream(device_pool.device) if cuda else None
        # Per layer, the event of the last load's copies of that layer, until a pass takes them.
        self._layer_events: list["torch.cuda.Event"] | None = None

    @property
    def uva(self) -> bool:
        """Whether copies are kernels addressing the pinned pool (else DMA calls per run of host slots)."""
        return self._host_words is not None

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

    def _device_words(self) -> torch.Tensor:
        """The device pool as (size + page_size, buffers, words), a slot's rows of every buffer (a strided view of its
        one allocation): an index op over it moves every layer's rows of those slots at once."""
        stack = self.device_pool.stacked()
        if self._dev_words is None or self._dev_words[0] is not stack:  # (a resumed pool is a new allocation)
            self._dev_words = (stack, as_words(stack, 2).transpose(0, 1))
        return self._dev_words[1]

    # ------------------------------------------------------------------ host-side rows (storage pages use them)
    def read(self, slots: torch.Tensor, pinned: bool = False) -> torch.Tensor:
        """The rows of the host slots (pinned: in pinned memory). Waits for copies still writing them."""
        idx = slots.to(torch.int64)
        self.flush()
        self._wait_for(idx)
        kv = raw(self.kv)
        out = torch.empty((len(idx), *kv.shape[1:]), dtype=kv.dtype, pin_memory=pinned)
        return torch.index_select(kv, 0, idx, out=out)

    def write(self, slots: torch.Tensor, rows: torch.Tensor) -> None:
        """Inverse of read. Every copy in flight ends first: a backup or a load may use slots freed and handed out
        again since."""
        self.synchronize()
        raw(self.kv)[slots.to(torch.int64)] = raw(rows)

    def gather_device(self, device_slots: torch.Tensor) -> torch.Tensor:
        """The device slots' rows (n, buffers, *row_shape), on the device (stream order): one gather."""
        idx = self._to_device(device_slots)
        return raw(self.device_pool.stacked()).transpose(0, 1).index_select(0, idx)

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        """An int64 index on the device, a CPU one's copy enqueued on the current stream (never waiting for the
        device)."""
        dev = self.device_pool.device
        return t.to(torch.int64) if t.device.type == dev.type else host_to_device(t, torch.int64, dev)

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
            self.flush(whole_batches=True)

    def flush(self, whole_batches: bool = False) -> None:
        """Issues the queued backups: per FLUSH_TOKENS of them, one gather of every buffer's rows on the current
        stream, then, on the backup stream, one scatter kernel into the pool (uva) or one copy per run of host slots
        (sorted for that). whole_batches: only whole batches of FLUSH_TOKENS; the rest stays queued."""
        if not self._queued:
            return
        queued, self._queued, self._queued_tokens = self._queued, [], 0
        dev = self.device_pool.device
        host = torch.cat([h for _, h in queued]).to(torch.int64)
        device = torch.cat([self._to_device(d) for d, _ in queued])  # (a remainder kept queued is on the device)
        if not self.uva:
            host, order = torch.sort(host)
            device = device[self._to_device(order)]
        if whole_batches:
            cut = len(host) // FLUSH_TOKENS * FLUSH_TOKENS
            if cut < len(host):
                self._queued, self._queued_tokens = [(device[cut:], host[cut:])], len(host) - cut
                host, device = host[:cut], device[:cut]
        kv, stream, dev_words = self._kv_words, self._backup_stream, self._device_words()
        if any(w.staging is not None for w in self._inflight):
            self._wait_for(host, staged_only=True)  # an older staged copy must not land over these slots' new rows
        for start in range(0, len(host), FLUSH_TOKENS):
            hs = host[start : start + FLUSH_TOKENS]
            rows = dev_words.index_select(0, device[start : start + FLUSH_TOKENS])
            self.stats.backup_batches += 1
            if stream is None:  # the same copies, synchronous
                staging = self._issue_backup(hs, rows)
                if staging is not None:
                    kv.index_copy_(0, hs, staging)
                continue
            stream.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(stream):
                staging = self._issue_backup(hs, rows)
                event = torch.cuda.Event()
                event.record(stream)
            rows.record_stream(stream)
            self._put_in_flight(event, hs, staging)

    def _put_in_flight(self, event: "torch.cuda.Event", hs: torch.Tensor, staging: torch.Tensor | None) -> None:
        self._batches += 1
        self._writer[hs] = self._batches
        if staging is not None:
            self._staged_writer[hs] = self._batches
        self._inflight.append(_InFlight(event, hs, staging, self._batches))

    def _issue_backup(self, hs: torch.Tensor, rows: torch.Tensor) -> torch.Tensor | None:
        """On the backup stream: rows (on the device, as words) into the host slots hs (sorted unless uva); the
        pinned staging the host scatters later, if any."""
        if self.uva:
            self._host_words.index_copy_(0, self._to_device(hs), rows)
            self.stats.d2h_copies += 1
            return None
        kv = self._kv_words
        runs = contiguous_runs(hs)
        if self._direct(runs, len(hs)):
            for off, first, n in runs:
                kv[first : first + n].copy_(rows[off : off + n], non_blocking=True)
            self.stats.d2h_copies += len(runs)
            return None
        staging = torch.empty(rows.shape, dtype=rows.dtype, pin_memory=self._backup_stream is not None)
        staging.copy_(rows, non_blocking=True)
        self.stats.d2h_copies += 1
        self.stats.scattered_backups += 1
        return staging

    def _direct(self, runs: list, n: int) -> bool:
        """Whether to copy run by run between the pool and the device (else through a pinned buffer and an indexed
        copy on the host): the pool is pinned (or there is no device) and the runs are long enough on average."""
        long_runs = len(runs) * MIN_AVG_RUN_TOKENS <= max(n, MIN_AVG_RUN_TOKENS)
        return (self._load_stream is None or self.pinned) and long_runs

    def _land(self, w: _InFlight) -> None:
        if w.staging is not None:
            self._kv_words.index_copy_(0, w.host_slots, w.staging)

    def poll(self) -> None:
        """Lands the backups the device has finished, in order, without waiting."""
        while self._inflight and self._inflight[0].event.query():
            self._land(self._inflight.pop(0))

    def _overlapping(self, slots: torch.Tensor, staged_only: bool = False) -> int:
        """How many in-flight backups (from the oldest) must end before these slots are read or written: up to the
        newest one writing any of them (staged_only: of those that land through the host)."""
        self.poll()
        if not self._inflight or len(slots) == 0:
            return 0
        newest = int((self._staged_writer if staged_only else self._writer)[slots].max())
        return max(0, newest - self._inflight[0].seq + 1)  # (in flight: batches inflight[0].seq, ... in order)

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
        """Copies the host slots' rows into the device slots, layer by layer; a pass reading them waits through
        take_layer_loads (on the CPU the copy is done on return)."""
        n = len(host_slots)
        if n != len(device_slots):
            raise ValueError(f"load of {n} host slots into {len(device_slots)} device slots")
        if n == 0:
            return
        self.flush()
        dev = self.device_pool.device
        self.stats.loads += 1
        self.stats.load_tokens += n
        stream = self._load_stream
        hs = host_slots.to(torch.int64)
        if stream is None:
            self._load_layers(hs, self._to_device(device_slots), None)
            return
        if not self.uva:
            self._wait_for(hs, staged_only=True)
        didx = self._to_device(device_slots)  # (on the current stream, which the load stream waits for next)
        stream.wait_stream(torch.cuda.current_stream(dev))
        last = self._overlapping(hs)
        if last:  # backups still writing these host slots (events on one stream end in order)
            stream.wait_event(self._inflight[last - 1].event)
        didx.record_stream(stream)
        with torch.cuda.stream(stream):
            self._layer_events = self._load_layers(hs, didx, stream)

    def _load_layers(self, hs: torch.Tensor, didx: torch.Tensor,
                     stream: "torch.cuda.Stream | None") -> list["torch.cuda.Event"]:
        """The load's copies in layer order (on `stream` where there is one, recording an event after each layer's):
        per layer one scatter into the device pool's strided view of that layer's buffers (KVPool.stacked)."""
        events = []
        dev = self._device_words()
        num_layers = len(self.layer_buffers)  # buffers layer, layer + num_layers, ... are a layer's
        if self.uva:
            hidx = self._to_device(hs)
            self.stats.h2d_copies += num_layers
            for layer in range(num_layers):
                rows = self._host_words[:, layer::num_layers].index_select(0, hidx)  # one gather of its rows
                dev[:, layer::num_layers].index_copy_(0, didx, rows)
                if stream is not None:
                    events.append(self._record(stream))
            return events
        hs, order = torch.sort(hs)
        didx = didx[self._to_device(order)]
        if stream is None:  # synchronous: every layer at once, straight from the pool (no staging)
            self._read_runs(hs, False, lambda off, rows: dev.index_copy_(0, didx[off : off + len(rows)], rows))
            return events
        kv = self._kv_words
        staging = torch.empty((len(hs), *kv.shape[1:]), dtype=kv.dtype, device=self.device_pool.device)
        self._read_runs(hs, True, lambda off, rows: staging[off : off + len(rows)].copy_(rows, non_blocking=True))
        for layer in range(num_layers):
            dev[:, layer::num_layers].index_copy_(0, didx, staging[:, layer::num_layers])
            events.append(self._record(stream))
        return events

    @staticmethod
    def _record(stream: "torch.cuda.Stream") -> "torch.cuda.Event":
        event = torch.cuda.Event()
        event.record(stream)
        return event

    def _read_runs(self, hs: torch.Tensor, pinned: bool, put) -> None:
        """Hands the sorted host slots' rows (n, buffers, words) to put(offset, rows): one call (a DMA copy on CUDA)
        per run of consecutive slots, or, where the runs are too short, one with them gathered on the host (into
        pinned memory: one copy)."""
        kv = self._kv_words
        n = len(hs)
        runs = contiguous_runs(hs)
        if self._direct(runs, n):
            for off, first, k in runs:
                put(off, kv[first : first + k])
            self.stats.h2d_copies += len(runs)
            return
        self._wait_for(hs)  # the host reads these rows now: backups still writing them land first
        rows = torch.empty((n, *kv.shape[1:]), dtype=kv.dtype, pin_memory=pinned)
        torch.index_select(kv, 0, hs, out=rows)
        put(0, rows)
        self.stats.h2d_copies += 1
        self.stats.gathered_loads += 1

    def take_layer_loads(self) -> LayerLoadWaiter | None:
        """The per-layer events of the loads issued since the last call, for the next pass to wait on (None: nothing
        loaded, or the CPU, where loads are done on return)."""
        events, self._layer_events = self._layer_events, None
        return None if events is None else LayerLoadWaiter(events)

    def order_after_loads(self) -> None:
        """Makes the current stream wait for every load issued (device slots a load writes are being freed before a
        pass waited for them: whatever reuses them must come after the copy)."""
        if self._layer_events is not None:
            torch.cuda.current_stream(self.device_pool.device).wait_event(self._layer_events[-1])
