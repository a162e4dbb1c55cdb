"""The inputs that once killed the scheduler, on every API: each gets a 400 in its API's own error shape and the
server keeps serving. Also: a full queue answers 503 with Retry-After in each API's shape, and an operator's
abort_all is a normal finish ("abort") on every API, /v1/messages included."""
from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tests.runtime.server.conftest import start_server, stop_server

pytestmark = pytest.mark.slow

VOCAB = 49152  # SmolLM2's
RUNNING, QUEUED = 2, 2


@pytest.fixture(scope="module")
def server():
    h = start_server("--context-length", "512", "--max-running-requests", str(RUNNING),
                     "--max-queued-requests", str(QUEUED))
    yield h
    stop_server(h)


def native_error(r: httpx.Response) -> str:
    body = r.json()
    assert body["object"] == "error" and body["code"] == r.status_code, body
    return body["message"]


def openai_error(r: httpx.Response) -> str:
    body = r.json()
    assert set(body) == {"error"} and body["error"]["code"] == r.status_code, body
    return body["error"]["message"]


def anthropic_error(r: httpx.Response) -> str:
    body = r.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    return body["error"]["message"]


CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
BAD = [
    ("/generate", {"text": "Hi", "return_logprob": True, "top_logprobs_num": VOCAB + 1}, native_error, "top_logprobs_num"),
    ("/generate", {"text": "Hi", "return_logprob": True, "top_logprobs_num": 1_000_000}, native_error, "top_logprobs_num"),
    ("/generate", {"text": "Hi", "return_logprob": True, "logprob_start_len": -7}, native_error, "logprob_start_len"),
    ("/generate", {"text": "Hi", "sampling_params": {"n": 40000, "max_new_tokens": 1}}, native_error, "n must be"),
    ("/generate", {"text": "Hi", "sampling_params": {"stop": ["x"] * 1000}}, native_error, "stop"),
    ("/generate", {"input_ids": [VOCAB + 5]}, native_error, "input_ids"),
    ("/v1/completions", {"prompt": "Hi", "echo": True, "logprobs": 1_000_000, "max_tokens": 1}, openai_error, "logprobs"),
    ("/v1/completions", {"prompt": "Hi", "n": 40000, "max_tokens": 1}, openai_error, "n"),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 10**9}, openai_error, "max_completion_tokens"),
    ("/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 1_000_000}, openai_error, "top_logprobs"),
    ("/v1/chat/completions", {**CHAT, "n": 129}, openai_error, "n"),
    ("/v1/chat/completions", {"messages": [], "max_tokens": 4}, openai_error, "messages"),
    ("/v1/messages", {"model": "m", "max_tokens": 4, "messages": []}, anthropic_error, "messages"),
    ("/v1/messages", {"model": "m", "max_tokens": 10**9, "messages": [{"role": "user", "content": "Hi"}]},
     anthropic_error, "context"),
]


@pytest.mark.parametrize("path,body,shape,word", BAD, ids=[f"{p}:{i}" for i, (p, *_) in enumerate(BAD)])
def test_crash_inputs_get_400_in_each_apis_shape(server, path, body, shape, word):
    r = server.client.post(path, json=body)
    assert r.status_code == 400, r.text
    assert word in shape(r)


def test_the_server_still_serves_after_the_bad_inputs(server):
    for path, body, *_ in BAD:
        server.client.post(path, json=body)
    assert server.client.get("/health").status_code == 200
    r = server.client.post("/generate", json={"text": "The capital of France is",
                                              "sampling_params": {"max_new_tokens": 4, "temperature": 0}})
    assert r.status_code == 200 and r.json()["meta_info"]["finish_reason"]["type"] == "length"


def test_unknown_route_and_method_answer_in_each_apis_shape(server):
    assert "Not Found" in openai_error(server.client.get("/v1/nothing-here"))
    assert anthropic_error(server.client.get("/v1/messages")).startswith("Method Not Allowed")
    assert native_error(server.client.get("/no-such-route")) == "Not Found"


async def _fill_queue(server, client: httpx.AsyncClient) -> list[asyncio.Task]:
    """RUNNING + QUEUED long /v1/messages requests, in flight once this returns."""
    body = {"model": "m", "max_tokens": 400, "messages": [{"role": "user", "content": "Count to a thousand."}]}
    tasks = [asyncio.create_task(client.post("/v1/messages", json=body)) for _ in range(RUNNING + QUEUED)]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        loads = (await client.get("/v1/loads")).json()["loads"][0]
        if loads["num_in_flight_reqs"] >= RUNNING + QUEUED:
            return tasks
        await asyncio.sleep(0.1)
    raise AssertionError("the requests did not all get in flight")


def test_full_queue_503_and_operator_abort_on_every_api(server):
    async def main():
        async with httpx.AsyncClient(base_url=server.base_url, timeout=180) as c:
            tasks = await _fill_queue(server, c)
            busy = {
                "/v1/messages": ({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]},
                                 anthropic_error),
                "/v1/chat/completions": (CHAT, openai_error),
                "/generate": ({"text": "Hi"}, native_error),
            }
            for path, (body, shape) in busy.items():
                r = await c.post(path, json=body)
                assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1, (path, r.text)
                assert "queue full" in shape(r)
            assert (await c.post("/abort_request", json={"abort_all": True})).status_code == 200
            return await asyncio.gather(*tasks)

    done = asyncio.run(main())
    assert [r.status_code for r in done] == [200] * len(done), [r.text for r in done]
    assert all(r.json()["stop_reason"] == "abort" for r in done)


def test_operator_abort_streamed_messages_is_a_normal_end(server):
    async def main():
        async with httpx.AsyncClient(base_url=server.base_url, timeout=180) as c:
            body = {"model": "m", "max_tokens": 400, "stream": True,
                    "messages": [{"role": "user", "content": "Count to a thousand."}]}
            async with c.stream("POST", "/v1/messages", json=body) as r:
                events = []
                async for line in r.aiter_lines():
                    if line.startswith("event: "):
                        events.append(line[7:])
                        if line == "event: content_block_delta" and events.count("content_block_delta") == 1:
                            await c.post("/abort_request", json={"abort_all": True})
                    elif line.startswith("data: ") and '"stop_reason"' in line and "message_delta" in line:
                        assert '"stop_reason":"abort"' in line
                return r.status_code, events

    status, events = asyncio.run(main())
    assert status == 200 and "error" not in events and events[-1] == "message_stop"
