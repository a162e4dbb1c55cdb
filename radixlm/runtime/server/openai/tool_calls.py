"""tools / tool_choice on /v1/chat/completions: what the chat template gets, the constraint for `required` and a
named function, and the tool_calls of the response (parsing lives in tool_parsers)."""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from radixlm.runtime.grammar.spec import GrammarSpec, InvalidGrammar, validate
from radixlm.runtime.server.errors import BadRequest
from radixlm.runtime.server.openai.protocol import ChatCompletionRequest, Tool
from radixlm.runtime.server.openai.tool_parsers import Parsed, StreamDelta, ToolCallStreamer, parse

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for function names


def resolve_format(parser: str, chat_template: Any) -> str:
    """The text format of the model's calls; `auto` reads the chat template (hermes when it says nothing)."""
    if parser in ("qwen25", "hermes"):
        return "hermes"
    if parser == "llama3":
        return "llama3"
    template = str(chat_template or "")
    if "<tool_call>" in template:
        return "hermes"
    if "<|python_tag|>" in template or "ipython" in template:
        return "llama3"
    return "hermes"


@dataclass
class ToolPlan:
    """How one chat request uses its tools."""

    template_tools: list[dict] | None  # given to the chat template; None: the model is not told about tools
    names: frozenset[str]
    fmt: str | None  # the format to parse calls from (json_array when constrained); None: no parsing
    json_schema: str | None  # the constraint that forces calls (required / a named function)


def _schema(tools: list[Tool], arg_key: str, single: bool) -> dict:
    """An array of calls; each item is one tool's name with arguments valid for that tool's parameters."""
    items = [{
        "type": "object",
        "properties": {"name": {"const": t.function.name},
                       arg_key: t.function.parameters if t.function.parameters else {"type": "object"}},
        "required": ["name", arg_key],
        "additionalProperties": False,
    } for t in tools]
    schema: dict = {"type": "array", "items": items[0] if len(items) == 1 else {"anyOf": items}, "minItems": 1}
    if single:
        schema["maxItems"] = 1
    return schema


def plan_tools(req: ChatCompletionRequest, parser: str, chat_template: Any) -> ToolPlan:
    """Validates tools / tool_choice (400 on misuse) and decides prompt, parsing and constraint.

    tool_choice "none" follows OpenAI ("the model will not call any tool"): the template is not given the
    tools and nothing is parsed, so the reply is plain content."""
    tools = req.tools or []
    names = [t.function.name for t in tools]
    for n in names:
        if not _NAME.match(n):
            raise BadRequest(f"tools: invalid function name {n!r}: use 1-64 letters, digits, '_' or '-'")
    if len(set(names)) != len(names):
        raise BadRequest("tools: function names must be unique")
    choice = req.tool_choice if req.tool_choice is not None else ("auto" if tools else "none")
    if choice != "none" and not tools:
        raise BadRequest("tool_choice: needs a non-empty tools list")
    if choice == "none":
        return ToolPlan(None, frozenset(), None, None)
    fmt = resolve_format(parser, chat_template)
    template_tools = [t.model_dump(exclude_none=True) for t in tools]
    if choice == "auto":
        return ToolPlan(template_tools, frozenset(names), fmt, None)
    if any(x is not None for x in (req.regex, req.json_schema, req.ebnf, req.response_format)):
        raise BadRequest("tool_choice: 'required' or a named function cannot be combined with "
                         "regex, json_schema, ebnf or response_format")
    if choice == "required":
        chosen = tools
    else:
        chosen = [t for t in tools if t.function.name == choice.function.name]
        if not chosen:
            raise BadRequest(f"tool_choice: function {choice.function.name!r} is not among the tools")
    for i, t in enumerate(tools):
        if t in chosen and t.function.parameters:
            try:  # named here, not as the combined schema the client never wrote
                validate(GrammarSpec("json_schema", json.dumps(t.function.parameters)))
            except InvalidGrammar as e:
                raise BadRequest(f"tools.{i}.function.parameters: {e}") from None
    arg_key = "parameters" if fmt == "llama3" else "arguments"  # the key each model family was trained on
    single = choice != "required" or not req.parallel_tool_calls
    schema = json.dumps(_schema(chosen, arg_key, single))
    return ToolPlan(template_tools, frozenset(t.function.name for t in chosen), "json_array", schema)


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def tool_message(plan: ToolPlan, text: str) -> tuple[str | None, list[dict] | None]:
    """(content, tool_calls) of a finished sample; tool_calls None when the model made none."""
    if plan.fmt is None:
        return text, None
    parsed: Parsed = parse(plan.fmt, text, plan.names)
    if not parsed.calls:
        return parsed.content, None
    calls = [{"id": new_call_id(), "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
             for c in parsed.calls]
    return parsed.content, calls


def finish_reason(reason: str | None, called: bool) -> str | None:
    """OpenAI reports tool_calls when the model stopped after calling; a cut-off output keeps `length`."""
    return "tool_calls" if called and reason == "stop" else reason


class StreamedTools:
    """Per-sample streaming of content and tool-call deltas, with one id per call."""

    def __init__(self, plan: ToolPlan):
        self.streamer = ToolCallStreamer(plan.fmt or "hermes", plan.names)

    def delta(self, text: str, final: bool) -> dict:
        d: StreamDelta = self.streamer.feed(text, final)
        out: dict = {}
        if d.content:
            out["content"] = d.content
        if d.calls:
            out["tool_calls"] = [{"index": c["index"], "id": new_call_id(), **c} if "type" in c else c for c in d.calls]
        return out

    @property
    def called(self) -> bool:
        return self.streamer.called
