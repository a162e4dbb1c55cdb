"""Request models of the OpenAI-compatible API (SGLang's field names, defaults and extras).

Types are checked here (pydantic); value ranges are left to the core's SamplingParams.verify so the
native and OpenAI APIs reject the same values with the same messages (the schema states them: Doc)."""
from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from radixlm.runtime.server.errors import BadRequest
from radixlm.runtime.server.native_protocol import (
    PRIORITY_DOC, TIMEOUT_DOC, Grammar, LogitBias, MinP, NonNegative, Penalty, Priority, Prompt, RepetitionPenalty,
    SampleCount, Stop, Temperature, Timeout, TokenId, TokenIds, TopK, TopLogprobs, TopP,
)
from radixlm.runtime.server.openapi import Doc, Int, at_most_one

Positive = Annotated[Int, Doc(minimum=1)]


class StreamOptions(BaseModel):
    include_usage: StrictBool = False
    continuous_usage_stats: StrictBool = False


class JsonSchemaFormat(BaseModel):
    name: StrictStr | None = None
    description: StrictStr | None = None
    schema_: dict[str, Any] = Field(alias="schema")
    strict: StrictBool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(json_schema_extra={"anyOf": [
        {"properties": {"type": {"enum": ["text", "json_object"]}}},
        {"required": ["json_schema"], "properties": {"json_schema": {"not": {"type": "null"}}}}]})

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    def constraint(self) -> str | None:
        """The JSON schema (as a string) the output must satisfy; None for plain text."""
        if self.type == "json_object":
            return '{"type": "object"}'
        if self.type == "json_schema":
            if self.json_schema is None:
                raise BadRequest("response_format: type json_schema needs a json_schema object")
            return json.dumps(self.json_schema.schema_)
        return None


_ONE_GRAMMAR = at_most_one("regex", "json_schema", "ebnf")


class _Sampling(BaseModel):
    """Fields shared by completions and chat; unknown fields are ignored, as OpenAI clients send extras."""

    model_config = ConfigDict(extra="ignore", json_schema_extra=_ONE_GRAMMAR)

    # A LoRA adapter's name (or SGLang's base:adapter) runs the request with that adapter.
    model: StrictStr | None = None
    lora_path: StrictStr | None = None  # SGLang's field: the adapter's name (overrides model)
    n: SampleCount = 1
    stop: Stop | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    seed: Int | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    frequency_penalty: Penalty = 0.0
    presence_penalty: Penalty = 0.0
    logit_bias: LogitBias | None = None
    user: StrictStr | None = None
    # SGLang extras
    top_k: TopK | None = None
    min_p: MinP | None = None
    repetition_penalty: RepetitionPenalty | None = None
    min_tokens: NonNegative = 0
    ignore_eos: StrictBool = False
    stop_token_ids: list[TokenId] | None = None
    no_stop_trim: StrictBool = False
    skip_special_tokens: StrictBool = True
    regex: Grammar | None = None
    json_schema: Grammar | dict[str, Any] | None = None
    response_format: ResponseFormat | None = None
    ebnf: Grammar | None = None
    rid: StrictStr | None = None
    extra_key: StrictStr | None = None
    priority: Priority | None = Field(None, description=PRIORITY_DOC)
    timeout_s: Timeout | None = Field(None, description=TIMEOUT_DOC)
    # Prefill/decode disaggregation (set by `radixlm router --pd-disaggregation`, on both servers of a pair).
    bootstrap_host: StrictStr | None = None
    bootstrap_port: StrictInt | None = None
    bootstrap_room: StrictInt | None = None

    def sampling_params(self, max_new_tokens: int) -> dict[str, Any]:
        sp: dict[str, Any] = {
            "max_new_tokens": max_new_tokens, "min_new_tokens": self.min_tokens, "n": self.n, "stop": self.stop,
            "stop_token_ids": self.stop_token_ids, "temperature": self.temperature, "top_p": self.top_p,
            "top_k": self.top_k, "min_p": self.min_p, "frequency_penalty": self.frequency_penalty,
            "presence_penalty": self.presence_penalty, "repetition_penalty": self.repetition_penalty,
            "ignore_eos": self.ignore_eos, "no_stop_trim": self.no_stop_trim,
            "skip_special_tokens": self.skip_special_tokens, "logit_bias": self.logit_bias, "seed": self.seed,
            "regex": self.regex, "json_schema": self.json_schema, "ebnf": self.ebnf,
        }
        if self.response_format is not None and (schema := self.response_format.constraint()) is not None:
            if self.json_schema is not None or self.regex is not None or self.ebnf is not None:
                raise BadRequest("response_format: cannot be combined with regex, json_schema or ebnf")
            sp["json_schema"] = schema
        return {k: v for k, v in sp.items() if v is not None}

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_Sampling):
    model_config = ConfigDict(json_schema_extra={**_ONE_GRAMMAR, "examples": [
        {"prompt": "Once upon a time", "max_tokens": 8}]})

    prompt: (Prompt | Annotated[list[Prompt], Doc(minItems=1)] | TokenIds
             | Annotated[list[TokenIds], Doc(minItems=1)])
    max_tokens: NonNegative | None = 16  # 0 only with echo
    echo: StrictBool = False
    logprobs: TopLogprobs | None = None
    best_of: Int | None = None
    suffix: StrictStr | None = None


class TextPart(BaseModel):
    type: Literal["text"]
    text: StrictStr


class ImageURL(BaseModel):
    url: Annotated[StrictStr, Doc(minLength=1)]  # a data URL or an http(s) URL (see --allowed-media-domains)
    detail: Literal["auto", "low", "high"] | None = None


class ImageURLPart(BaseModel):
    type: Literal["image_url"]
    image_url: ImageURL


class VideoURL(BaseModel):
    url: Annotated[StrictStr, Doc(minLength=1)]  # as ImageURL.url


class VideoURLPart(BaseModel):
    """A video (vLLM's and SGLang's extension of OpenAI's content parts)."""

    type: Literal["video_url"]
    video_url: VideoURL


ContentPart = Annotated[TextPart | ImageURLPart | VideoURLPart, Field(discriminator="type")]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # tool_calls, tool_call_id, name ... reach the chat template

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | list[ContentPart] | None = None

    def image_urls(self) -> list[str]:
        parts = self.content if isinstance(self.content, list) else []
        return [p.image_url.url for p in parts if isinstance(p, ImageURLPart)]

    def video_urls(self) -> list[str]:
        parts = self.content if isinstance(self.content, list) else []
        return [p.video_url.url for p in parts if isinstance(p, VideoURLPart)]

    def for_template(self, image_token: str | None = None, video_token: str | None = None) -> dict[str, Any]:
        """The message as the chat template takes it: an image (video) part becomes the model's image (video) token,
        on a line of its own, as LLaVA prompts put it."""
        d = self.model_dump(exclude_none=True)
        if isinstance(self.content, list):
            for token, urls, kind in ((image_token, self.image_urls(), "images"),
                                      (video_token, self.video_urls(), "videos")):
                if token is None and urls:
                    raise BadRequest(f"messages: this model does not take {kind}")
            d["content"] = "".join(p.text if isinstance(p, TextPart) else
                                   f"{image_token if isinstance(p, ImageURLPart) else video_token}\n"
                                   for p in self.content)
        elif self.content is None:
            d["content"] = ""
        if isinstance(calls := d.get("tool_calls"), list):
            d["tool_calls"] = [_template_call(c) for c in calls]
        return d


def _template_call(call: Any) -> Any:
    """OpenAI sends arguments as a JSON string; chat templates (HF convention) expect the object."""
    fn = call.get("function") if isinstance(call, dict) else None
    if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
        try:
            args = json.loads(fn["arguments"])
        except ValueError:
            return call
        return {**call, "function": {**fn, "arguments": args}}
    return call


class FunctionDefinition(BaseModel):
    name: Annotated[StrictStr, Doc(pattern="^[A-Za-z0-9_-]{1,64}$")]  # tool_calls checks it
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class Tool(BaseModel):
    type: Literal["function"]
    function: FunctionDefinition


class ToolChoiceFunction(BaseModel):
    name: StrictStr


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: ToolChoiceFunction


class ChatCompletionRequest(_Sampling):
    model_config = ConfigDict(json_schema_extra={
        **_ONE_GRAMMAR,
        "if": {"required": ["top_logprobs"], "properties": {"top_logprobs": {"type": "integer"}}},
        "then": {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}},
        "examples": [{"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8}]})

    messages: Annotated[list[ChatMessage], Doc(minItems=1)]
    max_tokens: Positive | None = None  # deprecated by OpenAI in favour of max_completion_tokens
    max_completion_tokens: Positive | None = None
    logprobs: StrictBool = False
    top_logprobs: TopLogprobs | None = None  # only with logprobs=true
    continue_final_message: StrictBool = False
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None  # default: auto with tools
    parallel_tool_calls: StrictBool = True
    separate_reasoning: StrictBool = True  # with --reasoning-parser: reasoning in reasoning_content (SGLang's field)
    # vLLM's field: reasoning tokens before the end of the reasoning block is forced (sampling_params.thinking_budget)
    thinking_token_budget: Positive | None = None
