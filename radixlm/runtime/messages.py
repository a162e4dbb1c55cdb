"""Messages between the front (Engine / tokenizer manager) and the scheduler. Plain dataclasses of
Python values, so the serving layer can send them across processes unchanged."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from radixlm.runtime.sampling.sampling_params import SamplingParams


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


@dataclass
class AbortReq:
    rid: str


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
    # Logprob increments, each entry (logprob, token_id); top entries are lists of such pairs.
    input_token_logprobs: list[tuple[float | None, int]] = field(default_factory=list)
    input_top_logprobs: list[list[tuple[float, int]] | None] = field(default_factory=list)
    output_token_logprobs: list[tuple[float, int]] = field(default_factory=list)
    output_top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
