"""What the scheduler sends the front: ReqOutputs of the requests that finished or have tokens to stream, and the
queues of requests (waiting, running, the one prefilled in chunks) that the scheduler's parts share."""
from __future__ import annotations

from dataclasses import dataclass, field

from radixlm.runtime.messages import ReqOutput
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
    def __init__(self, config: OutputConfig):
        self.config = config
        self.outputs: list[ReqOutput] = []

    def stream_due(self, req: Req) -> bool:
        """The first token goes out at once (time to first token); later ones every stream_interval tokens."""
        interval = req.sampling_params.stream_interval or self.config.stream_interval
        return req.sent_len == 0 or len(req.output_ids) - req.sent_len >= interval

    def emit(self, req: Req) -> None:
        new = req.output_ids[req.sent_len :]
        req.sent_len = len(req.output_ids)
        self.outputs.append(ReqOutput(
            rid=req.rid,
            new_output_ids=new,
            finished_reason=req.finished_reason.to_json() if req.finished_reason else None,
            prompt_tokens=len(req.origin_input_ids),
            completion_tokens=len(req.output_ids),
            cached_tokens=req.cached_tokens,
            num_retractions=req.num_retractions,
            spec_verify_ct=req.spec_verify_ct,
            spec_draft_tokens=req.spec_draft_tokens,
            spec_accepted_tokens=req.spec_accepted_tokens,
            queue_time=req.queue_time,
            input_token_logprobs=req.input_token_logprobs,
            input_top_logprobs=req.input_top_logprobs,
            output_token_logprobs=req.output_token_logprobs,
            output_top_logprobs=req.output_top_logprobs,
            embedding=req.embedding,
            output_token_ids_logprobs=req.output_token_ids_logprobs,
        ))
        req.input_token_logprobs, req.input_top_logprobs = [], []
        req.output_token_logprobs, req.output_top_logprobs = [], []
        req.output_token_ids_logprobs = []
