"""The prefill server's side (--disaggregation-mode prefill): a request with a bootstrap room is prefilled with the
server's own radix cache and samples its first token (max_new_tokens 1); when it finishes, the prompt's KV, that
token and its logprobs are copied to the host and published for the room (transfer.py). The request's pages then
go to the radix tree like any finished request's, so no page waits on a decode server: a decode server that never
fetches (or dies mid-transfer) leaves only the host copy, dropped after --disaggregation-timeout. A request without
a room (the server's warm-up, a direct call) runs as on a plain server.

Where the decode server's fetch came first and carries its pool (a GPU of this host that this process sees:
cuda_ipc.py), the KV goes from this pool's slots straight into the decode server's and the room's answer (its first
token and logprobs) leaves once the copy is done. The copy runs on a stream of its own after the pass that finished
the request, not behind the pass the overlap scheduler launched meanwhile (a whole prefill pass of delay), and this
scheduler's stream waits for it before anything can reuse the slots."""
from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import TYPE_CHECKING

import torch

from radixlm.runtime.disaggregation.cuda_ipc import PeerPools, check_layout, copy_slots
from radixlm.runtime.disaggregation.transfer import KVPayload, KVSender, make_sender
from radixlm.runtime.scheduler.req import FinishType, Req

if TYPE_CHECKING:
    from radixlm.runtime.args import ServerArgs
    from radixlm.runtime.cache.memory_pool import ReqToTokenPool, TokenToKVPool

logger = logging.getLogger(__name__)


# KV of finished rooms kept on the GPU until their fetch comes (and says where it goes); past this, to the host.
STAGING_MAX_BYTES = 4 << 30


def gather_kv(kv_pool: TokenToKVPool, slots: torch.Tensor, host: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """The KV of `slots` of every layer, on the host (or where the pool is): ([layers, tokens, heads, head dim],) * 2."""
    k = torch.stack([kv_pool.k_buffer[layer].index_select(0, slots) for layer in range(kv_pool.num_layers)])
    v = torch.stack([kv_pool.v_buffer[layer].index_select(0, slots) for layer in range(kv_pool.num_layers)])
    return (k.cpu(), v.cpu()) if host else (k, v)


class PrefillSide:
    def __init__(self, args: ServerArgs, kv_pool: TokenToKVPool, req_to_token_pool: ReqToTokenPool,
                 sender: KVSender | None = None, tp_rank: int = 0):
        """tp_rank: each tensor-parallel rank serves its own shard of the KV heads, on the bootstrap port + its rank
        (decode rank i fetches from prefill rank i: both sides run the same tp_size)."""
        self.kv_pool = kv_pool
        self.req_to_token_pool = req_to_token_pool
        # The decode pools opened here, for this thread's copies and the sender's.
        self.peers = PeerPools(torch.device(kv_pool.device))
        self.sender = sender or make_sender(args.disaggregation_transfer_backend,
                                            args.disaggregation_bootstrap_port + tp_rank, args.disaggregation_timeout,
                                            self.peers)
        self.copy_stream: torch.cuda.Stream | None = None  # in-place copies on CUDA (made at the first)
        self.published = 0
        self.written_in_place = 0  # of them, rooms whose KV this server wrote into the decode server's pool

    def prepare(self, req: Req) -> None:
        """On arrival: a request with a room stops after its first token."""
        if req.bootstrap is not None:
            req.sampling_params = dataclasses.replace(req.sampling_params, max_new_tokens=1)

    def on_finished(self, req: Req, pass_done: torch.cuda.Event | None = None) -> None:
        """Before the request's pages are released: publish its room (its KV, or why there is none). pass_done: the
        event of the pass that finished it (on CUDA)."""
        if req.bootstrap is None:
            return
        room, n = req.bootstrap.room, len(req.origin_input_ids)
        if req.finished_reason.type is FinishType.ABORT or not req.output_ids or req.kv.committed < n:
            message = req.finished_reason.message if req.finished_reason.message else "the prefill produced no token"
            self.sender.publish(KVPayload(room, error=f"prefill failed: {message}"))
            return
        slots = self.req_to_token_pool.req_to_token[req.req_pool_idx, :n].to(self.kv_pool.device)
        meta = dict(first_token=req.output_ids[0], output_token_logprobs=list(req.output_token_logprobs),
                    output_top_logprobs=list(req.output_top_logprobs),
                    output_token_ids_logprobs=list(req.output_token_ids_logprobs),
                    input_token_logprobs=list(req.input_token_logprobs),
                    input_top_logprobs=list(req.input_top_logprobs), cached_tokens=req.cached_tokens)
        target = self.sender.take_dest(room)
        asker = None if target is None else target[0]
        if target is not None:
            dest = target[1]
            peer = self.peers.open(dest["pool"])
            if peer is not None:
                problem = check_layout(self.kv_pool.buffers(), peer)
                if problem is None and len(dest["slots"]) != n:
                    problem = f"{len(dest['slots'])} slots for a {n}-token prompt"
                if problem is not None:
                    self.sender.publish(KVPayload(room, error=problem), to=asker)
                    return
                with self._aside(slots, pass_done):
                    event = copy_slots(self.kv_pool.buffers(), slots, peer, torch.tensor(dest["slots"]))
                self.sender.publish(KVPayload(room, written_tokens=n, **meta), ready=event, to=asker)
                self.published += 1
                self.written_in_place += 1
                return
        # No fetch yet: the KV waits on the GPU (a copy: the slots go to the tree) for the fetch to say where it goes.
        stage = asker is None and slots.is_cuda and self.sender.staged_bytes() < STAGING_MAX_BYTES
        ready = None
        with self._aside(slots, pass_done):
            k, v = gather_kv(self.kv_pool, slots, host=not stage)
            if stage:
                ready = torch.cuda.Event()
                ready.record()
        self.sender.publish(KVPayload(room, k=k, v=v, **meta), ready=ready, to=asker)
        self.published += 1

    @contextlib.contextmanager
    def _aside(self, slots: torch.Tensor, pass_done: torch.cuda.Event | None):
        """On CUDA, runs the block's reads of the request's KV on the copy stream, after the pass that wrote it
        (pass_done) and not behind the pass launched since; this scheduler's stream then waits for them, since the
        slots go to the tree and a later pass may reuse them."""
        if not slots.is_cuda:
            yield
            return
        main = torch.cuda.current_stream(slots.device)
        if self.copy_stream is None:
            self.copy_stream = torch.cuda.Stream(slots.device)
        if pass_done is not None:
            self.copy_stream.wait_event(pass_done)
        else:
            self.copy_stream.wait_stream(main)
        slots.record_stream(self.copy_stream)
        with torch.cuda.stream(self.copy_stream):
            yield
        main.wait_stream(self.copy_stream)

    def close(self) -> None:
        self.sender.close()
