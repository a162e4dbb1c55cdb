"""tools / tool_choice on /v1/chat/completions: what the chat template gets, the constraint for `required`, a
named function and parallel_tool_calls=false, and the tool_calls of the response (parsing lives in
radixlm.runtime.parsers.tool_calls)."""
from __future__ import annotations

import functools
import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from radixlm.runtime.grammar.spec import GrammarSpec, InvalidGrammar, compiler_message, validate
from radixlm.runtime.parsers.tool_calls import (
    JSON_ARRAY_FORMAT, StreamDelta, ToolCallStreamer, ToolSpec, get_format, parse, resolve_parser,
)
from radixlm.runtime.parsers.tool_calls.json_array import JsonArray
from radixlm.runtime.server.errors import BadRequest
from radixlm.runtime.server.openai.protocol import ChatCompletionRequest, Tool

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for function names


def resolve_format(parser: str, chat_template: Any) -> str:
    """The text format of the model's calls (a --tool-call-parser value); `auto` reads the chat template (hermes
    when it says nothing)."""
    return resolve_parser(parser, str(chat_template or ""))


@dataclass
class ToolPlan:
    """How one chat request uses its tools."""

    template_tools: list[dict] | None  # given to the chat template; None: the model is not told about tools
    names: frozenset[str]
    fmt: str | None  # the format to parse calls from (json_array when constrained to it); None: no parsing
    json_schema: str | None  # the JSON-array constraint that forces calls (required / a named function)
    ebnf: str | None = None  # the constraint in the family's own format (xgrammar structural tags, as EBNF)
    parameters: dict[str, dict | None] = field(default_factory=dict)  # name -> parameters schema
    max_calls: int | None = None  # 1 under parallel_tool_calls=false
    forced: bool = False  # constrained to calls from the first token (required / a named function): no reasoning

    def sampling_params(self) -> dict[str, Any]:
        """What the plan adds to the request's sampling params: the constraint, and keeping special tokens in the
        text when the format's tags are special tokens."""
        out: dict[str, Any] = {}
        if self.ebnf is not None:
            out["ebnf"] = self.ebnf
        elif self.json_schema is not None:
            out["json_schema"] = self.json_schema
        if self.fmt is not None and get_format(self.fmt).special_markers:
            out["skip_special_tokens"] = False
        return out

    @property
    def tools(self) -> dict[str, dict | None]:
        return {n: self.parameters.get(n) for n in self.names}


@functools.lru_cache(maxsize=256)
def _structural_ebnf(structural_tag: str) -> str:
    """The EBNF of a structural tag (the grammar backend compiles EBNF against the vocabulary)."""
    import xgrammar as xgr

    try:
        return str(xgr.Grammar.from_structural_tag(structural_tag))
    except Exception as e:  # noqa: BLE001 - xgrammar raises RuntimeError / ValueError subclasses
        raise InvalidGrammar(compiler_message(e)) from None


def _family_constraint(fmt: str, chosen: list[ToolSpec], forced: bool, parallel: bool) -> str | None:
    """The EBNF of calls in the family's own format; None when xgrammar's structural tags cannot write it.
    forced: calls and nothing else; else free text and at most one call."""
    tags = get_format(fmt).call_tags(chosen)
    if tags is None:
        return None
    body = tags.forced(parallel) if forced else tags.optional_single()
    return _structural_ebnf(json.dumps({"type": "structural_tag", "format": body}))


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
    parameters = {t.function.name: t.function.parameters or None for t in tools}
    other = any(x is not None for x in (req.regex, req.json_schema, req.ebnf, req.response_format))
    if choice == "auto":
        if req.parallel_tool_calls:
            return ToolPlan(template_tools, frozenset(names), fmt, None, parameters=parameters)
        # at most one call: free text, then one call in the family's format, then the end (when xgrammar can
        # write the format and the request has no constraint of its own); the parse keeps the first call anyway
        ebnf = None if other else _constraint(fmt, tools, tools, forced=False, parallel=False)
        return ToolPlan(template_tools, frozenset(names), fmt, None, ebnf, parameters, max_calls=1)
    if other:
        raise BadRequest("tool_choice: 'required' or a named function cannot be combined with "
                         "regex, json_schema, ebnf or response_format")
    if choice == "required":
        chosen = tools
    else:
        chosen = [t for t in tools if t.function.name == choice.function.name]
        if not chosen:
            raise BadRequest(f"tool_choice: function {choice.function.name!r} is not among the tools")
    single = choice != "required" or not req.parallel_tool_calls
    max_calls = 1 if single else None
    names_chosen = frozenset(t.function.name for t in chosen)
    ebnf = _constraint(fmt, tools, chosen, forced=True, parallel=not single)
    if ebnf is not None:
        return ToolPlan(template_tools, names_chosen, fmt, None, ebnf, parameters, max_calls, forced=True)
    arg_key = "parameters" if fmt == "llama3" else "arguments"  # the key each model family was trained on
    schema = JsonArray.schema([ToolSpec(t.function.name, t.function.parameters) for t in chosen], single, arg_key)
    return ToolPlan(template_tools, names_chosen, JSON_ARRAY_FORMAT, schema, None, parameters, max_calls,
                    forced=True)


def _constraint(fmt: str, tools: list[Tool], chosen: list[Tool], forced: bool, parallel: bool) -> str | None:
    """The family-format constraint over `chosen`; None where the format cannot be written as structural tags
    (400 for a parameters schema that does not compile at all)."""
    for i, t in enumerate(tools):
        if t in chosen and t.function.parameters:
            try:  # named here, not as the combined grammar the client never wrote
                validate(GrammarSpec("json_schema", json.dumps(t.function.parameters)))
            except InvalidGrammar as e:
                raise BadRequest(f"tools.{i}.function.parameters: {e}") from None
    specs = [ToolSpec(t.function.name, t.function.parameters or None) for t in chosen]
    try:
        return _family_constraint(fmt, specs, forced, parallel)
    except InvalidGrammar:
        return None  # a schema the format's structural tags cannot hold (an XML style's limits): the JSON array


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def tool_message(plan: ToolPlan, text: str) -> tuple[str | None, list[dict] | None]:
    """(content, tool_calls) of a finished sample; tool_calls None when the model made none."""
    if plan.fmt is None:
        return text, None
    parsed = parse(plan.fmt, text, plan.tools, plan.max_calls)
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
        self.streamer = ToolCallStreamer(plan.fmt or "hermes", plan.tools, plan.max_calls)

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
