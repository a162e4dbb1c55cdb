"""--reasoning-parser on /v1/chat/completions, through the `openai` SDK: SmolLM2 served with the qwen3 parser, its
output forced by the request's regex into Qwen3's `<think>…</think>answer` shape."""
from __future__ import annotations

import openai
import pytest

from tests.runtime.server.conftest import start_server, stop_server

ASK = [{"role": "user", "content": "What is the capital of France?"}]
THINK = r"<think>(yes|no)</think>(Paris|London)"
NO_START_TAG = r"(maybe|surely)</think>(Paris|London)"  # Qwen3 templates that open <think> themselves


@pytest.fixture(scope="module")
def server():
    h = start_server("--reasoning-parser", "qwen3")
    yield h
    stop_server(h)


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    c = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0, timeout=120)
    yield c
    c.close()


def create(client, regex: str, **kw):
    extra = {"regex": regex, **kw.pop("extra_body", {})}
    return client.chat.completions.create(model="default", messages=ASK, temperature=0, max_tokens=24,
                                          extra_body=extra, **kw)


def test_reasoning_content_whole_and_streamed(client):
    r = create(client, THINK)
    msg = r.choices[0].message
    assert msg.reasoning_content in ("yes", "no") and msg.content in ("Paris", "London")
    assert r.usage.completion_tokens_details.reasoning_tokens == 1  # "yes" / "no": one token each in SmolLM2

    reasoning, content, reasons, usage = "", "", [], None
    for chunk in create(client, THINK, stream=True, stream_options={"include_usage": True}):
        if not chunk.choices:
            usage = chunk.usage
            continue
        delta = chunk.choices[0].delta
        thought = getattr(delta, "reasoning_content", None)
        assert not (thought and delta.content)  # reasoning and content come in chunks of their own
        reasoning += thought or ""
        content += delta.content or ""
        reasons.append(chunk.choices[0].finish_reason)
    assert (reasoning, content) == (msg.reasoning_content, msg.content) and reasons[-1] == "stop"
    assert usage.completion_tokens_details.reasoning_tokens == 1




def test_separate_reasoning_false_returns_the_raw_text(client):
    r = create(client, THINK, extra_body={"separate_reasoning": False})
    msg = r.choices[0].message
    assert msg.reasoning_content is None and r.usage.completion_tokens_details is None
    assert msg.content.startswith("<think>") and "</think>" in msg.content


def test_enable_thinking_false_means_no_reasoning_block(client):
    # The qwen3 parser takes the output as reasoning from its start unless enable_thinking is false (the unit tests
    # cover the other cases); here the end tag is left in the content.
    r = create(client, NO_START_TAG, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    msg = r.choices[0].message
    assert msg.reasoning_content is None and "</think>" in msg.content
    with pytest.raises(openai.BadRequestError, match="enable_thinking: must be a boolean"):
        create(client, THINK, extra_body={"chat_template_kwargs": {"enable_thinking": "no"}})


def test_server_info_reports_the_parser(server):
    assert server.client.get("/server_info").json()["reasoning_parser"] == "qwen3"


# /v1/responses and /v1/messages read the reasoning through the same stage (output_blocks). These APIs take no regex, so
# the output is the model's own: the qwen3 parser starts inside the reasoning (the template's default), and SmolLM2
# writes no </think>, so a short answer is all reasoning.
SHORT = 6


def test_responses_reasoning_item_whole_and_streamed(client):
    kw = dict(model="default", input="What is the capital of France?", max_output_tokens=SHORT, temperature=0,
              reasoning={"effort": "low"})
    r = client.responses.create(**kw)
    [item] = r.output
    assert item.type == "reasoning" and item.id.startswith("rs_") and item.summary == []
    assert item.content[0].type == "reasoning_text" and item.content[0].text and r.reasoning.effort == "low"
    assert 1 <= r.usage.output_tokens_details.reasoning_tokens <= r.usage.output_tokens

    events = list(client.responses.create(stream=True, **kw))
    types = [e.type for e in events]
    assert types[2:4] == ["response.output_item.added", "response.content_part.added"]
    assert events[3].part.type == "reasoning_text" and set(types[4:-4]) == {"response.reasoning_text.delta"}
    assert types[-4:-1] == ["response.reasoning_text.done", "response.content_part.done", "response.output_item.done"]
    deltas = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert deltas == events[-4].text == events[-1].response.output[0].content[0].text == item.content[0].text
    assert events[-1].response.usage.output_tokens_details.reasoning_tokens == r.usage.output_tokens_details.reasoning_tokens


def test_anthropic_thinking_block_whole_streamed_and_disabled(anthropic_client):
    kw = dict(model="default", max_tokens=SHORT, messages=ASK, extra_body={"temperature": 0})
    msg = anthropic_client.messages.create(**kw)
    [thinking] = msg.content
    assert thinking.type == "thinking" and thinking.thinking and thinking.signature == ""
    assert msg.stop_reason == "max_tokens"

    with anthropic_client.messages.stream(**kw) as stream:
        events = [e for e in stream if e.type in ("content_block_start", "content_block_delta", "content_block_stop")]
        final = stream.get_final_message()
    assert events[0].content_block.type == "thinking" and events[-1].type == "content_block_stop"
    assert {e.delta.type for e in events[1:-2]} == {"thinking_delta"} and events[-2].delta.type == "signature_delta"
    assert "".join(e.delta.thinking for e in events[1:-2]) == final.content[0].thinking == thinking.thinking

    # thinking disabled: the template's enable_thinking is false, so the output is the answer.
    off = anthropic_client.messages.create(thinking={"type": "disabled"}, **kw)
    assert [b.type for b in off.content] == ["text"] and off.content[0].text


def test_thinking_token_budget_forces_the_end_of_the_reasoning(server, client):
    # The qwen3 parser reads a chat's output as reasoning from its start: after 3 tokens, </think> is forced, and the
    # tokens before it are the greedy ones.
    kw = dict(model="default", messages=ASK, temperature=0, max_tokens=8)
    raw = {"separate_reasoning": False}
    free = client.chat.completions.create(**kw, extra_body=raw).choices[0].message.content
    capped = client.chat.completions.create(**kw, extra_body={**raw, "thinking_token_budget": 3}).choices[0]
    head, tag, _ = capped.message.content.partition("</think>")
    assert tag and head and free.startswith(head) and "</think>" not in free
    with pytest.raises(openai.BadRequestError, match="thinking_budget must be >= 1"):
        client.chat.completions.create(**kw, extra_body={"thinking_token_budget": 0})
    resp = client.responses.create(model="default", input=ASK[0]["content"], max_output_tokens=8, temperature=0,
                                   extra_body={"thinking_token_budget": 3})
    assert resp.output[0].type == "reasoning" and resp.output[0].content[0].text == head.strip()
    assert resp.usage.output_tokens_details.reasoning_tokens <= 3
    # /generate has no template: a block the prompt leaves open is budgeted.
    sp = {"text": "Why?\n<think>", "sampling_params": {"max_new_tokens": 5, "temperature": 0, "thinking_budget": 1}}
    got = server.client.post("/generate", json=sp).json()
    assert got["text"].count("</think>") == 1 and not got["text"].startswith("</think>"), got
