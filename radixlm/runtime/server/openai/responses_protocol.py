"""Request model of /v1/responses (OpenAI's Responses API), its translation into a chat request (the chat pipeline
runs it), and the shapes of the Response object and its output items (openai.types.responses)."""
from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, StrictBool, StrictStr, Tag

from radixlm.runtime.server.errors import BadRequest
from radixlm.runtime.server.native_protocol import Temperature, TopP
from radixlm.runtime.server.openai.protocol import (
    ChatCompletionRequest, ChatMessage, FunctionDefinition, JsonSchemaFormat, NamedToolChoice, ResponseFormat, Tool,
    ToolChoiceFunction,
)
from radixlm.runtime.server.openapi import integer
from radixlm.runtime.server.output_blocks import Block, BlockKind

Positive = integer(ge=1)
# OpenAI's bounds: 16 pairs, keys up to 64 characters, values up to 512 (stored with the response).
Metadata = Annotated[dict[Annotated[StrictStr, Field(max_length=64)], Annotated[StrictStr, Field(max_length=512)]],
                     Field(max_length=16)]


class InputText(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["input_text"]
    text: StrictStr


class OutputText(BaseModel):
    """An assistant message's text, as a client sends a previous output back (annotations, logprobs ignored)."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["output_text"]
    text: StrictStr


class Refusal(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["refusal"]
    refusal: StrictStr


class InputImage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["input_image"]
    image_url: Annotated[StrictStr, Field(min_length=1)] | None = None  # a data URL or an http(s) URL
    file_id: StrictStr | None = None
    detail: Literal["low", "high", "auto", "original"] | None = None


ContentPart = Annotated[InputText | OutputText | Refusal | InputImage, Field(discriminator="type")]


class MessageItem(BaseModel):
    model_config = ConfigDict(extra="ignore")  # id, status, phase

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: StrictStr | list[ContentPart]


class FunctionCallItem(BaseModel):
    model_config = ConfigDict(extra="ignore")  # id, status

    type: Literal["function_call"]
    call_id: Annotated[StrictStr, Field(min_length=1)]
    name: Annotated[StrictStr, Field(min_length=1)]
    arguments: StrictStr


class FunctionCallOutputItem(BaseModel):
    model_config = ConfigDict(extra="ignore")  # id, status

    type: Literal["function_call_output"]
    call_id: Annotated[StrictStr, Field(min_length=1)]
    output: StrictStr | list[InputText]


class ReasoningItem(BaseModel):
    """A reasoning item sent back from an earlier output: not put in the prompt (chat templates drop the reasoning
    of earlier turns too)."""

    model_config = ConfigDict(extra="allow")

    type: Literal["reasoning"]


def _item_type(v: Any) -> str:
    return v.get("type", "message") if isinstance(v, dict) else getattr(v, "type", "message")


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")] | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")] | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(_item_type)]


class FunctionTool(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["function"]
    name: Annotated[StrictStr, Field(pattern="^[A-Za-z0-9_-]{1,64}$")]
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None

    def chat_tool(self) -> Tool:
        return Tool(type="function", function=FunctionDefinition(
            name=self.name, description=self.description, parameters=self.parameters, strict=self.strict))


class FunctionToolChoice(BaseModel):
    type: Literal["function"]
    name: StrictStr


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["text", "json_object", "json_schema"]
    name: StrictStr | None = None
    description: StrictStr | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: StrictBool | None = None


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")  # verbosity

    format: TextFormat | None = None


class ResponsesRequest(BaseModel):
    """Unknown fields are ignored (include, prompt_cache_key, service_tier, ...), as OpenAI clients send extras."""

    model_config = ConfigDict(extra="ignore", json_schema_extra={"examples": [
        {"input": "Say hello.", "max_output_tokens": 8}]})

    model: StrictStr | None = None
    input: StrictStr | list[InputItem] | None = None
    instructions: StrictStr | None = None
    max_output_tokens: Positive | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionToolChoice | None = None
    parallel_tool_calls: StrictBool = True
    text: TextConfig | None = None
    store: StrictBool = True
    stream: StrictBool = False
    previous_response_id: StrictStr | None = None
    metadata: Metadata | None = None
    user: StrictStr | None = None
    # Accepted and echoed; the reasoning items come from the server's --reasoning-parser whatever the effort asked.
    reasoning: dict[str, Any] | None = None
    # As on chat (vLLM's field): the reasoning's cap in tokens. reasoning.effort stays a hint, as SGLang and vLLM
    # take it (the chat template's), not a budget.
    thinking_token_budget: Positive | None = None
    truncation: Literal["auto", "disabled"] | None = None
    background: StrictBool = False

    def response_format(self) -> ResponseFormat | None:
        fmt = self.text.format if self.text is not None else None
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object":
            return ResponseFormat(type="json_object")
        if fmt.schema_ is None:
            raise BadRequest("text.format.schema: required for type json_schema")
        return ResponseFormat(type="json_schema", json_schema=JsonSchemaFormat(
            name=fmt.name, description=fmt.description, schema=fmt.schema_, strict=fmt.strict))

    def to_chat(self, history: tuple[ChatMessage, ...], rid: str) -> tuple[ChatCompletionRequest, list[ChatMessage]]:
        """The chat request that runs this one after `history` (a stored conversation), and this request's input
        as chat messages (what a continuation of it will need)."""
        if self.background:
            raise BadRequest("background: background responses are not supported")
        new = input_messages(self.input)
        system = [ChatMessage(role="system", content=self.instructions)] if self.instructions else []
        choice = self.tool_choice
        if isinstance(choice, FunctionToolChoice):
            choice = NamedToolChoice(type="function", function=ToolChoiceFunction(name=choice.name))
        req = ChatCompletionRequest(
            messages=[*system, *history, *new], max_completion_tokens=self.max_output_tokens,
            temperature=self.temperature, top_p=self.top_p, model=self.model, user=self.user, rid=rid,
            tools=[t.chat_tool() for t in self.tools] if self.tools else None, tool_choice=choice,
            parallel_tool_calls=self.parallel_tool_calls, response_format=self.response_format(),
            thinking_token_budget=self.thinking_token_budget)
        return req, new


def _content(content: str | list, role: str) -> str | list[dict]:
    if isinstance(content, str):
        return content
    parts: list[dict] = []
    for i, p in enumerate(content):
        if isinstance(p, InputImage):
            if role != "user":
                raise BadRequest(f"input: an input_image part belongs in a user message, not {role!r}")
            if p.image_url is None:
                raise BadRequest(f"input: content.{i}: input_image needs image_url (file_id is not supported)")
            parts.append({"type": "image_url", "image_url": {"url": p.image_url}})
        else:
            parts.append({"type": "text", "text": p.refusal if isinstance(p, Refusal) else p.text})
    return parts


def input_messages(inp: str | list | None) -> list[ChatMessage]:
    """Input items as chat messages: a function_call joins the assistant message before it (as tool_calls), a
    function_call_output is a tool message."""
    if inp is None:
        return []
    if isinstance(inp, str):
        return [ChatMessage(role="user", content=inp)]
    msgs: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    for item in inp:
        if isinstance(item, MessageItem):
            msgs.append({"role": item.role, "content": _content(item.content, item.role)})
        elif isinstance(item, FunctionCallItem):
            names[item.call_id] = item.name
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}}
            if msgs and msgs[-1]["role"] == "assistant":
                msgs[-1].setdefault("tool_calls", []).append(call)
            else:
                msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutputItem):
            out = item.output if isinstance(item.output, str) else "".join(p.text for p in item.output)
            msgs.append({"role": "tool", "tool_call_id": item.call_id, "content": out,
                         **({"name": names[item.call_id]} if item.call_id in names else {})})
    return [ChatMessage.model_validate(m) for m in msgs]


def output_message(blocks: list[Block]) -> ChatMessage | None:
    """A response's output as the assistant turn of a continuation."""
    text = "".join(b.text for b in blocks if b.kind is BlockKind.TEXT)
    calls = [{"id": b.call_id, "type": "function", "function": {"name": b.name, "arguments": b.text}}
             for b in blocks if b.kind is BlockKind.TOOL_CALL]
    if not text and not calls:
        return None
    return ChatMessage.model_validate({"role": "assistant", "content": text or None,
                                       **({"tool_calls": calls} if calls else {})})


def new_response_id() -> str:
    return f"resp_{uuid.uuid4().hex}"


_ID_PREFIX = {BlockKind.TOOL_CALL: "fc", BlockKind.TEXT: "msg", BlockKind.REASONING: "rs"}


def item_id(kind: BlockKind) -> str:
    return f"{_ID_PREFIX[kind]}_{uuid.uuid4().hex}"


def output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def reasoning_text(text: str) -> dict[str, Any]:
    return {"type": "reasoning_text", "text": text}


def output_item(block: Block, item: str, status: str) -> dict[str, Any]:
    """The output item of a block (a text block: an assistant message with one output_text part; a reasoning block:
    a reasoning item with one reasoning_text part and no summary)."""
    if block.kind is BlockKind.REASONING:
        return {"id": item, "type": "reasoning", "status": status, "summary": [],
                "content": [reasoning_text(block.text)] if status != "in_progress" else []}
    if block.kind is BlockKind.TOOL_CALL:
        return {"id": item, "type": "function_call", "status": status, "call_id": block.call_id, "name": block.name,
                "arguments": block.text}
    return {"id": item, "type": "message", "role": "assistant", "status": status,
            "content": [output_text(block.text)] if status != "in_progress" else []}


def usage(meta: dict | None, reasoning_tokens: int = 0) -> dict[str, Any] | None:
    if meta is None:
        return None
    prompt, completion = meta.get("prompt_tokens", 0), meta.get("completion_tokens", 0)
    return {"input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": meta.get("cached_tokens", 0) or 0, "cache_write_tokens": 0},
            "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": prompt + completion}


def status_of(finish: str | None) -> tuple[str, dict | None]:
    """(status, incomplete_details) from the chat finish reason."""
    if finish == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if finish == "abort":
        return "incomplete", None
    return "completed", None


def response_body(resp_id: str, created: float, req: ResponsesRequest, model: str, status: str,
                  output: list[dict], usage_: dict | None, incomplete: dict | None = None) -> dict[str, Any]:
    fmt = req.text.format.model_dump(by_alias=True, exclude_none=True) if req.text and req.text.format else None
    choice = req.tool_choice if req.tool_choice is not None else ("auto" if req.tools else "none")
    return {
        "id": resp_id, "object": "response", "created_at": created, "status": status, "background": False,
        "error": None, "incomplete_details": incomplete, "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens, "max_tool_calls": None, "model": model, "output": output,
        "parallel_tool_calls": req.parallel_tool_calls, "previous_response_id": req.previous_response_id,
        "reasoning": req.reasoning, "store": req.store, "temperature": req.temperature,
        "text": {"format": fmt or {"type": "text"}},
        "tool_choice": choice if isinstance(choice, str) else choice.model_dump(),
        "tools": [t.model_dump(exclude_none=True) for t in req.tools or []], "top_p": req.top_p,
        "truncation": req.truncation or "disabled", "usage": usage_, "user": req.user, "metadata": req.metadata or {},
    }
