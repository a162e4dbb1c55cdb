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
    msg = create(client, THINK).choices[0].message
    assert msg.reasoning_content in ("yes", "no") and msg.content in ("Paris", "London")

    reasoning, content, reasons = "", "", []
    for chunk in create(client, THINK, stream=True):
        delta = chunk.choices[0].delta
        thought = getattr(delta, "reasoning_content", None)
        assert not (thought and delta.content)  # reasoning and content come in chunks of their own
        reasoning += thought or ""
        content += delta.content or ""
        reasons.append(chunk.choices[0].finish_reason)
    assert (reasoning, content) == (msg.reasoning_content, msg.content) and reasons[-1] == "stop"


def test_separate_reasoning_false_returns_the_raw_text(client):
    msg = create(client, THINK, extra_body={"separate_reasoning": False}).choices[0].message
    assert msg.reasoning_content is None
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
