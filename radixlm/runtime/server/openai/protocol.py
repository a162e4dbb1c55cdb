"""Request models of the OpenAI-compatible API (SGLang's field names, defaults and extras).

Types are checked here (pydantic); value ranges are left to the core's SamplingParams.verify so the
native and OpenAI APIs reject the same values with the same messages."""
from __future__ import annotations

import re
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError

from radixlm.runtime.server.errors import BadRequest

Number = Union[StrictInt, StrictFloat]


class StreamOptions(BaseModel):
    include_usage: StrictBool = False
    continuous_usage_stats: StrictBool = False


class _Sampling(BaseModel):
    """Fields shared by completions and chat; unknown fields are ignored, as OpenAI clients send extras."""

    model_config = ConfigDict(extra="ignore")

    model: StrictStr | None = None
    n: StrictInt = 1
    stop: StrictStr | list[StrictStr] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    seed: StrictInt | None = None
    temperature: Number | None = None
    top_p: Number | None = None
    frequency_penalty: Number = 0.0
    presence_penalty: Number = 0.0
    logit_bias: dict[StrictStr, Number] | None = None
    user: StrictStr | None = None
    # SGLang extras
    top_k: StrictInt | None = None
    min_p: Number | None = None
    repetition_penalty: Number | None = None
    min_tokens: StrictInt = 0
    ignore_eos: StrictBool = False
    stop_token_ids: list[StrictInt] | None = None
    no_stop_trim: StrictBool = False
    skip_special_tokens: StrictBool = True
    regex: StrictStr | None = None
    json_schema: StrictStr | None = None
    ebnf: StrictStr | None = None
    rid: StrictStr | None = None
    extra_key: StrictStr | None = None

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
        return {k: v for k, v in sp.items() if v is not None}

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_Sampling):
    prompt: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]
    max_tokens: StrictInt | None = 16
    echo: StrictBool = False
    logprobs: StrictInt | None = None
    best_of: StrictInt | None = None
    suffix: StrictStr | None = None


class TextPart(BaseModel):
    type: Literal["text"]
    text: StrictStr


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # tool_calls, tool_call_id, name ... reach the chat template

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | list[TextPart] | None = None

    def for_template(self) -> dict[str, Any]:
        d = self.model_dump(exclude_none=True)
        if isinstance(self.content, list):
            d["content"] = "".join(p.text for p in self.content)
        elif self.content is None:
            d["content"] = ""
        return d


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage]
    max_tokens: StrictInt | None = None  # deprecated by OpenAI in favour of max_completion_tokens
    max_completion_tokens: StrictInt | None = None
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = None
    continue_final_message: StrictBool = False
    chat_template_kwargs: dict[str, Any] | None = None


_TYPE_TAG = re.compile(r"^(str|int|float|bool|dict|list|none)$|[\[\]]")


def parse(model: type[BaseModel], body: dict[str, Any]) -> Any:
    """Validates a request body; a type error becomes a 400 naming the field."""
    try:
        return model.model_validate(body)
    except ValidationError as e:
        errors = e.errors()
        root = errors[0]["loc"][0] if errors[0]["loc"] else "body"
        mine = [err for err in errors if err["loc"] and err["loc"][0] == root]
        if len(mine) == 1:
            # Union members add their type's name to the location: keep field names and indices only.
            loc = ".".join(str(p) for p in mine[0]["loc"] if isinstance(p, int) or not _TYPE_TAG.search(p))
            raise BadRequest(f"{loc}: {mine[0]['msg']}") from None
        msgs = "; ".join(dict.fromkeys(err["msg"] for err in mine))
        raise BadRequest(f"{root}: invalid value {str(body.get(root))[:100]!r} ({msgs})") from None
