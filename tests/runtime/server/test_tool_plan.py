"""tools / tool_choice on chat requests without a model: the plan (prompt, parsing, constraint), the message and
the streamed deltas made of a sample. The formats themselves: tests/runtime/parsers/tool_calls."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import xgrammar as xgr
from xgrammar.testing import _is_grammar_accept_string as accepts

from radixlm.runtime.model_loader.tokenizer import get_tokenizer
from radixlm.runtime.server.errors import BadRequest
from radixlm.runtime.server.openai.chat import chat_prompt_ids
from radixlm.runtime.server.openai.protocol import ChatCompletionRequest, ChatMessage
from radixlm.runtime.server.openai.tool_calls import (
    StreamedTools, ToolPlan, finish_reason, plan_tools, resolve_format, tool_message,
)

TOOLS = frozenset({"get_weather", "get_time"})
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time"}}


def test_streamed_tools_adds_one_id_per_call():
    st = StreamedTools(ToolPlan([], TOOLS, "hermes", None))  # positional, as other endpoints build it
    first = st.delta('<tool_call>{"name": "get_weather", "arguments": {"ci', False)["tool_calls"]
    assert first[0]["id"].startswith("call_") and first[0]["type"] == "function"
    assert "id" not in first[1] and first[1]["function"] == {"arguments": '{"ci'}


def req(**kw) -> ChatCompletionRequest:
    return ChatCompletionRequest(messages=[ChatMessage(role="user", content="hi")], **kw)


def test_plan_tools():
    assert plan_tools(req(), "auto", "").fmt is None  # no tools: nothing parsed
    p = plan_tools(req(tools=[WEATHER, TIME]), "auto", "{{ '<tool_call>' }}")
    assert p.fmt == "hermes" and p.sampling_params() == {} and p.names == TOOLS and len(p.template_tools) == 2
    assert p.tools == {"get_weather": WEATHER["function"]["parameters"], "get_time": None} and p.max_calls is None
    none = plan_tools(req(tools=[WEATHER], tool_choice="none"), "auto", "")
    assert none.template_tools is None and none.fmt is None


NAMED = {"type": "function", "function": {"name": "get_weather"}}
ONE = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TWO = ONE + '\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'


@pytest.mark.parametrize("kw,accepted,rejected", [
    ({"tool_choice": "required"}, [ONE, TWO], ["Hello.", ONE.replace('"Paris"', "1")]),
    ({"tool_choice": "required", "parallel_tool_calls": False}, [ONE], [TWO, "Hello."]),
    ({"tool_choice": NAMED}, [ONE], [TWO, ONE.replace("get_weather", "get_time").replace('"city": "Paris"', "")]),
    ({"parallel_tool_calls": False}, ["Hello.", "Sure. " + ONE], [TWO]),  # auto: at most one call
])
def test_the_constraint_is_the_family_format(kw, accepted, rejected):
    plan = plan_tools(req(tools=[WEATHER, TIME], **kw), "qwen25", "")
    assert plan.fmt == "qwen25" and plan.json_schema is None and set(plan.sampling_params()) == {"ebnf"}
    assert plan.max_calls == (None if kw == {"tool_choice": "required"} else 1)
    grammar = xgr.Grammar.from_ebnf(plan.ebnf)
    assert all(accepts(grammar, t) for t in accepted) and not any(accepts(grammar, t) for t in rejected)
    content, calls = tool_message(plan, accepted[-1])
    assert [c["function"]["name"] for c in calls][:1] == ["get_weather"]


def test_without_structural_tags_the_constraint_is_a_json_array():
    named = plan_tools(req(tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_time"}}),
                       "pythonic", "")
    schema = json.loads(named.json_schema)
    assert named.fmt == "json_array" and named.sampling_params() == {"json_schema": named.json_schema}
    assert schema["maxItems"] == 1 and named.names == {"get_time"}
    assert schema["items"]["properties"]["name"] == {"const": "get_time"}
    required = json.loads(plan_tools(req(tools=[WEATHER, TIME], tool_choice="required"), "pythonic", "").json_schema)
    assert "maxItems" not in required and len(required["items"]["anyOf"]) == 2
    assert required["items"]["anyOf"][0]["properties"]["arguments"] == WEATHER["function"]["parameters"]
    auto = plan_tools(req(tools=[WEATHER], parallel_tool_calls=False), "pythonic", "")
    assert auto.sampling_params() == {} and auto.max_calls == 1  # the parse keeps the first call


def test_formats_whose_tags_are_special_tokens_keep_them():
    assert plan_tools(req(tools=[WEATHER]), "gpt-oss", "").sampling_params() == {"skip_special_tokens": False}
    assert plan_tools(req(tools=[WEATHER]), "mistral", "").sampling_params() == {"skip_special_tokens": False}
    assert plan_tools(req(tools=[WEATHER], tool_choice="none"), "mistral", "").sampling_params() == {}


def test_message_and_finish_reason():
    plan = plan_tools(req(tools=[WEATHER, TIME], parallel_tool_calls=False), "hermes", "")
    content, calls = tool_message(plan, "Sure. " + TWO)
    assert content == "Sure." and [c["function"]["name"] for c in calls] == ["get_weather"]
    assert calls[0]["id"].startswith("call_") and calls[0]["function"]["arguments"] == '{"city": "Paris"}'
    assert tool_message(plan, "<tool_call>oops</tool_call>") == ("<tool_call>oops</tool_call>", None)
    assert finish_reason("stop", True) == "tool_calls" and finish_reason("length", True) == "length"


@pytest.mark.parametrize("kw,msg", [
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "other"}}}, "not among"),
    ({"tool_choice": "required"}, "non-empty tools"),
    ({"tools": [WEATHER, WEATHER]}, "unique"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "invalid function name"),
    ({"tools": [WEATHER], "tool_choice": "required", "regex": "a"}, "cannot be combined"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}],
      "tool_choice": "required"}, "tools.0.function.parameters"),
])
def test_plan_tools_rejects(kw, msg):
    with pytest.raises(BadRequest, match=msg):
        plan_tools(req(**kw), "auto", "")


def test_resolve_format():
    assert resolve_format("auto", "... <|python_tag|> ...") == "llama3"
    assert resolve_format("auto", None) == "hermes"
    assert resolve_format("qwen25", "<|python_tag|>") == "qwen25"
    assert resolve_format("kimi_k2", "<tool_call>") == "kimi_k2"


def test_template_that_ignores_tools_still_renders():
    tok = get_tokenizer("default")  # SmolLM2: its template has no tools section
    tm = SimpleNamespace(tokenizer=tok, builder=SimpleNamespace(mm=None))  # a text-only front
    msgs = [ChatMessage(role="user", content="hi")]
    assert chat_prompt_ids(tm, msgs, tools=[WEATHER]) == chat_prompt_ids(tm, msgs)


def test_template_gets_argument_objects():
    m = ChatMessage(role="assistant", content=None, tool_calls=[
        {"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": '{"tz": "UTC"}'}}])
    assert m.for_template()["tool_calls"][0]["function"]["arguments"] == {"tz": "UTC"}
