"""The scheduler's part for prefill/decode disaggregation (disagg_prefill.py, disagg_decode.py): which side it plays,
what the scheduler asks of that side, and how a decode server starts a request whose KV arrived from the prefill
server."""
from __future__ import annotations

from typing import TYPE_CHECKING

from radixlm.runtime.args.choices import DisaggregationMode
from radixlm.runtime.scheduler.disagg_decode import DecodeHooks, DecodeSide
from radixlm.runtime.scheduler.disagg_prefill import PrefillSide
from radixlm.runtime.disaggregation.transfer import KVPayload
from radixlm.runtime.scheduler.req import FinishReason, GrammarAdvance, Req

if TYPE_CHECKING:
    from radixlm.runtime.scheduler.scheduler import Scheduler


class Disaggregation:
    """The side this server plays (prefill, decode, or neither: both None) and what the scheduler asks of it."""

    def __init__(self, prefill: PrefillSide | None, decode: DecodeSide | None):
        self.prefill = prefill
        self.decode = decode

    @classmethod
    def attach(cls, sched: Scheduler) -> "Disaggregation":
        mode = sched.args.disaggregation_mode
        if mode is DisaggregationMode.PREFILL:
            side = PrefillSide(sched.args, sched.runner.token_to_kv_pool, sched.req_to_token_pool,
                               tp_rank=sched.runner.parallel.tp_rank)
            sched.results.on_finished = side.on_finished
            sched.launcher.record_pass_done = sched.runner.is_cuda
            return cls(side, None)
        if mode is DisaggregationMode.DECODE:
            hooks = DecodeHooks(sched.planner, sched.runner.token_to_kv_pool, lambda: sched.running,
                                sched.admission.config.max_running_requests,
                                start=lambda req, payload: start_decoding(sched, req, payload),
                                fail=lambda req, _reason: sched.outbox.emit(req),
                                all_true=sched.runner.parallel.all_true, tp_rank=sched.runner.parallel.tp_rank)
            return cls(None, DecodeSide(sched.args, hooks))
        return cls(None, None)

    def arrive(self, req: Req) -> None:
        """A new request: one with a room on a disaggregated server takes its side's path; elsewhere, or with nothing
        to decode (max_new_tokens 0), it runs here whole."""
        if req.bootstrap is not None and ((self.prefill is None and self.decode is None)
                                          or req.sampling_params.max_new_tokens == 0):
            req.bootstrap = None
        if self.prefill is not None:
            self.prefill.prepare(req)

    def takes(self, req: Req) -> bool:
        """Whether req waits here for its KV from the prefill server (a decode server's) instead of in the queue."""
        if self.decode is not None and req.bootstrap is not None:
            self.decode.add(req)
            return True
        return False

    def step(self) -> None:
        if self.decode is not None:
            self.decode.step()  # requests whose KV arrived join the running batch

    def abort(self, reasons: dict[str, FinishReason]) -> None:
        if self.decode is not None:
            self.decode.abort(reasons)

    def pending(self) -> list[Req]:
        """Requests waiting for their KV from a prefill server (a decode server's)."""
        return list(self.decode.pending) if self.decode is not None else []

    def draining(self) -> bool:
        """Whether aborted requests' slots wait for their room's answer (a decode server's: disagg_decode.py)."""
        return self.decode is not None and bool(self.decode.draining)

    def holding(self) -> list[Req]:
        """Those of them that hold KV slots already, and the slots of aborted ones still draining."""
        return self.decode.holding() if self.decode is not None else []

    def close(self) -> None:
        """Stops the KV transfer threads and closes their sockets (a prefill server's bootstrap port)."""
        for side in (self.prefill, self.decode):
            if side is not None:
                side.close()


def start_decoding(sched: Scheduler, req: Req, payload: KVPayload) -> None:
    """The request's prompt KV is in its slots: append the prefill's first token as if this server had sampled it,
    make the prompt shareable, and run it (or answer it, if that token finished it)."""
    try:
        appended = req.append_tokens([payload.first_token], sched.tokenizer, GrammarAdvance.ACCEPT)
        if req.return_logprob:
            req.output_token_logprobs += payload.output_token_logprobs[:appended]
            req.output_top_logprobs += payload.output_top_logprobs[:appended]
            req.output_token_ids_logprobs += payload.output_token_ids_logprobs[:appended]
    except Exception as e:  # noqa: BLE001 - one request's data fails that request only
        req.finished_reason = FinishReason.failed(e)
    if req.finished():
        sched.planner.release(req)
        sched.ratio.note_finished(req)
        sched.outbox.emit(req)
        return
    sched.planner.cache_chunk(req)
    sched.drafts.after_token(req, sched.drafts.drafting(len(sched.running)))
    sched.running.append(req)
    if req.stream:
        sched.outbox.emit(req)  # the first token goes out at once
