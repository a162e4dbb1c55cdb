"""Anthropic Messages API: request models, prompt building (chat template) and response shapes."""
from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from radixlm.runtime.front import MAX_STOP_CHARS, MAX_STOP_STRINGS
from radixlm.runtime.server.errors import BadRequest
from radixlm.runtime.server.openapi import Doc, integer

# Anthropic's documented ranges; the sampler itself accepts wider ones (e.g. temperature up to 2).
Temperature = Annotated[float, Field(ge=0.0, le=1.0)]
TopP = Annotated[float, Field(gt=0.0, le=1.0)]
TopK = integer(ge=1)
MaxTokens = integer(ge=1)
# The front's limits on stop strings (checked there, with its messages).
StopSequence = Annotated[str, Field(min_length=1), Doc(maxLength=MAX_STOP_CHARS)]


class TextBlock(BaseModel):
    # cache_control, citations, ...: accepted and ignored, as they change nothing here.
    model_config = ConfigDict(extra="ignore")

    type: Literal["text"]
    text: str


class Base64ImageSource(BaseModel):
    type: Literal["base64"]
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
    data: Annotated[str, Field(min_length=1)]


class URLImageSource(BaseModel):
    type: Literal["url"]
    url: Annotated[str, Field(min_length=1)]


class ImageBlock(BaseModel):
    model_config = ConfigDict(extra="ignore")  # cache_control

    type: Literal["image"]
    source: Annotated[Base64ImageSource | URLImageSource, Field(discriminator="type")]

    def media(self) -> str:
        """The source as the front's media loader takes it."""
        src = self.source
        return f"data:{src.media_type};base64,{src.data}" if isinstance(src, Base64ImageSource) else src.url


ContentBlock = Annotated[TextBlock | ImageBlock, Field(discriminator="type")]


class InputMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]


class Metadata(BaseModel):
    model_config = ConfigDict(extra="forbid")

    user_id: str | None = None


def _first_from_user(schema: dict) -> None:
    # build_prompt refuses a conversation that does not open with the user.
    schema["prefixItems"] = [{**schema["items"], "properties": {"role": {"const": "user"}}}]


class Conversation(BaseModel):
    """The fields /v1/messages/count_tokens takes."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"model": "default", "messages": [{"role": "user", "content": "Say hello."}]}]})

    model: str
    messages: list[InputMessage] = Field(min_length=1, json_schema_extra=_first_from_user)
    system: str | list[TextBlock] | None = None


class MessagesRequest(Conversation):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"model": "default", "max_tokens": 8, "messages": [{"role": "user", "content": "Say hello."}]}]})

    max_tokens: MaxTokens
    stop_sequences: Annotated[list[StopSequence], Doc(maxItems=MAX_STOP_STRINGS)] | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    metadata: Metadata | None = None
    stream: bool = False
    # Accepted and ignored: hints about billing and provider-side caching that change no output here.
    service_tier: str | None = None
    cache_control: dict[str, Any] | None = None

    def sampling_params(self) -> dict[str, Any]:
        sp: dict[str, Any] = {"max_new_tokens": self.max_tokens, "stop": list(self.stop_sequences or [])}
        # Anthropic's default temperature is 1.0, which is also the sampler's default.
        for name in ("temperature", "top_p", "top_k"):
            value = getattr(self, name)
            if value is not None:
                sp[name] = value
        return sp


def parse(model: type[BaseModel], raw: bytes) -> Any:
    """Strict JSON validation: "1" is not an int, 1 is not a string; any problem is a BadRequest."""
    try:
        return model.model_validate_json(raw, strict=True)
    except ValidationError as e:
        raise BadRequest("; ".join(_describe(err) for err in e.errors()[:5])) from None


def _describe(err: dict) -> str:
    loc = ".".join(str(p) for p in err.get("loc", ()))
    return f"{loc}: {err['msg']}" if loc else err["msg"]


def _text(content: str | list[TextBlock | ImageBlock], image_token: str | None = None) -> str:
    if isinstance(content, str):
        return content
    if image_token is None and any(isinstance(b, ImageBlock) for b in content):
        raise BadRequest("messages: this model does not take images (image content block)")
    return "\n".join(b.text if isinstance(b, TextBlock) else image_token for b in content)


def images(conv: Conversation) -> list[str]:
    """The conversation's images in prompt order, as media sources."""
    return [b.media() for m in conv.messages if isinstance(m.content, list) for b in m.content
            if isinstance(b, ImageBlock)]


def build_prompt(tokenizer, conv: Conversation, image_token: str | None = None) -> str:
    """The templated prompt (an image block becomes the model's image token). A final assistant message is a prefill:
    generation continues its text."""
    turns: list[dict[str, str]] = []
    for m in conv.messages:
        text = _text(m.content, image_token)
        if turns and turns[-1]["role"] == m.role:
            # Anthropic merges consecutive turns of the same role.
            turns[-1]["content"] += "\n\n" + text
        else:
            turns.append({"role": m.role, "content": text})
    if turns[0]["role"] != "user":
        raise BadRequest("messages: the first message must use the user role")
    prefill = turns.pop()["content"] if turns[-1]["role"] == "assistant" else None
    if prefill is not None and prefill != prefill.rstrip():
        raise BadRequest("messages: final assistant content cannot end with trailing whitespace")
    system = _text(conv.system) if conv.system is not None else ""
    if system:
        turns.insert(0, {"role": "system", "content": system})
    if getattr(tokenizer, "chat_template", None) is None:
        raise BadRequest("the model's tokenizer has no chat template")
    try:
        prompt = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
    except Exception as e:  # noqa: BLE001 - jinja raises arbitrary errors (e.g. raise_exception in the template)
        raise BadRequest(f"cannot apply the chat template: {e}") from None
    return prompt + (prefill or "")


def new_message_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


def stop_info(finish_reason: dict, stop_sequences: list[str] | None) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) for a finished request's finish_reason."""
    if finish_reason["type"] == "length":
        return "max_tokens", None
    if finish_reason["type"] == "abort":
        return "abort", None
    matched = finish_reason.get("matched")
    if isinstance(matched, str) and matched in (stop_sequences or []):
        return "stop_sequence", matched
    return "end_turn", None


def usage(meta: dict) -> dict[str, int]:
    # As Anthropic counts: input_tokens excludes the prompt tokens read from the (radix) cache.
    cached = meta.get("cached_tokens", 0) or 0
    return {"input_tokens": meta["prompt_tokens"] - cached, "output_tokens": meta["completion_tokens"],
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}


def message_body(msg_id: str, model: str, content: list[dict], stop_reason: str | None, stop_sequence: str | None,
                 usage_: dict[str, int]) -> dict[str, Any]:
    return {"id": msg_id, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": stop_reason, "stop_sequence": stop_sequence, "usage": usage_}
