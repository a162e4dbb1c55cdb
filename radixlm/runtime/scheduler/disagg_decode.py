"""The decode server's side (--disaggregation-mode decode): a request with a bootstrap room waits here, not in the
waiting queue. Once a request row and its prompt's slots are free (evicting cached prefixes if it must, within
max_running_requests), it takes them and fetches the room from the prefill server's bootstrap server; when the KV
arrives it is written into those slots, the prefill's first token (with its logprobs) is appended as if this server
had sampled it (grammar advanced, finish rules applied), the prompt is inserted into this server's radix tree and
the request joins the running batch: from then on it is an ordinary running request (a retraction re-prefills it
here). A room that fails (the prefill server's error, or nothing within --disaggregation-timeout) fails its request
with that message and frees its slots; an abort cancels the fetch and frees them too.

On CUDA the fetch carries this pool's export and the request's slots (cuda_ipc.py): a prefill server on this host
writes the KV there itself and answers once it is written. Such slots are not freed on an abort until the room's
answer (or its timeout) says nothing more will be written into them. Their ids reach the host behind the pass in
flight (HostSlots), so such a fetch goes out a step after the slots are taken."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixlm.runtime.disaggregation.cuda_ipc import export_pool
from radixlm.runtime.disaggregation.transfer import KVPayload, KVReceiver, make_receiver
from radixlm.runtime.scheduler.planner import Planner, pages_needed
from radixlm.runtime.scheduler.req import FinishReason, Req

if TYPE_CHECKING:
    from radixlm.runtime.args import ServerArgs
    from radixlm.runtime.cache.memory_pool import TokenToKVPool

logger = logging.getLogger(__name__)


@dataclass
class DecodeHooks:
    """What the decode side needs of the scheduler (its parts, handed over explicitly)."""

    planner: Planner
    kv_pool: TokenToKVPool
    running: Callable[[], list[Req]]  # the running requests
    max_running: int
    start: Callable[[Req, KVPayload], None]  # a request whose KV arrived: take its first token and run it
    fail: Callable[[Req, FinishReason], None]  # a request that ends here: answered with this reason
    all_true: Callable[[list[bool]], list[bool]]  # position-wise AND over the tensor-parallel ranks (Parallel's)
    tp_rank: int = 0


class HostSlots:
    """A request's slot ids on their way to the host. On CUDA they come behind the pass in flight: reading them at
    once would wait for that pass, and the device would idle while this step plans the next one."""

    def __init__(self, slots: torch.Tensor):
        self.event = None
        if slots.is_cuda:
            self.ids = torch.empty(slots.shape, dtype=slots.dtype, pin_memory=True)
            self.ids.copy_(slots, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.ids = slots

    def ready(self) -> bool:
        return self.event is None or self.event.query()


def scatter_kv(kv_pool: TokenToKVPool, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Writes [layers, tokens, heads, head dim] k and v into `slots` of every layer."""
    if k.shape[0] != kv_pool.num_layers or k.shape[2:] != kv_pool.k_buffer[0].shape[1:] or k.dtype != kv_pool.dtype:
        raise ValueError(f"the prefill server's KV {tuple(k.shape)} {k.dtype} does not fit this pool "
                         f"({kv_pool.num_layers} layers, {tuple(kv_pool.k_buffer[0].shape[1:])}, {kv_pool.dtype}): "
                         "both servers must run the same model, dtype and KV dtype")
    k, v = k.to(kv_pool.device), v.to(kv_pool.device)
    for layer in range(kv_pool.num_layers):
        kv_pool.k_buffer[layer][slots] = k[layer]
        kv_pool.v_buffer[layer][slots] = v[layer]
    if k.is_cuda:  # allocated on the receiver's stream: not reused there before these reads are done
        k.record_stream(torch.cuda.current_stream(k.device))
        v.record_stream(torch.cuda.current_stream(v.device))


class DecodeSide:
    def __init__(self, args: ServerArgs, hooks: DecodeHooks, receiver: KVReceiver | None = None):
        self.hooks = hooks
        self.timeout_s = args.disaggregation_timeout
        self.receiver = receiver or make_receiver(args.disaggregation_transfer_backend, hooks.kv_pool.device)
        self.pending: list[Req] = []  # in arrival order; those with req_pool_idx set hold slots and are fetching
        self.arrived: dict[int, KVPayload] = {}  # this rank's shards that came, until every rank has its own
        self.received = 0
        self.in_place: set[int] = set()  # rooms whose fetch let the prefill server write into their slots
        # Requests holding slots whose fetch (with this pool's export) waits for their slot ids on the host.
        self.unsent: dict[int, tuple[Req, HostSlots]] = {}
        # Aborted requests of such rooms: their slots stay held until every rank has the room's answer (drained).
        self.draining: dict[int, Req] = {}
        self.drained: set[int] = set()
        self._export: tuple[tuple, dict | None] | None = None  # (the pool's buffer addresses, export_pool's answer)

    def add(self, req: Req) -> None:
        self.pending.append(req)

    def holding(self) -> list[Req]:
        """The requests that hold a request row and KV slots here (the accounting check counts them)."""
        return [r for r in self.pending if r.req_pool_idx is not None] + list(self.draining.values())

    def step(self) -> None:
        """Takes slots for the requests that can have them, then starts those whose KV arrived (on every
        tensor-parallel rank: each rank fetches its own shard, and a request starts on all ranks in the same step,
        failing on all if it failed on one)."""
        self._allocate()
        self._send()
        if not self.pending and not self.draining:
            return
        holders = [r for r in self.pending if r.req_pool_idx is not None]
        rooms = {r.bootstrap.room for r in holders}
        for payload in self.receiver.poll():
            if payload.room in rooms:
                self.arrived[payload.room] = payload
            elif payload.room in self.draining:
                self.drained.add(payload.room)
        self._drain()
        ready = self.hooks.all_true([r.bootstrap.room in self.arrived for r in holders])
        done = [r for r, ok in zip(holders, ready) if ok]
        if not done:
            return
        ok = self.hooks.all_true([self.arrived[r.bootstrap.room].error is None for r in done])
        for req, fine in zip(done, ok):
            self.pending.remove(req)
            payload = self.arrived.pop(req.bootstrap.room)
            if not fine and payload.error is None:
                payload = KVPayload(payload.room, error="another tensor-parallel rank's shard failed")
            self._arrived(req, payload)

    def abort(self, reasons: dict[str, FinishReason]) -> None:
        for req in [r for r in self.pending if r.rid in reasons]:
            self.pending.remove(req)
            room = req.bootstrap.room
            if req.req_pool_idx is not None:
                self.arrived.pop(room, None)
                if self.unsent.pop(room, None) is not None:  # never fetched: nothing writes into its slots
                    self._end(req, reasons[req.rid])
                    continue
                if room in self.in_place:  # the prefill server may be writing into its slots: answered now, freed later
                    req.finished_reason = reasons[req.rid]
                    self.draining[room] = req
                    self.hooks.fail(req, reasons[req.rid])
                    continue
                self.receiver.cancel(room)
            self._end(req, reasons[req.rid])

    def close(self) -> None:
        self.receiver.close()

    # ------------------------------------------------------------------ internals
    def _drain(self) -> None:
        """Frees the slots of aborted rooms whose answer every rank has (the allocators stay alike across ranks)."""
        if not self.draining:
            return
        rooms = list(self.draining)
        for room, done in zip(rooms, self.hooks.all_true([r in self.drained for r in rooms])):
            if done:
                req = self.draining.pop(room)
                self.drained.discard(room)
                self.in_place.discard(room)
                self.hooks.planner.release(req, insert=False)
                req.reset_kv_state()

    def _pool(self) -> dict | None:
        """This pool's export, for a prefill server on this host to write rooms into (None: it cannot be shared)."""
        bufs = self.hooks.kv_pool.buffers()
        key = (len(bufs), bufs[0].data_ptr() if bufs else 0)
        if self._export is None or self._export[0] != key:  # the pool was released and allocated again meanwhile
            self._export = (key, export_pool(bufs))
        return self._export[1]

    def _fetch(self, req: Req, dest: dict | None) -> None:
        b = req.bootstrap
        if dest is not None:
            self.in_place.add(b.room)
        # Prefill rank i's bootstrap server listens on the port + i (disagg_prefill.py): rank i takes its shard.
        self.receiver.fetch(b.room, b.host, b.port + self.hooks.tp_rank, self.timeout_s, dest)

    def _send(self) -> None:
        """The fetches whose slot ids reached the host, in the order their slots were taken."""
        for room, (req, slots) in list(self.unsent.items()):
            if not slots.ready():
                return
            del self.unsent[room]
            pool = self._pool()
            self._fetch(req, None if pool is None else {"pool": pool, "slots": slots.ids.tolist()})

    def _allocate(self) -> None:
        h = self.hooks
        planner = h.planner
        held = len(self.holding())
        for req in self.pending:
            if req.req_pool_idx is not None:
                continue
            if len(h.running()) + held >= h.max_running:
                return
            n = len(req.origin_input_ids)
            if not planner.make_room(pages_needed(0, n, planner.page_size)):
                return
            idx = planner.req_to_token_pool.alloc()
            if idx is None:
                return
            slots = planner.allocator.alloc_extend([0], [n], [-1])
            if slots is None:
                planner.req_to_token_pool.free(idx)
                return
            planner.req_to_token_pool.req_to_token[idx, :n] = slots.to(planner.req_to_token_pool.device)
            req.req_pool_idx = idx
            req.cache_lock, _ = planner.tree_cache.lock(planner.tree_cache.root_node, 0)
            req.kv.committed = n  # its slots (their KV arrives later; _end frees them without inserting)
            held += 1
            if self._pool() is None:
                self._fetch(req, None)
            else:
                self.unsent[req.bootstrap.room] = (req, HostSlots(slots))

    def _arrived(self, req: Req, payload: KVPayload) -> None:
        self.in_place.discard(payload.room)
        if payload.error is not None:
            self._end(req, FinishReason.aborted(f"disaggregated prefill failed: {payload.error}", 502))
            return
        n = len(req.origin_input_ids)
        try:
            if payload.num_tokens != n:
                raise ValueError(f"room {payload.room}: {payload.num_tokens} tokens of KV for a {n}-token prompt")
            if payload.k is not None:  # else the prefill server wrote it into the slots already
                table = self.hooks.planner.req_to_token_pool.req_to_token
                scatter_kv(self.hooks.kv_pool, table[req.req_pool_idx, :n], payload.k, payload.v)
        except ValueError as e:
            self._end(req, FinishReason.aborted(f"disaggregated prefill failed: {e}", 500))
            return
        self.received += 1
        req.cached_tokens = payload.cached_tokens
        req.started = True
        now = time.monotonic()
        req.queue_time = now - req.arrived
        req.admitted_at(now)
        if req.return_logprob:
            req.input_token_logprobs = list(payload.input_token_logprobs)
            req.input_top_logprobs = list(payload.input_top_logprobs)
        req.input_logprobs_done = True
        self.hooks.start(req, payload)

    def _end(self, req: Req, reason: FinishReason) -> None:
        """A request that never ran here: its slots (if any) go back without entering the tree."""
        req.finished_reason = reason
        if req.req_pool_idx is not None:
            self.hooks.planner.release(req, insert=False)
            req.reset_kv_state()
        self.hooks.fail(req, reason)
