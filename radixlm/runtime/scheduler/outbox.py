"""What the scheduler sends the front: one BatchReqOutput per step, a row for each request that finished or has
tokens to stream; and the queues of requests (waiting, running, the one prefilled in chunks) that the scheduler's parts share."""
from __future__ import annotations

from dataclasses import dataclass, field

from radixlm.runtime.messages import BatchReqOutput
from radixlm.runtime.scheduler.config import OutputConfig
from radixlm.runtime.scheduler.req import Req


@dataclass
class ReqQueues:
    waiting: list[Req] = field(default_factory=list)
    running: list[Req] = field(default_factory=list)  # decoding (or about to: admitted whole, launched)
    chunked: Req | None = None  # the request whose prompt is being prefilled in chunks

    def drop_finished(self) -> None:
        self.running = [r for r in self.running if not r.finished()]


class Outbox:
    """Collects a step's outputs as one BatchReqOutput (columns, not an object per request)."""

    def __init__(self, config: OutputConfig):
        self.config = config
        self.outputs = BatchReqOutput()

    def take(self) -> BatchReqOutput:
        """The outputs collected so far; the outbox starts a new batch."""
        out, self.outputs = self.outputs, BatchReqOutput()
        return out

    def stream_due(self, req: Req) -> bool:
        """The first token goes out at once (time to first token); later ones every stream_interval tokens."""
        interval = req.sampling_params.stream_interval or self.config.stream_interval
        return req.sent_len == 0 or len(req.output_ids) - req.sent_len >= interval

    def emit(self, req: Req) -> None:
        new = req.output_ids[req.sent_len :]
        req.sent_len = len(req.output_ids)
        logprobs = None
        if (req.input_token_logprobs or req.input_top_logprobs or req.output_token_logprobs
                or req.output_top_logprobs or req.output_token_ids_logprobs):
            logprobs = (req.input_token_logprobs, req.input_top_logprobs, req.output_token_logprobs,
                        req.output_top_logprobs, req.output_token_ids_logprobs)
            req.input_token_logprobs, req.input_top_logprobs = [], []
            req.output_token_logprobs, req.output_top_logprobs = [], []
            req.output_token_ids_logprobs = []
        self.outputs.add(req.rid, new, req.finished_reason.to_json() if req.finished_reason else None,
                         len(req.origin_input_ids), len(req.output_ids), req.cached_tokens, req.num_retractions,
                         req.queue_time, (req.spec_verify_ct, req.spec_draft_tokens, req.spec_accepted_tokens),
                         logprobs, req.embedding)
