"""The Responses API (/v1/responses), driven by the real `openai` SDK against the shared server: text and a forced
function call, plain and streamed, previous_response_id, retrieve and delete, and bad input."""
from __future__ import annotations

import json

import openai
import pytest

pytestmark = pytest.mark.slow

MODEL = "default"
WEATHER = {"type": "function", "name": "weather", "description": "Get the weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                          "additionalProperties": False}}
ASK = "What is the weather in Paris?"
GREEDY = {"model": MODEL, "temperature": 0}


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0, timeout=60) as c:
        yield c


def prompt_len(tokenizer, messages) -> int:
    return len(tokenizer.encode(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
                                add_special_tokens=False))


def test_text_plain_and_streamed(client, tokenizer):
    kw = dict(input="Say hello.", instructions="Answer briefly.", max_output_tokens=3, **GREEDY)
    r = client.responses.create(**kw)
    assert r.object == "response" and r.id.startswith("resp_") and r.model == MODEL
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    [msg] = r.output
    assert msg.type == "message" and msg.role == "assistant" and msg.status == "incomplete"
    assert msg.content[0].type == "output_text" and r.output_text
    assert r.usage.output_tokens == 3 and r.usage.total_tokens == r.usage.input_tokens + 3
    system_and_user = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Say hello."}]
    assert r.usage.input_tokens == prompt_len(tokenizer, system_and_user)

    events = list(client.responses.create(stream=True, **kw))
    types = [e.type for e in events]
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert set(types[4:-4]) == {"response.output_text.delta"}
    assert types[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    item_id = events[2].item.id
    assert all(e.item_id == item_id for e in events[3:-2] if hasattr(e, "item_id"))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == events[-4].text == events[-1].response.output_text == r.output_text
    assert events[-1].response.output[0].id == item_id


def test_forced_call_streamed_continued_retrieved_deleted(client, tokenizer):
    kw = dict(input=ASK, tools=[WEATHER], max_output_tokens=64, **GREEDY)
    r = client.responses.create(tool_choice={"type": "function", "name": "weather"}, **kw)
    assert r.status == "completed" and r.tool_choice.name == "weather" and r.tools[0].name == "weather"
    [call] = r.output
    assert call.type == "function_call" and call.name == "weather" and call.status == "completed"
    assert call.call_id.startswith("call_") and call.id.startswith("fc_")
    assert "paris" in json.loads(call.arguments)["city"].lower()

    with client.responses.create(tool_choice="required", parallel_tool_calls=False, stream=True, **kw) as stream:
        events = list(stream)
    types = [e.type for e in events]
    assert types[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert set(types[3:-3]) == {"response.function_call_arguments.delta"} and len(types) > 7
    assert types[-3:] == ["response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    added, done = events[2].item, events[-2].item
    assert added.status == "in_progress" and added.arguments == "" and added.name == "weather"
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert deltas == events[-3].arguments == done.arguments == call.arguments
    assert done.status == "completed" and events[-1].response.output[0].call_id == added.call_id

    # The stored conversation (the question, the call) comes before the function's output.
    out = [{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}]
    follow = client.responses.create(previous_response_id=r.id, input=out, max_output_tokens=1, **GREEDY)
    assert follow.previous_response_id == r.id and follow.output[0].type == "message"
    called = {"id": call.call_id, "type": "function", "function": {"name": "weather", "arguments": {"city": "x"}}}
    chat = [{"role": "user", "content": ASK}, {"role": "assistant", "content": "", "tool_calls": [called]},
            {"role": "tool", "content": "sunny", "tool_call_id": call.call_id}]
    assert follow.usage.input_tokens == prompt_len(tokenizer, chat)

    assert client.responses.retrieve(follow.id).model_dump() == follow.model_dump()
    client.responses.delete(r.id)
    for op in (lambda: client.responses.retrieve(r.id), lambda: client.responses.delete(r.id),
               lambda: client.responses.create(previous_response_id=r.id, input="hi", max_output_tokens=1, **GREEDY)):
        with pytest.raises(openai.NotFoundError):
            op()
    unstored = client.responses.create(input="hi", store=False, max_output_tokens=1, **GREEDY)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


@pytest.mark.parametrize("bad", [
    {"input": 3}, {"input": []}, {"input": [{"type": "computer_call_output", "call_id": "c"}]},
    {"input": [{"role": "robot", "content": "hi"}]}, {"max_output_tokens": 0}, {"temperature": -1},
    {"tools": [{"type": "web_search"}]}, {"tools": [WEATHER, WEATHER]},
    {"tool_choice": {"type": "function", "name": "nope"}, "tools": [WEATHER]}, {"tool_choice": "required"},
    {"text": {"format": {"type": "json_schema", "name": "x"}}}, {"background": True},
    {"input": [{"role": "assistant", "content": [{"type": "input_image", "image_url": "data:,"}]}]},
])
def test_bad_input_is_400(server, bad):
    r = server.client.post("/v1/responses", json={"model": MODEL, "input": "hi", "max_output_tokens": 2, **bad})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"]
