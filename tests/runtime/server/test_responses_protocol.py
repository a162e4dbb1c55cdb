"""/v1/responses without a server: input items as chat messages, the store's bound, the Response object's shape
(validated by the openai SDK's own types)."""
from __future__ import annotations

import json

import pytest
from openai.types import responses as sdk

from radixlm.runtime.server.errors import BadRequest, parse
from radixlm.runtime.server.openai.responses import EventRenderer
from radixlm.runtime.server.openai.response_store import ResponseStore, StoredResponse
from radixlm.runtime.server.openai.responses_protocol import (
    ResponsesRequest, input_messages, output_item, output_message, response_body, usage,
)
from radixlm.runtime.server.openai.tool_calls import ToolPlan
from radixlm.runtime.server.output_blocks import Block, BlockKind, BlockStream

CALL = {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": '{"city": "Oslo"}'}


def dumped(msgs) -> list[dict]:
    return [m.model_dump(exclude_none=True) for m in msgs]


def test_input_items_become_chat_messages():
    req = parse(ResponsesRequest, {"input": [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather"}, {"type": "input_text", "text": "?"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        CALL, {**CALL, "call_id": "call_2"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call_output", "call_id": "call_1", "output": "rain"},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "snow"}]},
    ]})
    msgs = dumped(input_messages(req.input))
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "tool"]
    assert msgs[0]["content"] == [{"type": "text", "text": "Weather"}, {"type": "text", "text": "?"}]
    assert msgs[1]["content"] == [{"type": "text", "text": "Checking."}]
    assert [c["id"] for c in msgs[1]["tool_calls"]] == ["call_1", "call_2"]
    assert msgs[2] == {"role": "tool", "content": "rain", "tool_call_id": "call_1", "name": "weather"}
    assert msgs[3]["content"] == "snow"
    assert dumped(input_messages("hi")) == [{"role": "user", "content": "hi"}]
    # A call with no assistant text before it is an assistant message of its own.
    [alone] = input_messages(parse(ResponsesRequest, {"input": [CALL]}).input)
    assert alone.role == "assistant" and alone.content is None and len(alone.tool_calls) == 1


def test_a_request_runs_as_a_chat_request_after_its_history():
    req = parse(ResponsesRequest, {"input": "and now?", "instructions": "Be brief.", "max_output_tokens": 5,
                                   "tools": [{"type": "function", "name": "weather"}], "tool_choice": "required",
                                   "parallel_tool_calls": False, "text": {"format": {"type": "json_object"}}})
    history = tuple(input_messages("before"))
    chat, new = req.to_chat(history, "resp_1")
    assert [m.role for m in chat.messages] == ["system", "user", "user"] and chat.messages[1] is history[0]
    assert dumped(new) == [{"role": "user", "content": "and now?"}]
    assert chat.max_completion_tokens == 5 and chat.tool_choice == "required" and not chat.parallel_tool_calls
    assert chat.tools[0].function.name == "weather" and chat.rid == "resp_1"
    assert chat.response_format.constraint() == '{"type": "object"}'
    named = parse(ResponsesRequest, {"input": "x", "tools": [{"type": "function", "name": "weather"}],
                                     "tool_choice": {"type": "function", "name": "weather"}})
    assert named.to_chat((), "r")[0].tool_choice.function.name == "weather"


@pytest.mark.parametrize("body", [
    {"input": [{"type": "web_search_call", "id": "x"}]}, {"input": [{"role": "tool", "content": "x"}]},
    {"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, {"max_output_tokens": 0},
    {"tools": [{"type": "file_search"}]}, {"tool_choice": "sometimes"}, {"store": "yes"},
    {"metadata": {"k": "v" * 513}}, {"metadata": {f"k{i}": "v" for i in range(17)}},
])
def test_malformed_requests_are_refused(body):
    with pytest.raises(BadRequest):
        parse(ResponsesRequest, {"input": "x", **body})


def test_the_response_object_has_the_sdk_shape():
    req = parse(ResponsesRequest, {"input": "x", "tools": [{"type": "function", "name": "weather"}],
                                   "tool_choice": {"type": "function", "name": "weather"}, "metadata": {"k": "v"}})
    blocks = [Block(BlockKind.TEXT, "Sure."), Block(BlockKind.TOOL_CALL, '{"city": "Oslo"}', "call_9", "weather")]
    output = [output_item(b, f"item_{i}", "completed") for i, b in enumerate(blocks)]
    meta = {"prompt_tokens": 7, "completion_tokens": 3, "cached_tokens": 2}
    body = response_body("resp_1", 1.0, req, "m", "completed", output, usage(meta))
    r = sdk.Response.model_validate(body)
    assert r.output_text == "Sure." and r.output[1].call_id == "call_9" and r.tool_choice.name == "weather"
    assert (r.usage.input_tokens, r.usage.output_tokens, r.usage.total_tokens) == (7, 3, 10)
    assert r.usage.input_tokens_details.cached_tokens == 2
    reply = output_message(blocks).model_dump(exclude_none=True)
    assert reply["content"] == "Sure." and reply["tool_calls"][0]["function"]["arguments"] == '{"city": "Oslo"}'
    assert output_message([Block(BlockKind.TEXT, "")]) is None


def test_the_store_keeps_the_most_recently_used():
    store = ResponseStore(2)
    for rid in ("a", "b"):
        store.put(rid, StoredResponse({"id": rid}, ()))
    assert store.get("a").body == {"id": "a"}  # a is now the most recent: b goes first
    store.put("c", StoredResponse({"id": "c"}, ()))
    assert store.get("b") is None and store.get("a") is not None and len(store) == 2
    assert store.delete("a") and not store.delete("a") and store.get("a") is None
    empty = ResponseStore(0)
    empty.put("a", StoredResponse({}, ()))
    assert empty.get("a") is None
    with pytest.raises(ValueError):
        ResponseStore(-1)


def test_stream_events_have_the_sdk_shapes():
    renderer, stream = EventRenderer(), BlockStream(ToolPlan([], frozenset({"f"}), "hermes", None))
    text = 'Hi.<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>'
    chunks = [c for end in (2, 20, len(text)) for e in stream.feed(text[:end], end == len(text))
              for c in renderer.render(e, "completed")]
    classes = {"response.output_item.added": sdk.ResponseOutputItemAddedEvent,
               "response.output_item.done": sdk.ResponseOutputItemDoneEvent,
               "response.content_part.added": sdk.ResponseContentPartAddedEvent,
               "response.content_part.done": sdk.ResponseContentPartDoneEvent,
               "response.output_text.delta": sdk.ResponseTextDeltaEvent,
               "response.output_text.done": sdk.ResponseTextDoneEvent,
               "response.function_call_arguments.delta": sdk.ResponseFunctionCallArgumentsDeltaEvent,
               "response.function_call_arguments.done": sdk.ResponseFunctionCallArgumentsDoneEvent}
    datas = [json.loads(c.split(b"\ndata: ", 1)[1]) for c in chunks]
    events = [classes[d["type"]].model_validate(d) for d in datas]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events if e.type.endswith(("added", ".done"))] == [
        "response.output_item.added", "response.content_part.added", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.output_item.added",
        "response.function_call_arguments.done", "response.output_item.done"]
    assert [it["type"] for it in renderer.items] == ["message", "function_call"]
