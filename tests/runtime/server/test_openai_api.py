"""The OpenAI-compatible API, driven through the official `openai` SDK against one live server."""
from __future__ import annotations

import time

import openai
import pytest

from radixlm.runtime.model_loader.tokenizer import get_tokenizer

pytestmark = pytest.mark.slow

PROMPT = "Once upon a time, there was a little"
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name three colors."}]


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    c = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0, timeout=60)
    yield c
    c.close()


@pytest.fixture(scope="module")
def tok():
    return get_tokenizer("default")


@pytest.fixture(scope="module")
def model(client) -> str:
    return client.models.list().data[0].id


@pytest.fixture(scope="module")
def greedy(client, model):
    """The reference greedy completion (8 tokens, EOS ignored) the other tests compare against."""
    return client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0,
                                     extra_body={"ignore_eos": True})


@pytest.fixture(scope="module")
def greedy_chat(client, model):
    return client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=6, temperature=0, logprobs=True,
                                          top_logprobs=3)


def chat_ids(tok, messages) -> list[int]:
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tok.encode(text, add_special_tokens=False)


def test_models(client, server, model):
    models = client.models.list().data
    assert len(models) == 1 and isinstance(models[0].model_extra["max_model_len"], int)
    assert client.models.retrieve(model).id == model
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")
    body = server.client.get("/v1/models/no-such-model").json()
    assert body["error"]["code"] == "model_not_found" and body["error"]["param"] == "model"


def test_completion_usage_and_batch(client, model, tok, greedy):
    r = greedy
    assert r.object == "text_completion" and r.id.startswith("cmpl-") and r.model == model
    assert r.usage.prompt_tokens == len(tok.encode(PROMPT))
    assert r.usage.completion_tokens == 8 and r.usage.total_tokens == r.usage.prompt_tokens + 8
    assert r.usage.prompt_tokens_details.cached_tokens >= 0
    assert r.choices[0].finish_reason == "length" and r.choices[0].model_extra["matched_stop"] is None
    # A batch of two prompts with n=2: prompt-major order, each prompt counted once.
    other = "The capital of France is"
    rb = client.completions.create(model=model, prompt=[PROMPT, other], n=2, max_tokens=2, temperature=0)
    assert [c.index for c in rb.choices] == [0, 1, 2, 3]
    assert rb.usage.prompt_tokens == len(tok.encode(PROMPT)) + len(tok.encode(other))
    # Token-id prompts give the same greedy output as the text.
    rt = client.completions.create(model=model, prompt=tok.encode(PROMPT), max_tokens=3, temperature=0)
    assert r.choices[0].text.startswith(rt.choices[0].text)


def test_completion_echo_logprobs(client, model, tok):
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=2, temperature=0, echo=True, logprobs=3)
    c = r.choices[0]
    assert c.text.startswith(PROMPT)
    lp = c.logprobs
    assert len(lp.tokens) == r.usage.prompt_tokens + r.usage.completion_tokens
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert isinstance(lp.tokens[0], str) and isinstance(lp.top_logprobs[1], dict) and 1 <= len(lp.top_logprobs[1]) <= 3
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    r2 = client.completions.create(model=model, prompt=PROMPT, max_tokens=2, temperature=0, logprobs=2)
    assert r2.choices[0].logprobs.token_logprobs[0] is not None
    assert len(r2.choices[0].logprobs.tokens) == r2.usage.completion_tokens


def test_completion_stream(client, model, greedy):
    full = greedy.choices[0].text
    chunks = list(client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0, n=2, stream=True,
                                            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    texts, finishes = {0: "", 1: ""}, {0: 0, 1: 0}
    for ch in chunks[:-1]:
        for c in ch.choices:
            texts[c.index] += c.text
            finishes[c.index] += c.finish_reason is not None
    assert texts == {0: full, 1: full} and finishes == {0: 1, 1: 1}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    echoed = list(client.completions.create(model=model, prompt=PROMPT, max_tokens=1, echo=True, stream=True))
    assert echoed[0].choices[0].text.startswith(PROMPT)


def test_stop(client, model, greedy):
    full = greedy.choices[0].text
    stop = full[len(full) // 2:len(full) // 2 + 3]
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0, stop=[stop],
                                  extra_body={"ignore_eos": True})
    c = r.choices[0]
    assert c.finish_reason == "stop" and c.model_extra["matched_stop"] == stop and c.text == full[:full.index(stop)]


def test_chat(client, model, tok, greedy_chat):
    r = greedy_chat
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.usage.prompt_tokens == len(chat_ids(tok, MESSAGES))
    c = r.choices[0]
    assert c.message.role == "assistant" and c.message.content
    content = c.logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert all(len(e.top_logprobs) == 3 for e in content) and content[0].bytes == list(content[0].token.encode())
    parts = [{"role": "user", "content": [{"type": "text", "text": "Name three "}, {"type": "text", "text": "colors."}]}]
    r2 = client.chat.completions.create(model=model, messages=MESSAGES[:1] + parts, max_completion_tokens=2, temperature=0)
    assert c.message.content.startswith(r2.choices[0].message.content)


def test_chat_stream(client, model, greedy_chat):
    full = greedy_chat.choices[0].message.content
    chunks = list(client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=6, temperature=0, n=2,
                                                 stream=True, logprobs=True, top_logprobs=2,
                                                 stream_options={"include_usage": True}))
    texts, finishes, first, lps = {0: "", 1: ""}, {0: 0, 1: 0}, {}, {0: 0, 1: 0}
    for ch in chunks[:-1]:
        assert ch.object == "chat.completion.chunk"
        for c in ch.choices:
            first.setdefault(c.index, c.delta.role)
            texts[c.index] += c.delta.content or ""
            finishes[c.index] += c.finish_reason is not None
            lps[c.index] += len(c.logprobs.content) if c.logprobs else 0
    assert first == {0: "assistant", 1: "assistant"} and finishes == {0: 1, 1: 1} and texts == {0: full, 1: full}
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and lps[0] + lps[1] == usage.completion_tokens
    assert usage.prompt_tokens_details.cached_tokens >= 0


def test_cached_tokens(client, model, server):
    messages = [{"role": "user", "content": "Tell me a story about a dragon who loves to bake bread " * 4}]

    def cached() -> int:
        r = client.chat.completions.create(model=model, messages=messages, max_tokens=1, temperature=0)
        return r.usage.prompt_tokens_details.cached_tokens

    first, second = cached(), cached()
    assert second > first
    for _ in range(20):  # the flush is refused while requests are still running
        if server.client.post("/flush_cache").status_code == 200:
            break
        time.sleep(0.2)
    assert cached() == 0


@pytest.mark.parametrize("kwargs, needle", [
    ({"temperature": "hot"}, "temperature"),
    ({"temperature": -1}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"max_tokens": 100_000}, "max_completion_tokens is too large"),
    ({"prompt": list(range(9000))}, "longer than the model's context length"),
    ({"prompt": [10**9]}, "input_ids"),
    ({"extra_body": {"regex": "(a+"}}, "invalid regex"),
    ({"logit_bias": {"99999999": 1}}, "logit_bias"),
])
def test_completion_errors(client, model, kwargs, needle):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(**{"model": model, "prompt": PROMPT, "max_tokens": 4, **kwargs})
    assert e.value.status_code == 400 and needle in e.value.body["message"]


@pytest.mark.parametrize("kwargs, needle", [
    ({"messages": [{"role": "robot", "content": "hi"}]}, "messages.0.role"),
    ({"messages": []}, "messages"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"n": 0}, "n must be"),
    ({"stream": True, "max_tokens": 100_000}, "max_completion_tokens is too large"),
])
def test_chat_errors(client, model, kwargs, needle):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(**{"model": model, "messages": MESSAGES, "max_tokens": 4, **kwargs})
    assert needle in e.value.body["message"]
