"""Tool-call parsing without a model: formats, malformed calls, and the streaming state machine."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from radixlm.runtime.model_loader.tokenizer import get_tokenizer
from radixlm.runtime.server.errors import BadRequest
from radixlm.runtime.server.openai.chat import chat_prompt_ids
from radixlm.runtime.server.openai.protocol import ChatCompletionRequest, ChatMessage
from radixlm.runtime.server.openai.tool_calls import StreamedTools, ToolPlan, plan_tools, resolve_format
from radixlm.runtime.server.openai.tool_parsers import ToolCallStreamer, parse

TOOLS = frozenset({"get_weather", "get_time"})
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time"}}


def calls(p) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in p.calls]


def test_hermes_several_calls_with_text():
    text = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
    p = parse("hermes", text, TOOLS)
    assert p.content == "Let me check."
    assert calls(p) == [("get_weather", {"city": "Paris"}), ("get_time", {})]
    assert p.calls[0].arguments == '{"city": "Paris"}'  # the model's own text, not re-serialised


def test_hermes_no_calls_and_text_after():
    assert parse("hermes", "  Hello there. ", TOOLS).content == "Hello there."
    assert parse("hermes", "", TOOLS).content is None
    p = parse("hermes", '<tool_call>{"name": "get_time"}</tool_call> done', TOOLS)
    assert calls(p) == [("get_time", {})] and p.content == "done"


def test_hermes_bare_call_object_without_tags():
    p = parse("hermes", ' {"name": "get_weather", "arguments": {"city": "Paris"}}\n', TOOLS)
    assert calls(p) == [("get_weather", {"city": "Paris"})] and p.content is None
    for text in ('{"name": "other", "arguments": {}}', '{"answer": 4}', '{"name": "get_time"} trailing'):
        assert parse("hermes", text, TOOLS).calls == [] and parse("hermes", text, TOOLS).content == text


def test_hermes_unclosed_call_at_end_is_a_call():
    p = parse("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}', TOOLS)
    assert calls(p) == [("get_weather", {"city": "Rome"})] and p.content is None


@pytest.mark.parametrize("body", [
    '{"name": "get_weather", "arguments": {"city": }}',  # bad JSON
    '{"name": "get_weather", "arguments": {"city": "Paris"}',  # object never closed
    '{"name": "nope", "arguments": {}}',  # not one of the tools
    '{"name": "get_weather", "arguments": "Paris"}',  # arguments not an object
    '{"fn": "get_weather"}',  # not a call
    'get_weather(city="Paris")',
])
def test_hermes_malformed_call_is_left_as_content(body):
    text = f"Hi <tool_call>\n{body}\n</tool_call>"
    p = parse("hermes", text, TOOLS)
    assert p.calls == [] and p.content == text.strip()


def test_malformed_call_does_not_hide_a_good_one():
    text = ('<tool_call>{"name": "x"}</tool_call>'
            '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>')
    p = parse("hermes", text, TOOLS)
    assert calls(p) == [("get_time", {})] and p.content == '<tool_call>{"name": "x"}</tool_call>'


def test_llama3_formats():
    p = parse("llama3", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}', TOOLS)
    assert calls(p) == [("get_weather", {"city": "Oslo"})] and p.content is None
    p = parse("llama3", '{"name": "get_time", "parameters": {}}; {"name": "get_weather", "parameters": {"city": "X"}}',
              TOOLS)
    assert [n for n, _ in calls(p)] == ["get_time", "get_weather"]
    assert parse("llama3", "The answer is 4.", TOOLS).content == "The answer is 4."
    # JSON that is not a call stays content
    assert parse("llama3", '{"answer": 4}', TOOLS).calls == []
    assert parse("llama3", '{"name": "get_time", "parameters": {}} and more', TOOLS).calls == []


def test_json_array_format():
    p = parse("json_array", '[{"name": "get_weather", "arguments": {"city": "Lima"}}, '
                            '{"name": "get_time", "arguments": {}}]', TOOLS)
    assert calls(p) == [("get_weather", {"city": "Lima"}), ("get_time", {})]
    cut = '[{"name": "get_weather", "arguments": {"ci'  # cut off by max_tokens
    p = parse("json_array", cut, TOOLS)
    assert p.calls == [] and p.content == cut


def pieces(text: str, size: int) -> list[str]:
    return [text[:n] for n in range(size, len(text), size)] + [text]


def stream(fmt: str, text: str, size: int) -> tuple[str, list[dict]]:
    """Feeds growing prefixes; returns the content sent and the calls assembled from the deltas."""
    s = ToolCallStreamer(fmt, TOOLS)
    content, assembled = "", []
    prefixes = pieces(text, size)
    for n, prefix in enumerate(prefixes):
        d = s.feed(prefix, final=n == len(prefixes) - 1)
        content += d.content
        for c in d.calls:
            if "type" in c:
                assert c["index"] == len(assembled) and c["function"]["arguments"] == ""
                assembled.append({"name": c["function"]["name"], "arguments": ""})
            else:
                assert "name" not in c["function"]
                assembled[c["index"]]["arguments"] += c["function"]["arguments"]
        assert "<tool_call" not in content and "</tool_call" not in content
    return content, assembled


STREAM_CASES = [
    ("hermes", 'Sure, checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "São Paulo", '
               '"units": {"t": "C"}}}\n</tool_call>\n<tool_call>\n{"name": "get_time"}\n</tool_call>'),
    ("hermes", '{"name": "get_weather", "arguments": {"city": "Paris"}}'),
    ("hermes", '{"name": "get_weather", "argument": 1} is not a call'),
    ("hermes", "No tools needed: 2 < 3 and <b>bold</b> text."),
    ("hermes", '<tool_call>\n{"arguments": {"city": "Paris"}, "name": "get_weather"}\n</tool_call>'),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Oslo"}}'),
    ("llama3", "Plain answer, no call."),
    ("json_array", '[{"name": "get_weather", "arguments": {"city": "Lima"}}, {"name": "get_time", "arguments": {}}]'),
]


@pytest.mark.parametrize("size", [1, 3, 7])
@pytest.mark.parametrize("fmt,text", STREAM_CASES)
def test_streamed_deltas_add_up_to_the_parse(fmt, text, size):
    content, assembled = stream(fmt, text, size)
    p = parse(fmt, text, TOOLS)
    assert content == (p.content or "")
    assert assembled == [{"name": c.name, "arguments": c.arguments} for c in p.calls]


def test_stream_holds_back_a_partial_tag_then_releases_it():
    s = ToolCallStreamer("hermes", TOOLS)
    assert s.feed("Hi <tool", False).content == "Hi"
    d = s.feed("Hi <tooly>", False)
    assert d.content == " <tooly>" and d.calls == []
    # the call is announced when its arguments begin, or when it is complete without any
    assert s.feed('Hi <tooly><tool_call>{"name": "get_time"', False).calls == []
    d = s.feed('Hi <tooly><tool_call>{"name": "get_time"}</tool_call>', True)
    assert d.content == "" and d.calls == [
        {"index": 0, "type": "function", "function": {"name": "get_time", "arguments": ""}},
        {"index": 0, "function": {"arguments": "{}"}}]
    assert s.called


def test_streamed_tools_adds_one_id_per_call():
    st = StreamedTools(ToolPlan([], TOOLS, "hermes", None))
    first = st.delta('<tool_call>{"name": "get_weather", "arguments": {"ci', False)["tool_calls"]
    assert first[0]["id"].startswith("call_") and first[0]["type"] == "function"
    assert "id" not in first[1] and first[1]["function"] == {"arguments": '{"ci'}


def req(**kw) -> ChatCompletionRequest:
    return ChatCompletionRequest(messages=[ChatMessage(role="user", content="hi")], **kw)


def test_plan_tools():
    assert plan_tools(req(), "auto", "").fmt is None  # no tools: nothing parsed
    p = plan_tools(req(tools=[WEATHER, TIME]), "auto", "{{ '<tool_call>' }}")
    assert p.fmt == "hermes" and p.json_schema is None and p.names == TOOLS and len(p.template_tools) == 2
    none = plan_tools(req(tools=[WEATHER], tool_choice="none"), "auto", "")
    assert none.template_tools is None and none.fmt is None
    named = plan_tools(req(tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_time"}}),
                       "llama3", "")
    schema = json.loads(named.json_schema)
    assert named.fmt == "json_array" and schema["maxItems"] == 1 and named.names == {"get_time"}
    assert schema["items"]["properties"]["name"] == {"const": "get_time"} and "parameters" in schema["items"]["required"]
    required = json.loads(plan_tools(req(tools=[WEATHER, TIME], tool_choice="required"), "hermes", "").json_schema)
    assert "maxItems" not in required and len(required["items"]["anyOf"]) == 2
    assert required["items"]["anyOf"][0]["properties"]["arguments"] == WEATHER["function"]["parameters"]


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
    assert resolve_format("qwen25", "<|python_tag|>") == "hermes"
    assert resolve_format("llama3", "<tool_call>") == "llama3"


def test_template_that_ignores_tools_still_renders():
    tok = get_tokenizer("default")  # SmolLM2: its template has no tools section
    tm = SimpleNamespace(tokenizer=tok, builder=SimpleNamespace(mm=None))  # a text-only front
    msgs = [ChatMessage(role="user", content="hi")]
    assert chat_prompt_ids(tm, msgs, tools=[WEATHER]) == chat_prompt_ids(tm, msgs)


def test_template_gets_argument_objects():
    m = ChatMessage(role="assistant", content=None, tool_calls=[
        {"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": '{"tz": "UTC"}'}}])
    assert m.for_template()["tool_calls"][0]["function"]["arguments"] == {"tz": "UTC"}
