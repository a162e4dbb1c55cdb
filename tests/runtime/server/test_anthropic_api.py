"""The Anthropic Messages API, driven by the real `anthropic` SDK against one server."""
from __future__ import annotations

import json

import anthropic
import pytest

pytestmark = pytest.mark.slow

USER = [{"role": "user", "content": "Write one sentence about the sea."}]
RAW = {"model": "default", "max_tokens": 8, "temperature": 0}
# The current SDK no longer takes temperature/top_p/top_k as arguments; the API still does.
GREEDY = {"model": "default", "max_tokens": 8, "extra_body": {"temperature": 0}}


@pytest.fixture(scope="module")
def plain(anthropic_client):
    return anthropic_client.messages.create(messages=USER, **GREEDY)


def templated(tokenizer, messages, system=None) -> str:
    turns = ([{"role": "system", "content": system}] if system else []) + messages
    return tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)


def test_message_matches_generate(server, anthropic_client, tokenizer, plain):
    msg = plain
    assert msg.id.startswith("msg_") and msg.type == "message" and msg.role == "assistant" and msg.model == "default"
    assert len(msg.content) == 1 and msg.content[0].type == "text" and msg.content[0].text
    assert msg.stop_reason in ("max_tokens", "end_turn") and msg.stop_sequence is None
    assert 0 < msg.usage.output_tokens <= 8
    prompt = templated(tokenizer, USER)
    native = server.client.post("/generate", json={"text": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": 8}}).json()
    assert msg.content[0].text == native["text"]
    assert msg.usage.input_tokens + msg.usage.cache_read_input_tokens == len(tokenizer.encode(prompt))
    # A final assistant message is a prefill that generation continues.
    pre = anthropic_client.messages.create(messages=USER + [{"role": "assistant", "content": "The sea"}],
                                           **dict(GREEDY, max_tokens=3))
    cont = server.client.post("/generate", json={"text": prompt + "The sea", "sampling_params": {"temperature": 0, "max_new_tokens": 3}}).json()
    assert pre.content[0].text == cont["text"]


def test_stream_matches_plain(server, anthropic_client, plain):
    with anthropic_client.messages.stream(messages=USER, **GREEDY) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) >= 2 and "".join(pieces) == plain.content[0].text == final.content[0].text
    assert final.stop_reason == plain.stop_reason and final.usage.output_tokens == plain.usage.output_tokens
    assert final.id.startswith("msg_")
    # The raw SSE: Anthropic's event names, in order, each with a matching data.type.
    with server.client.stream("POST", "/v1/messages", json={"messages": USER, "stream": True, **RAW, "max_tokens": 3}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln]
    names = [ln[len("event: "):] for ln in lines if ln.startswith("event: ")]
    datas = [json.loads(ln[len("data: "):]) for ln in lines if ln.startswith("data: ")]
    assert [d["type"] for d in datas] == names
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert set(names[3:-3]) == {"content_block_delta"}
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert datas[-2]["usage"]["output_tokens"] == 3 and datas[-2]["delta"]["stop_reason"] == "max_tokens"


def test_stop_sequences(anthropic_client, plain):
    base = plain.content[0].text
    words = base.split()
    assert len(words) >= 4
    stop = words[2]
    for streamed in (False, True):
        if streamed:
            with anthropic_client.messages.stream(messages=USER, stop_sequences=[stop, "zzqx"], **GREEDY) as s:
                msg = s.get_final_message()
        else:
            msg = anthropic_client.messages.create(messages=USER, stop_sequences=[stop, "zzqx"], **GREEDY)
        assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == stop
        assert msg.content[0].text == base[:base.find(stop)]


def test_system_prompt_and_count_tokens(anthropic_client, tokenizer):
    system = "You are a pirate. Always answer like a pirate."
    for sys_arg in (system, [{"type": "text", "text": system}]):
        count = anthropic_client.messages.count_tokens(model="default", system=sys_arg, messages=USER)
        assert count.input_tokens == len(tokenizer.encode(templated(tokenizer, USER, system)))
    plain = anthropic_client.messages.count_tokens(model="default", messages=USER).input_tokens
    assert plain == len(tokenizer.encode(templated(tokenizer, USER)))
    msg = anthropic_client.messages.create(system=system, messages=USER, **dict(GREEDY, max_tokens=2))
    assert msg.usage.input_tokens + msg.usage.cache_read_input_tokens == count.input_tokens
    blocks = [{"role": "user", "content": [{"type": "text", "text": "Write one sentence about the sea."}]}]
    assert anthropic_client.messages.count_tokens(model="default", messages=blocks).input_tokens == plain


@pytest.mark.parametrize("bad", [
    {"max_tokens": 0}, {"max_tokens": "8"}, {"extra_body": {"temperature": 1.5}}, {"extra_body": {"top_p": 0}},
    {"extra_body": {"top_k": 0}}, {"extra_body": {"temperature": "hot"}}, {"stop_sequences": "x"}, {"messages": []},
    {"messages": [{"role": "system", "content": "hi"}]}, {"messages": [{"role": "user", "content": "word " * 5000}]},
    {"system": 3}, {"tools": [{"name": "f"}]},
])
def test_invalid_requests(anthropic_client, bad):
    body = {"messages": USER, **GREEDY, **bad}
    with pytest.raises(anthropic.BadRequestError) as e:
        anthropic_client.messages.create(**body)
    assert e.value.status_code == 400 and e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "invalid_request_error" and e.value.body["error"]["message"]


def test_invalid_raw_bodies(server):
    for body in ({"model": "default", "messages": USER}, {"model": "default", "max_tokens": 4, "messages": "hi"}):
        r = server.client.post("/v1/messages", json=body)
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = server.client.post("/v1/messages", content=b"not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["type"] == "error"
    r = server.client.post("/v1/messages/count_tokens", json={"model": "default", "messages": [], "max_tokens": 3})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    # Still serving after the bad requests.
    r = server.client.post("/v1/messages", json={"messages": USER, **RAW, "stream": True, "max_tokens": 2})
    assert r.status_code == 200 and "message_stop" in r.text
