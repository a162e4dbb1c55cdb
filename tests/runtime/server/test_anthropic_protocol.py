"""/v1/messages without a server: Anthropic's tool blocks as chat messages, tool_choice as the chat's, and the
content blocks and stream events in the anthropic SDK's own types."""
from __future__ import annotations

import json

import pytest
from anthropic import types as sdk

from radixlm.runtime.server import anthropic_protocol as proto
from radixlm.runtime.server import anthropic_render as render
from radixlm.runtime.server.anthropic import block_events
from radixlm.runtime.server.errors import BadRequest
from radixlm.runtime.server.openai.tool_calls import ToolPlan
from radixlm.runtime.server.output_blocks import Block, BlockKind, BlockStream

TOOL = {"name": "weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}
USE = {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Oslo"}}


def request(**fields) -> proto.MessagesRequest:
    body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "Weather?"}], **fields}
    return proto.parse(proto.MessagesRequest, json.dumps(body).encode())


def test_tool_blocks_become_chat_messages():
    req = request(system=[{"type": "text", "text": "Be brief."}], tools=[TOOL], messages=[
        {"role": "user", "content": "Weather?"}, {"role": "user", "content": "In Oslo."},
        {"role": "assistant", "content": [{"type": "text", "text": "Checking."}, USE]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "rain"},
                                     {"type": "text", "text": "And tomorrow?"}]},
        {"role": "assistant", "content": [{"type": "tool_use", **{**USE, "id": "toolu_2"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
                                      "content": [{"type": "text", "text": "timeout"}]}]}])
    chat = req.chat_request("msg_1")
    msgs = [m.model_dump(exclude_none=True) for m in chat.messages]
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "user", "assistant", "tool"]
    assert msgs[0]["content"] == "Be brief." and msgs[1]["content"] == "Weather?\n\nIn Oslo."
    assert msgs[2]["content"] == "Checking." and msgs[2]["tool_calls"] == [
        {"id": "toolu_1", "type": "function", "function": {"name": "weather", "arguments": {"city": "Oslo"}}}]
    assert msgs[3] == {"role": "tool", "content": "rain", "tool_call_id": "toolu_1", "name": "weather"}
    assert msgs[4]["content"] == "And tomorrow?" and msgs[5]["content"] == ""
    assert msgs[6]["content"] == "Error: timeout"
    assert not chat.continue_final_message and chat.max_completion_tokens == 4 and chat.rid == "msg_1"
    assert chat.tools[0].function.parameters == TOOL["input_schema"] and chat.tool_choice is None
    prefill = request(messages=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}])
    assert prefill.chat_request("m").continue_final_message


@pytest.mark.parametrize("choice,expected,parallel", [
    ({"type": "auto"}, "auto", True), ({"type": "any", "disable_parallel_tool_use": True}, "required", False),
    ({"type": "none"}, "none", True), ({"type": "tool", "name": "weather"}, "weather", True)])
def test_tool_choice_maps_onto_the_chat_one(choice, expected, parallel):
    chat = request(tools=[TOOL], tool_choice=choice).chat_request("m")
    got = chat.tool_choice if isinstance(chat.tool_choice, str) else chat.tool_choice.function.name
    assert got == expected and chat.parallel_tool_calls == parallel


@pytest.mark.parametrize("fields", [
    {"tools": [{"name": "weather", "input_schema": {"type": "array"}}]}, {"tools": [{"name": "w"}]},
    {"tool_choice": {"type": "tool"}}, {"tool_choice": {"type": "sometimes"}},
    {"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "x", "name": "w"}]}]},
])
def test_malformed_tool_fields_are_refused(fields):
    with pytest.raises(BadRequest):
        request(**fields)


def test_blocks_in_the_wrong_turn_are_refused():
    for messages in ([{"role": "user", "content": [USE]}],
                     [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": [USE]}]):
        with pytest.raises(BadRequest):
            request(messages=messages).chat_request("m")


def test_content_blocks_and_stream_events_have_the_sdk_shapes():
    call = Block(BlockKind.TOOL_CALL, '{"city": "Oslo"}', "call_7", "weather")
    msg = sdk.Message.model_validate(render.message_body(
        "msg_1", "m", [render.content_block(Block(BlockKind.TEXT, "Hi.")), render.content_block(call)], "tool_use",
        None, render.usage({"prompt_tokens": 5, "completion_tokens": 2})))
    assert msg.content[1].id == "toolu_7" and msg.content[1].input == {"city": "Oslo"}
    assert msg.stop_reason == "tool_use" and msg.usage.input_tokens == 5
    assert render.stop_info({"type": "stop", "matched": 2}, None, called=True) == ("tool_use", None)
    assert render.stop_info({"type": "length"}, None, called=True) == ("max_tokens", None)

    stream = BlockStream(ToolPlan([], frozenset({"weather"}), "hermes", None))
    text = 'Hi.<tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call>'
    events = [e for end in (2, 30, len(text)) for e in stream.feed(text[:end], end == len(text))]
    classes = {"content_block_start": sdk.RawContentBlockStartEvent,
               "content_block_delta": sdk.RawContentBlockDeltaEvent, "content_block_stop": sdk.RawContentBlockStopEvent}
    parsed = []
    for chunk in (c for e in events for c in block_events(e)):
        name, data = chunk.decode().split("\n")[:2]
        d = json.loads(data.removeprefix("data: "))
        assert name == f"event: {d['type']}"
        parsed.append(classes[d["type"]].model_validate(d))
    starts = [p.content_block for p in parsed if p.type == "content_block_start"]
    assert [s.type for s in starts] == ["text", "tool_use"] and starts[1].input == {}
    partial = "".join(p.delta.partial_json for p in parsed if p.type == "content_block_delta"
                      and p.delta.type == "input_json_delta")
    assert json.loads(partial) == {"city": "Oslo"}
