"""Anthropic Messages API: request models and their translation into a chat request (the chat pipeline builds the
prompt: template, tools, checks); the response shapes are anthropic_render's."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from radixlm.runtime.front import MAX_STOP_CHARS, MAX_STOP_STRINGS
from radixlm.runtime.server.errors import BadRequest
from radixlm.runtime.server.openai.protocol import (
    ChatCompletionRequest, ChatMessage, FunctionDefinition, NamedToolChoice, Tool, ToolChoiceFunction,
)
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


class ToolUseBlock(BaseModel):
    """A call the assistant made, sent back in the conversation."""

    model_config = ConfigDict(extra="ignore")  # cache_control, caller

    type: Literal["tool_use"]
    id: Annotated[str, Field(min_length=1)]
    name: Annotated[str, Field(min_length=1)]
    input: dict[str, Any]


class ToolResultBlock(BaseModel):
    model_config = ConfigDict(extra="ignore")  # cache_control

    type: Literal["tool_result"]
    tool_use_id: Annotated[str, Field(min_length=1)]
    content: str | list[Annotated[TextBlock | ImageBlock, Field(discriminator="type")]] = ""
    is_error: bool = False


class ThinkingBlock(BaseModel):
    """Reasoning an earlier answer returned, sent back: not put in the prompt (chat templates drop the reasoning of
    earlier turns too)."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["thinking"]
    thinking: str
    signature: str


class RedactedThinkingBlock(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["redacted_thinking"]
    data: str


ContentBlock = Annotated[TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock
                         | RedactedThinkingBlock, Field(discriminator="type")]


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


class CustomTool(BaseModel):
    model_config = ConfigDict(extra="ignore")  # cache_control, input_examples, ...

    type: Literal["custom"] | None = None  # Anthropic's server tools (bash, web search, ...) are not served
    name: Annotated[str, Field(pattern="^[A-Za-z0-9_-]{1,64}$")]
    description: str | None = None
    input_schema: dict[str, Any]

    @field_validator("input_schema")
    @classmethod
    def _object(cls, v: dict[str, Any]) -> dict[str, Any]:
        if v.get("type") != "object":
            raise ValueError("the input schema must have type 'object'")
        return v


class ToolChoiceAuto(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["auto"]
    disable_parallel_tool_use: bool = False


class ToolChoiceAny(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["any"]
    disable_parallel_tool_use: bool = False


class ToolChoiceTool(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["tool"]
    name: str
    disable_parallel_tool_use: bool = False


class ToolChoiceNone(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["none"]


ToolChoice = Annotated[ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone, Field(discriminator="type")]

ThinkingDisplay = Literal["summarized", "omitted"]  # omitted: thinking blocks come back with empty text


class ThinkingEnabled(BaseModel):
    """Extended thinking. The budget is checked as Anthropic checks it and, with a --reasoning-parser whose reasoning
    block ends with a tag, enforced (sampling_params.thinking_budget); the reasoning counts toward max_tokens, as
    Anthropic counts it."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["enabled"]
    budget_tokens: integer(ge=1024)
    display: ThinkingDisplay | None = None


class ThinkingAdaptive(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["adaptive"]
    display: ThinkingDisplay | None = None


class ThinkingDisabled(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["disabled"]


ThinkingConfig = Annotated[ThinkingEnabled | ThinkingAdaptive | ThinkingDisabled, Field(discriminator="type")]


class Conversation(BaseModel):
    """The fields /v1/messages/count_tokens takes."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"model": "default", "messages": [{"role": "user", "content": "Say hello."}]}]})

    model: str
    messages: list[InputMessage] = Field(min_length=1, json_schema_extra=_first_from_user)
    system: str | list[TextBlock] | None = None
    tools: list[CustomTool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None

    def template_kwargs(self, toggle: str | None) -> dict[str, bool] | None:
        """The chat template's kwargs for `thinking`: the reasoning family's toggle (e.g. Qwen3's enable_thinking)
        on or off; None (the model's default) when it is not set or the family has no toggle."""
        if self.thinking is None or toggle is None:
            return None
        return {toggle: not isinstance(self.thinking, ThinkingDisabled)}

    @property
    def omit_thinking(self) -> bool:
        return getattr(self.thinking, "display", None) == "omitted"

    def to_chat(self, **fields: Any) -> ChatCompletionRequest:
        """The chat request of this conversation (a final assistant message continued), with `fields` added."""
        messages = chat_messages(self)
        last = messages[-1]
        prefill = last.role == "assistant"
        if prefill and getattr(last, "tool_calls", None):
            raise BadRequest("messages: the final assistant message cannot end with tool_use blocks; send their "
                             "tool_result blocks in a user message")
        if prefill and isinstance(last.content, str) and last.content != last.content.rstrip():
            raise BadRequest("messages: final assistant content cannot end with trailing whitespace")
        choice, parallel = self._tool_choice()
        tools = [Tool(type="function", function=FunctionDefinition(
            name=t.name, description=t.description, parameters=t.input_schema)) for t in self.tools or []]
        return ChatCompletionRequest(messages=messages, continue_final_message=prefill, tools=tools or None,
                                     tool_choice=choice, parallel_tool_calls=parallel, **fields)

    def _tool_choice(self) -> tuple[Any, bool]:
        c = self.tool_choice
        if c is None:
            return None, True
        if isinstance(c, ToolChoiceNone):
            return "none", True
        parallel = not c.disable_parallel_tool_use
        if isinstance(c, ToolChoiceAuto):
            return "auto", parallel
        if isinstance(c, ToolChoiceAny):
            return "required", parallel
        return NamedToolChoice(type="function", function=ToolChoiceFunction(name=c.name)), parallel


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

    def chat_request(self, msg_id: str, toggle: str | None = None, enforce_budget: bool = False
                     ) -> ChatCompletionRequest:
        """`toggle`: the chat_template_kwargs key of the server's reasoning family that `thinking` sets;
        enforce_budget: the family's reasoning ends with a tag, which thinking.budget_tokens then forces."""
        if isinstance(self.thinking, ThinkingEnabled) and self.thinking.budget_tokens >= self.max_tokens:
            raise BadRequest(f"thinking.budget_tokens: must be less than max_tokens ({self.max_tokens}), got "
                             f"{self.thinking.budget_tokens}")
        enabled = isinstance(self.thinking, ThinkingEnabled)
        budget = self.thinking.budget_tokens if enabled and enforce_budget else None
        # Anthropic's default temperature is 1.0, which is also the sampler's default.
        return self.to_chat(max_completion_tokens=self.max_tokens, stop=list(self.stop_sequences or []),
                            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, rid=msg_id,
                            model=self.model, chat_template_kwargs=self.template_kwargs(toggle),
                            thinking_token_budget=budget)


def parse(model: type[BaseModel], raw: bytes) -> Any:
    """Strict JSON validation: "1" is not an int, 1 is not a string; any problem is a BadRequest."""
    try:
        return model.model_validate_json(raw, strict=True)
    except ValidationError as e:
        raise BadRequest("; ".join(_describe(err) for err in e.errors()[:5])) from None


def _describe(err: dict) -> str:
    loc = ".".join(str(p) for p in err.get("loc", ()))
    return f"{loc}: {err['msg']}" if loc else err["msg"]


def _content(blocks: list) -> str | list[dict[str, Any]]:
    """Text and image blocks as chat content: text alone joined by newlines, else parts (an image part is the model's
    image token on a line of its own)."""
    if not any(isinstance(b, ImageBlock) for b in blocks):
        return "\n".join(b.text for b in blocks)
    parts: list[dict[str, Any]] = []
    for i, b in enumerate(blocks):
        if isinstance(b, ImageBlock):
            parts.append({"type": "image_url", "image_url": {"url": b.media()}})
        else:
            if i and not isinstance(blocks[i - 1], ImageBlock):
                parts.append({"type": "text", "text": "\n"})
            parts.append({"type": "text", "text": b.text})
    return parts


def _joined(a: str | list | None, b: str | list) -> str | list:
    if not a:
        return b
    if isinstance(a, str) and isinstance(b, str):
        return a + "\n\n" + b
    as_parts = [x if isinstance(x, list) else [{"type": "text", "text": x}] for x in (a, b)]
    return [*as_parts[0], {"type": "text", "text": "\n\n"}, *as_parts[1]]


def chat_messages(conv: Conversation) -> list[ChatMessage]:
    """The conversation as chat messages: the system prompt first; a tool_result block becomes a tool message (before
    the rest of its user turn); tool_use blocks become the assistant message's tool_calls; thinking blocks are
    dropped; consecutive turns of the same role merge, as Anthropic merges them."""
    if conv.messages[0].role != "user":
        raise BadRequest("messages: the first message must use the user role")
    msgs: list[dict[str, Any]] = []
    system = conv.system if isinstance(conv.system, str) or conv.system is None else "\n".join(
        b.text for b in conv.system)
    if system:
        msgs.append({"role": "system", "content": system})
    names: dict[str, str] = {}
    for m in conv.messages:
        blocks = [TextBlock(type="text", text=m.content)] if isinstance(m.content, str) else m.content
        for r in (b for b in blocks if isinstance(b, ToolResultBlock)):
            if m.role != "user":
                raise BadRequest("messages: tool_result blocks belong in user messages")
            content = _content(r.content if isinstance(r.content, list) else
                               [TextBlock(type="text", text=r.content)])
            if r.is_error and isinstance(content, str):
                content = "Error: " + content
            msgs.append({"role": "tool", "tool_call_id": r.tool_use_id, "content": content,
                         **({"name": names[r.tool_use_id]} if r.tool_use_id in names else {})})
        calls = []
        for u in (b for b in blocks if isinstance(b, ToolUseBlock)):
            if m.role != "assistant":
                raise BadRequest("messages: tool_use blocks belong in assistant messages")
            names[u.id] = u.name
            calls.append({"id": u.id, "type": "function", "function": {"name": u.name, "arguments": u.input}})
        thoughts = [b for b in blocks if isinstance(b, (ThinkingBlock, RedactedThinkingBlock))]
        if thoughts and m.role != "assistant":
            raise BadRequest("messages: thinking blocks belong in assistant messages")
        rest = [b for b in blocks if isinstance(b, (TextBlock, ImageBlock))]
        if not rest and not calls and any(isinstance(b, (ToolResultBlock, ThinkingBlock, RedactedThinkingBlock))
                                          for b in blocks):
            continue
        content = _content(rest)
        prev = msgs[-1] if msgs else None
        if prev is not None and prev["role"] == m.role:
            prev["content"] = _joined(prev["content"], content) if content else prev["content"]
            prev.setdefault("tool_calls", []).extend(calls)
        else:
            msgs.append({"role": m.role, "content": content, "tool_calls": calls})
    for d in msgs:
        if not d.get("tool_calls", True):
            del d["tool_calls"]
    return [ChatMessage.model_validate(d) for d in msgs]
