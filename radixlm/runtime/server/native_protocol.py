"""Request models of the native API (SGLang's field names). They type-check the request and document it in
the OpenAPI schema; value ranges are left to SamplingParams.verify and RequestBuilder, which the offline
Engine shares, so both reject the same values with the same messages."""
from __future__ import annotations

from typing import Any, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

Number = Union[StrictInt, StrictFloat]


class SamplingParamsInput(BaseModel):
    """The fields of radixlm.runtime.sampling.SamplingParams (a test keeps the two in step); `seed` is an alias
    of `sampling_seed`."""

    model_config = ConfigDict(extra="forbid")

    max_new_tokens: StrictInt | None = None
    min_new_tokens: StrictInt | None = None
    stop: StrictStr | list[StrictStr] | None = None
    stop_token_ids: list[StrictInt] | None = None
    temperature: Number | None = None
    top_p: Number | None = None
    top_k: StrictInt | None = None
    min_p: Number | None = None
    frequency_penalty: Number | None = None
    presence_penalty: Number | None = None
    repetition_penalty: Number | None = None
    n: StrictInt | None = None
    ignore_eos: StrictBool | None = None
    skip_special_tokens: StrictBool | None = None
    spaces_between_special_tokens: StrictBool | None = None
    no_stop_trim: StrictBool | None = None
    logit_bias: dict[StrictStr, Number] | None = None
    sampling_seed: StrictInt | None = None
    seed: StrictInt | None = None
    json_schema: StrictStr | dict[str, Any] | None = None
    regex: StrictStr | None = None
    ebnf: StrictStr | None = None
    stream_interval: StrictInt | None = None


class GenerateReqInput(BaseModel):
    """POST /generate. A list in `text` or `input_ids` is a batch; the per-request fields then take either one
    value for all prompts or a list with one entry per prompt."""

    model_config = ConfigDict(extra="forbid")

    text: StrictStr | list[StrictStr] | None = None
    input_ids: list[StrictInt] | list[list[StrictInt]] | None = None
    sampling_params: SamplingParamsInput | list[SamplingParamsInput] | None = None
    return_logprob: StrictBool | list[StrictBool] = False
    logprob_start_len: StrictInt | list[StrictInt] | None = None
    top_logprobs_num: StrictInt | list[StrictInt] | None = None
    return_text_in_logprobs: StrictBool = False
    stream: StrictBool = False
    rid: StrictStr | list[StrictStr] | None = None
    extra_key: StrictStr | None = Field(None, description="a namespace for the radix cache: only requests with "
                                                          "the same extra_key share cached prefixes")

    def sampling_dicts(self) -> dict | list[dict] | None:
        sp = self.sampling_params
        if isinstance(sp, list):
            return [p.model_dump(exclude_unset=True) for p in sp]
        return None if sp is None else sp.model_dump(exclude_unset=True)


class AbortReq(BaseModel):
    """POST /abort_request: one request by rid, or every request."""

    model_config = ConfigDict(extra="forbid")

    rid: StrictStr | None = None
    abort_all: StrictBool = False
