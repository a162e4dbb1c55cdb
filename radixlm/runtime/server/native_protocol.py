"""Request models of the native API (SGLang's field names). They type-check the request and document it in
the OpenAPI schema; value ranges are left to SamplingParams.verify and RequestBuilder, which the offline
Engine shares, so both reject the same values with the same messages (the schema states those ranges: Doc)."""
from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from radixlm.runtime.args.choices import MAX_PRIORITY
from radixlm.runtime.front import MAX_GRAMMAR_CHARS, MAX_N, MAX_STOP_CHARS, MAX_STOP_STRINGS
from radixlm.runtime.server.openapi import LOGPROBS_MAX, Doc, Int, Number, TokenId, at_most_one, present

# The ranges SamplingParams.verify and RequestBuilder enforce (test_openapi_schema.py holds the two together).
NonNegative = Annotated[Int, Doc(minimum=0)]
Temperature = Annotated[Number, Doc(minimum=0)]
TopP = Annotated[Number, Doc(exclusiveMinimum=0, maximum=1)]
TopK = Annotated[Int, Doc(minimum=-1, **{"not": {"const": 0}})]  # -1: the whole vocabulary
MinP = Annotated[Number, Doc(minimum=0, maximum=1)]
Penalty = Annotated[Number, Doc(minimum=-2, maximum=2)]  # frequency_penalty, presence_penalty
RepetitionPenalty = Annotated[Number, Doc(exclusiveMinimum=0, maximum=2)]
SampleCount = Annotated[Int, Doc(minimum=1, maximum=MAX_N)]
TopLogprobs = Annotated[Int, Doc(minimum=0, maximum=LOGPROBS_MAX)]
LogprobStart = Annotated[Int, Doc(minimum=-1)]  # -1: output tokens only
StopString = Annotated[StrictStr, Doc(maxLength=MAX_STOP_CHARS)]
Stop = StopString | Annotated[list[StopString], Doc(maxItems=MAX_STOP_STRINGS)]
Grammar = Annotated[StrictStr, Doc(maxLength=MAX_GRAMMAR_CHARS)]
# JSON object keys are strings: a token id in decimal (SamplingParams accepts a few more spellings).
LogitBias = Annotated[dict[StrictStr, Number], Doc(propertyNames={"pattern": "^[0-9]+$"})]
Prompt = Annotated[StrictStr, Doc(minLength=1)]  # a prompt that tokenizes to nothing is refused
TokenIds = Annotated[list[TokenId], Doc(minItems=1)]
ImageItem = Annotated[StrictStr, Doc(minLength=1)]
Priority = Annotated[Int, Doc(minimum=-MAX_PRIORITY, maximum=MAX_PRIORITY)]
Timeout = Annotated[Number, Doc(exclusiveMinimum=0)]
PRIORITY_DOC = ("higher first with --enable-priority-scheduling (a lower-priority running request may be preempted); "
                "unset: --default-priority-value; ignored by a server without priority scheduling (or refused with "
                "503 under --abort-on-priority-when-disabled)")
TIMEOUT_DOC = ("seconds after the server receives the request at which it is aborted wherever it is (queued or "
               "running): finish_reason abort, with the output so far")


class SamplingParamsInput(BaseModel):
    """The fields of radixlm.runtime.sampling.SamplingParams (a test keeps the two in step); `seed` is an alias
    of `sampling_seed`."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={
        "allOf": [at_most_one("regex", "json_schema", "ebnf"), at_most_one("seed", "sampling_seed")]})

    max_new_tokens: NonNegative | None = None
    min_new_tokens: NonNegative | None = None
    stop: Stop | None = None
    stop_token_ids: list[TokenId] | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    min_p: MinP | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    repetition_penalty: RepetitionPenalty | None = None
    n: SampleCount | None = None
    ignore_eos: StrictBool | None = None
    skip_special_tokens: StrictBool | None = None
    spaces_between_special_tokens: StrictBool | None = None
    no_stop_trim: StrictBool | None = None
    logit_bias: LogitBias | None = None
    sampling_seed: Int | None = None
    seed: Int | None = None
    json_schema: Grammar | dict[str, Any] | None = None
    regex: Grammar | None = None
    ebnf: Grammar | None = None
    stream_interval: Annotated[Int, Doc(minimum=1)] | None = None
    # Reasoning tokens before the reasoning block's end tag is forced (SGLang's thinking_budget; --reasoning-parser).
    thinking_budget: Annotated[Int, Doc(minimum=1)] | None = None


class GenerateReqInput(BaseModel):
    """POST /generate. A list in `text` or `input_ids` is a batch; the per-request fields then take either one
    value for all prompts or a list with one entry per prompt."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={
        "oneOf": [present("text"), present("input_ids")],
        "examples": [{"text": "The capital of France is", "sampling_params": {"temperature": 0, "max_new_tokens": 8}}]})

    text: Prompt | Annotated[list[Prompt], Doc(minItems=1)] | None = None
    input_ids: TokenIds | Annotated[list[TokenIds], Doc(minItems=1)] | None = None
    sampling_params: SamplingParamsInput | list[SamplingParamsInput] | None = None
    return_logprob: StrictBool | list[StrictBool] = False
    logprob_start_len: LogprobStart | list[LogprobStart] | None = None
    top_logprobs_num: TopLogprobs | list[TopLogprobs] | None = None
    return_text_in_logprobs: StrictBool = False
    stream: StrictBool = False
    # An image: an http(s) URL, a data URL, base64 data or a file path (under --allowed-local-media-path). One prompt
    # takes an image or a list of them; a batch a list with an entry per prompt. Each fills an image token of the prompt.
    image_data: ImageItem | list[ImageItem | list[ImageItem] | None] | None = None
    # Videos, as image_data (models that take video: Qwen2-VL); each fills a video token of the prompt.
    video_data: ImageItem | list[ImageItem | list[ImageItem] | None] | None = None
    rid: StrictStr | list[StrictStr] | None = None
    extra_key: StrictStr | None = Field(None, description="a namespace for the radix cache: only requests with "
                                                          "the same extra_key share cached prefixes")
    lora_path: StrictStr | list[StrictStr | None] | None = Field(
        None, description="a loaded LoRA adapter's name (or for a batch one per prompt, null: the base model)")
    priority: Priority | list[Priority] | None = Field(None, description=PRIORITY_DOC)
    timeout_s: Timeout | list[Timeout] | None = Field(None, description=TIMEOUT_DOC)
    # Prefill/decode disaggregation (set by `radixlm router --pd-disaggregation`, on both servers of a pair).
    bootstrap_host: StrictStr | None = Field(None, description="the prefill server's bootstrap host")
    bootstrap_port: StrictInt | None = Field(None, description="the prefill server's bootstrap port")
    bootstrap_room: StrictInt | None = Field(None, description="the request's room (samples take room + index)")

    def sampling_dicts(self) -> dict | list[dict] | None:
        sp = self.sampling_params
        if isinstance(sp, list):
            return [p.model_dump(exclude_unset=True) for p in sp]
        return None if sp is None else sp.model_dump(exclude_unset=True)


class LoadLoRAAdapterReq(BaseModel):
    """POST /load_lora_adapter: read a PEFT adapter directory and serve it under lora_name."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={
        "examples": [{"lora_name": "my-adapter", "lora_path": "/adapters/my-adapter"}]})

    lora_name: StrictStr
    lora_path: StrictStr
    pinned: StrictBool = False


class UnloadLoRAAdapterReq(BaseModel):
    """POST /unload_lora_adapter: stop serving an adapter (answered once the requests using it have finished)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"lora_name": "my-adapter"}]})

    lora_name: StrictStr


class AbortReq(BaseModel):
    """POST /abort_request: one request by rid, or every request."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"anyOf": [
        {"required": ["rid"], "properties": {"rid": {"type": "string", "minLength": 1}}},
        {"required": ["abort_all"], "properties": {"abort_all": {"const": True}}}],
        "examples": [{"rid": "0123456789abcdef"}]})

    rid: StrictStr | None = None
    abort_all: StrictBool = False
