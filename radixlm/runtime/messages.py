"""Messages between the front (Engine / tokenizer manager) and the scheduler. Plain dataclasses of
Python values, so the serving layer can send them across processes unchanged."""
from __future__ import annotations

import operator
from dataclasses import dataclass, field, fields
from typing import Any

from radixlm.runtime.multimodal.inputs import MultimodalInputs
from radixlm.runtime.sampling.sampling_params import SamplingParams
from radixlm.runtime.sampling.thinking_budget import ThinkingBudget


@dataclass(frozen=True)
class BootstrapInfo:
    """Prefill/decode disaggregation (SGLang's request fields): the prefill server's bootstrap server and the room
    both servers know the request's KV by (set by the router, one room per sample)."""

    host: str
    port: int
    room: int


@dataclass
class TokenizedGenerateReqInput:
    """Set by the front after validation; the scheduler trusts it."""

    rid: str
    input_ids: list[int]
    sampling_params: SamplingParams  # normalized and verified
    return_logprob: bool = False
    logprob_start_len: int = -1  # -1: output logprobs only; k >= 0: prompt logprobs from position k
    top_logprobs_num: int = 0
    extra_key: str | None = None  # cache namespace: different keys never share KV
    stream: bool = False
    lora_id: str | None = None  # the LoRA adapter (LoraRef.lora_id) the request runs with; None: the base model
    # Media (preprocessed and hashed by the front); their positions in input_ids hold pad ids >= the vocabulary size.
    mm_inputs: MultimodalInputs | None = None
    priority: int | None = None  # higher first (--enable-priority-scheduling); None: the server's default
    timeout_s: float | None = None  # aborted this many seconds after the scheduler received it (None: no deadline)
    # A pooled output (--is-embedding) instead of tokens: the prompt is prefilled and nothing is sampled.
    embed: bool = False
    dimensions: int | None = None  # the pooled vector's first this many entries (Matryoshka), re-normalized
    token_type_ids: list[int] | None = None  # per prompt token (an encoder's sentence pairs); None: all 0
    # With return_logprob: the logprobs of these tokens as the next token (SGLang's token_ids_logprob; /v1/score).
    token_ids_logprob: list[int] | None = None
    bootstrap: BootstrapInfo | None = None  # set on both servers of a disaggregated pair (else None)
    thinking: ThinkingBudget | None = None  # sampling_params.thinking_budget resolved (tags tokenized, prompt read)


@dataclass
class AbortReq:
    rids: list[str]  # one message for many (a client that leaves a large batch aborts all of it at once)


@dataclass
class ExpiredReqs:
    """Requests past a deadline, found by rank 0's loop (scheduler/deadlines.py) and aborted alike on every rank:
    (rid, message, HTTP status or None) each."""

    aborts: list[tuple[str, str, int | None]]


@dataclass
class ReqOutput:
    """One request's progress in one scheduler step (set by the scheduler)."""

    rid: str
    new_output_ids: list[int]  # tokens appended since the previous ReqOutput
    finished_reason: dict[str, Any] | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    num_retractions: int = 0
    # Drafts verified for the request so far, their tokens, and those kept (speculative decoding, jump-forward).
    spec_verify_ct: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    # Seconds from the scheduler receiving the request to its first admission into a prefill batch.
    queue_time: float | None = None
    # Logprob increments, each entry (logprob, token_id); top entries are lists of such pairs.
    input_token_logprobs: list[tuple[float | None, int]] = field(default_factory=list)
    input_top_logprobs: list[list[tuple[float, int]] | None] = field(default_factory=list)
    output_token_logprobs: list[tuple[float, int]] = field(default_factory=list)
    output_top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    embedding: list[float] | None = None  # an embed request's pooled output, when it finishes
    output_token_ids_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)

    def __reduce__(self):
        # Pickled as positional fields: every output crosses two process boundaries, and unpickling the default
        # form (a dict of all fields set per object) costs twice as much.
        return ReqOutput, _req_output_values(self)


_req_output_values = operator.attrgetter(*(f.name for f in fields(ReqOutput)))


_LOGPROB_FIELDS = ("input_token_logprobs", "input_top_logprobs", "output_token_logprobs", "output_top_logprobs",
                   "output_token_ids_logprobs")


@dataclass
class BatchReqOutput:
    """One scheduler step's outputs as parallel columns (row i: request rids[i]); what the scheduler sends, the
    detokenizer forwards and the fronts consume, one object per step instead of one per request per step.
    The columns that are rarely set (logprobs, spec stats, embeddings) are None while no row has one."""

    rids: list[str] = field(default_factory=list)
    new_output_ids: list[list[int]] = field(default_factory=list)
    finished_reasons: list[dict[str, Any] | None] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)
    completion_tokens: list[int] = field(default_factory=list)
    cached_tokens: list[int] = field(default_factory=list)
    num_retractions: list[int] = field(default_factory=list)
    queue_times: list[float | None] = field(default_factory=list)
    spec: list[tuple[int, int, int]] | None = None  # (verify_ct, draft_tokens, accepted_tokens) per row
    # Per row: (input_token, input_top, output_token, output_top, output_token_ids) logprob increments.
    logprobs: list[tuple[list, list, list, list, list]] | None = None
    embeddings: list[list[float] | None] | None = None

    def __len__(self) -> int:
        return len(self.rids)

    def add(self, rid: str, new_output_ids: list[int], finished_reason: dict[str, Any] | None, prompt_tokens: int,
            completion_tokens: int, cached_tokens: int, num_retractions: int = 0, queue_time: float | None = None,
            spec: tuple[int, int, int] = (0, 0, 0), logprobs: tuple[list, list, list, list, list] | None = None,
            embedding: list[float] | None = None) -> None:
        n = len(self.rids)
        self.rids.append(rid)
        self.new_output_ids.append(new_output_ids)
        self.finished_reasons.append(finished_reason)
        self.prompt_tokens.append(prompt_tokens)
        self.completion_tokens.append(completion_tokens)
        self.cached_tokens.append(cached_tokens)
        self.num_retractions.append(num_retractions)
        self.queue_times.append(queue_time)
        if spec[0] or self.spec is not None:
            if self.spec is None:
                self.spec = [(0, 0, 0)] * n
            self.spec.append(spec)
        if (logprobs is not None and any(logprobs)) or self.logprobs is not None:
            if self.logprobs is None:
                self.logprobs = [([], [], [], [], []) for _ in range(n)]
            self.logprobs.append(logprobs if logprobs is not None else ([], [], [], [], []))
        if embedding is not None or self.embeddings is not None:
            if self.embeddings is None:
                self.embeddings = [None] * n
            self.embeddings.append(embedding)

    def append(self, out: ReqOutput) -> None:
        self.add(out.rid, out.new_output_ids, out.finished_reason, out.prompt_tokens, out.completion_tokens,
                 out.cached_tokens, out.num_retractions, out.queue_time,
                 (out.spec_verify_ct, out.spec_draft_tokens, out.spec_accepted_tokens),
                 tuple(getattr(out, f) for f in _LOGPROB_FIELDS), out.embedding)

    @classmethod
    def of(cls, outputs: list[ReqOutput]) -> "BatchReqOutput":
        batch = cls()
        for out in outputs:
            batch.append(out)
        return batch

    def __getitem__(self, i: int) -> ReqOutput:
        """Row i as a ReqOutput (for tests and rare paths; the fronts read the columns)."""
        if not -len(self) <= i < len(self):
            raise IndexError(f"row {i} of a batch of {len(self)}")
        spec = self.spec[i] if self.spec is not None else (0, 0, 0)
        lps = self.logprobs[i] if self.logprobs is not None else ([], [], [], [], [])
        return ReqOutput(self.rids[i], self.new_output_ids[i], self.finished_reasons[i], self.prompt_tokens[i],
                         self.completion_tokens[i], self.cached_tokens[i], self.num_retractions[i], *spec,
                         self.queue_times[i], *lps[:4],
                         embedding=self.embeddings[i] if self.embeddings is not None else None,
                         output_token_ids_logprobs=lps[4])

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __reduce__(self):
        return BatchReqOutput, _batch_values(self)


_batch_values = operator.attrgetter(*(f.name for f in fields(BatchReqOutput)))


# ---------------------------------------------------------------------- server pipeline
# TokenizerManager -> Scheduler -> Detokenizer -> TokenizerManager, pickled over ZMQ.

# The step outputs' wire format (one BatchReqOutput per step): pickle 5 measured as cheap as msgpack for them, with
# no second encoding to keep in step with the dataclasses.
OUTPUT_PICKLE_PROTOCOL = 5


@dataclass
class DetokenizeInfo:
    """What the detokenizer needs to know about a request (set by the front; forwarded by the scheduler
    ahead of the request's first outputs)."""

    rid: str
    prompt_tail: list[int]  # the last prompt tokens, context for correct spacing of the first output
    skip_special_tokens: bool = True
    stop: list[str] = field(default_factory=list)
    no_stop_trim: bool = False

    @classmethod
    def from_req(cls, msg: TokenizedGenerateReqInput, tail: int = 5) -> "DetokenizeInfo":
        sp = msg.sampling_params
        ids = msg.input_ids
        if msg.mm_inputs is not None:  # pad ids are no tokens: the tail is the text before them
            media = {p for r in msg.mm_inputs.positions() for p in r if p >= len(ids) - tail}
            ids = [t for p, t in enumerate(ids) if p >= len(ids) - tail and p not in media]
        return cls(msg.rid, list(ids[-tail:]), sp.skip_special_tokens, list(sp.stop), sp.no_stop_trim)


@dataclass
class BatchTokenOutput:
    """Scheduler -> detokenizer, once per step with outputs. `new_reqs` are applied before `outputs`."""

    new_reqs: list[DetokenizeInfo]
    outputs: BatchReqOutput


@dataclass
class BatchStrOutput:
    """Detokenizer -> tokenizer manager: texts[i] is the cumulative text of row i's request."""

    outputs: BatchReqOutput
    texts: list[str]


@dataclass
class FlushCacheReq:
    pass


@dataclass
class FlushCacheReqOutput:
    success: bool


@dataclass
class GetInternalStateReq:
    pass


@dataclass
class GetInternalStateReqOutput:
    """Set by the scheduler: KV accounting (in tokens) and queue sizes."""

    state: dict[str, Any]


@dataclass
class SchedulerReady:
    """Sent once by the scheduler process after loading, over the launch pipe; `error` set if loading failed."""

    max_total_num_tokens: int = 0
    max_running_requests: int = 0
    vocab_size: int = 0
    context_len: int = 0
    model_path: str = ""
    architecture: str = ""
    model_type: str = ""
    embedding_dim: int = 0  # --is-embedding: the pooled output's size
    cross_encoder: bool = False  # --is-embedding: the pooled output is a sequence classifier's scores
    kv_cache: dict[str, Any] = field(default_factory=dict)  # the KV pool's layout (KVLayout.describe)
    error: str | None = None


@dataclass
class LoadLoRAAdapterReqInput:
    """Front -> scheduler: read an adapter into host memory (the front has checked the name and registers it on
    success)."""

    lora_name: str
    lora_path: str
    lora_id: str
    pinned: bool = False


@dataclass
class UnloadLoRAAdapterReqInput:
    """Front -> scheduler: drop an adapter once no queued or running request uses it (the front no longer accepts
    requests for it)."""

    lora_name: str
    lora_id: str


@dataclass
class LoRAUpdateOutput:
    """The scheduler's answer to a load or unload (SGLang's LoRAUpdateResult)."""

    lora_id: str  # the load's or unload's (the front matches answers by it: an unload is answered when it is done)
    success: bool
    error_message: str | None = None
    loaded_adapters: dict[str, str] = field(default_factory=dict)  # name -> path (filled in by the front)


@dataclass
class ShutdownReq:
    pass


# ---------------------------------------------------------------------- weights and memory (SGLang's names)
# The scheduler applies these once the requests before them have finished (or were aborted: abort_all_requests);
# requests sent after one wait until it is done. Each is answered with a WeightsReqOutput.


@dataclass
class UpdateWeightFromDiskReqInput:
    model_path: str  # a checkpoint of the served architecture (HF directory, GGUF file or alias)
    load_format: str | None = None  # None / auto / safetensors
    abort_all_requests: bool = False
    weight_version: str | None = None  # None: the update count
    flush_cache: bool = True


@dataclass
class UpdateWeightsFromTensorReqInput:
    named_tensors: list[tuple[str, Any]]  # (checkpoint name, whole tensor); any subset of the checkpoint's tensors
    load_format: str | None = None
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: str | None = None


@dataclass
class InitWeightsUpdateGroupReqInput:
    master_address: str
    master_port: int
    rank_offset: int  # this server's TP rank r joins the group as rank_offset + r (the trainer is rank 0)
    world_size: int
    group_name: str = "weight_update_group"
    backend: str = "nccl"


@dataclass
class UpdateWeightsFromDistributedReqInput:
    names: list[str]
    dtypes: list[str]  # "bfloat16", "torch.float32", ...
    shapes: list[list[int]]
    group_name: str = "weight_update_group"
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: str | None = None
    load_format: str | None = None


@dataclass
class DestroyWeightsUpdateGroupReqInput:
    group_name: str = "weight_update_group"


@dataclass
class ReleaseMemoryOccupationReqInput:
    tags: list[str] | None = None  # "kv_cache", "weights"; None: both


@dataclass
class ResumeMemoryOccupationReqInput:
    tags: list[str] | None = None


@dataclass
class WeightsReqOutput:
    """The answer to any of the above. success False: nothing changed (a refused update keeps the old weights)."""

    success: bool
    message: str
    weight_version: str = "default"
    num_paused_requests: int = 0  # requests aborted for the update (abort_all_requests)


WeightsReqInput = (UpdateWeightFromDiskReqInput | UpdateWeightsFromTensorReqInput | InitWeightsUpdateGroupReqInput
                   | UpdateWeightsFromDistributedReqInput | DestroyWeightsUpdateGroupReqInput
                   | ReleaseMemoryOccupationReqInput | ResumeMemoryOccupationReqInput)

# What the scheduler's inbox carries (from the front), and what it answers a control message with.
SchedulerInput = (TokenizedGenerateReqInput | AbortReq | ExpiredReqs | FlushCacheReq | GetInternalStateReq
                  | LoadLoRAAdapterReqInput | UnloadLoRAAdapterReqInput | ShutdownReq | WeightsReqInput)
ControlReply = FlushCacheReqOutput | GetInternalStateReqOutput | LoRAUpdateOutput | WeightsReqOutput
