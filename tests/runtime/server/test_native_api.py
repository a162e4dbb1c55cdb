"""The native HTTP API over the multi-process pipeline (tokenizer manager, scheduler, detokenizer)."""
from __future__ import annotations

import asyncio
import json
import signal
import time

import httpx
import pytest

from tests.runtime.server.conftest import child_pids, pid_alive, start_server, stop_server, wait_idle

pytestmark = pytest.mark.slow

PROMPT = "Once upon a time, there was a little"
GREEDY = {"temperature": 0, "max_new_tokens": 8}
LONG = {"temperature": 0, "max_new_tokens": 1000, "ignore_eos": True}


@pytest.fixture(scope="module")
def server():
    """Its own server, not the shared one: the last test ends it."""
    h = start_server()
    yield h
    stop_server(h)


def gen(server, **body) -> httpx.Response:
    return server.client.post("/generate", json=body)


def sse_events(lines) -> list:
    events = []
    for line in lines:
        if line.startswith("data: "):
            payload = line[len("data: "):]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events




def test_generate_single_text_and_input_ids(server):
    out = gen(server, text=PROMPT, sampling_params=GREEDY).json()
    assert set(out) == {"text", "output_ids", "meta_info"}
    meta = out["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 8} and meta["completion_tokens"] == 8
    assert len(out["output_ids"]) == 8 and out["text"]
    ids = server.client.post("/generate", json={"text": PROMPT, "sampling_params": {"max_new_tokens": 0}}).json()
    assert ids["meta_info"]["prompt_tokens"] == meta["prompt_tokens"]
    # The same prompt as token ids gives the same greedy output.
    from radixlm.runtime.model_loader.tokenizer import get_tokenizer
    prompt_ids = get_tokenizer("default").encode(PROMPT)
    by_ids = gen(server, input_ids=prompt_ids, sampling_params=GREEDY, rid="by-ids").json()
    assert by_ids["output_ids"] == out["output_ids"] and by_ids["meta_info"]["id"] == "by-ids"


def test_batch(server):
    outs = gen(server, text=[PROMPT, "Hello"], sampling_params=[GREEDY, {"temperature": 0, "max_new_tokens": 3}]).json()
    assert isinstance(outs, list) and [o["meta_info"]["completion_tokens"] for o in outs] == [8, 3]
    ids = gen(server, input_ids=[[1, 2, 3], [4, 5]], sampling_params={"temperature": 0, "max_new_tokens": 2}).json()
    assert len(ids) == 2 and all(len(o["output_ids"]) == 2 for o in ids)


def test_streaming_chunks(server):
    sp = {"temperature": 0, "max_new_tokens": 12}
    with server.client.stream("POST", "/generate", json={"text": PROMPT, "sampling_params": sp, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r.iter_lines())
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    texts = [c["text"] for c in chunks]
    assert len(chunks) >= 6 and all(b.startswith(a) for a, b in zip(texts, texts[1:]))
    assert sum(c["meta_info"]["finish_reason"] is not None for c in chunks) == 1
    assert chunks[-1]["meta_info"]["finish_reason"] is not None
    final = gen(server, text=PROMPT, sampling_params=sp).json()
    assert texts[-1] == final["text"] and chunks[-1]["output_ids"] == final["output_ids"]


def test_logprobs(server):
    out = gen(server, text=PROMPT, sampling_params={"temperature": 0, "max_new_tokens": 4}, return_logprob=True,
              logprob_start_len=0, top_logprobs_num=3, return_text_in_logprobs=True).json()
    meta = out["meta_info"]
    n = meta["prompt_tokens"]
    assert len(meta["input_token_logprobs"]) == n and meta["input_token_logprobs"][0][0] is None
    assert len(meta["input_top_logprobs"]) == n and meta["input_top_logprobs"][0] is None
    assert len(meta["output_token_logprobs"]) == 4 and len(meta["output_top_logprobs"]) == 4
    for (lp, tok, text), top in zip(meta["output_token_logprobs"], meta["output_top_logprobs"]):
        assert len(top) == 3 and top[0][1] == tok and abs(top[0][0] - lp) < 1e-6 and isinstance(text, str)
    assert [t for _lp, t, _x in meta["output_token_logprobs"]] == out["output_ids"]


def test_batch_with_per_prompt_logprob_fields(server):
    outs = gen(server, text=[PROMPT, "Hello there"], sampling_params={"temperature": 0, "max_new_tokens": 3},
               return_logprob=[True, False], logprob_start_len=[2, -1], top_logprobs_num=[2, 0]).json()
    with_lp, without = (o["meta_info"] for o in outs)
    assert len(with_lp["input_token_logprobs"]) == with_lp["prompt_tokens"] - 2
    assert len(with_lp["output_top_logprobs"]) == 3 and all(len(t) == 2 for t in with_lp["output_top_logprobs"])
    assert "output_token_logprobs" not in without
    r = gen(server, text=[PROMPT, "Hello"], return_logprob=[True])
    assert r.status_code == 400 and "return_logprob" in r.json()["message"]


def test_stream_interval(server):
    body = {"text": PROMPT, "stream": True, "sampling_params": {"temperature": 0, "max_new_tokens": 7, "ignore_eos": True,
                                                                  "stream_interval": 3}}
    with server.client.stream("POST", "/generate", json=body) as r:
        chunks = sse_events(r.iter_lines())[:-1]
    lengths = [len(c["output_ids"]) for c in chunks]
    # Outputs at tokens 1, 4 and 7 only; a chunk may carry two of them when the stream was busy sending the last one.
    assert lengths[-1] == 7 and lengths == sorted(set(lengths)) and set(lengths) <= {1, 4, 7}


def test_tokenize_and_detokenize(server):
    c = server.client
    for prefix in ("", "/v1"):
        one = c.post(f"{prefix}/tokenize", json={"prompt": "Hello world"}).json()
        assert one["count"] == len(one["tokens"]) and one["max_model_len"] == 8192
        assert c.post(f"{prefix}/detokenize", json={"tokens": one["tokens"]}).json() == {"text": "Hello world"}
    many = c.post("/tokenize", json={"prompt": ["a b", "c"]}).json()
    assert many["count"] == [len(t) for t in many["tokens"]]
    assert c.post("/detokenize", json={"tokens": many["tokens"]}).json()["text"] == ["a b", "c"]
    chat = c.post("/v1/tokenize", json={"messages": [{"role": "user", "content": "Hi"}]}).json()
    templated = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}).json()
    assert chat["count"] == templated["usage"]["prompt_tokens"]
    for bad in ({}, {"prompt": "a", "messages": [{"role": "user", "content": "x"}]}, {"prompt": 5}):
        assert c.post("/tokenize", json=bad).status_code == 400
    assert c.post("/detokenize", json={"tokens": [10**9]}).status_code == 400


def test_cache_state(server):
    c = server.client
    before = c.get("/cache_state").json()
    assert len(before["instance_id"]) == 32 and before["max_total_num_tokens"] == 4096
    gen(server, text="A prompt that leaves something in the radix cache for a while", sampling_params=GREEDY)
    mid = c.get("/cache_state").json()
    assert mid["cached_tokens"] > before["cached_tokens"] and mid["flush_count"] == before["flush_count"]
    assert c.post("/flush_cache").status_code == 200
    after = c.get("/cache_state").json()
    assert after["flush_count"] == before["flush_count"] + 1 and after["cached_tokens"] == 0
    assert after["instance_id"] == before["instance_id"] and after["evicted_tokens_total"] >= before["evicted_tokens_total"]


def test_loads(server):
    load = server.client.get("/v1/loads").json()["loads"][0]
    assert load["dp_rank"] == 0 and load["max_total_num_tokens"] == 4096
    assert load["num_running_reqs"] == 0 and load["num_waiting_reqs"] == 0 and 0 <= load["token_usage"] <= 1


def test_cached_tokens_and_flush_cache(server):
    prompt = "A completely different prompt about caching radix trees in language model servers"
    first = gen(server, text=prompt, sampling_params={"temperature": 0, "max_new_tokens": 2}).json()["meta_info"]
    second = gen(server, text=prompt, sampling_params={"temperature": 0, "max_new_tokens": 2}).json()["meta_info"]
    assert first["cached_tokens"] == 0 and second["cached_tokens"] == second["prompt_tokens"] - 1
    assert server.client.post("/flush_cache").status_code == 200, server.client.get("/server_info").json()["internal_states"]
    third = gen(server, text=prompt, sampling_params={"temperature": 0, "max_new_tokens": 2}).json()["meta_info"]
    assert third["cached_tokens"] == 0


def test_flush_cache_refused_while_running_and_abort(server):
    async def main():
        async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as c:
            a = asyncio.create_task(c.post("/generate", json={"text": PROMPT, "sampling_params": LONG, "rid": "long-a"}))
            b = asyncio.create_task(c.post("/generate", json={"text": "Hi", "sampling_params": LONG, "rid": "long-b"}))
            d = asyncio.create_task(c.post("/generate", json={"text": "Yo", "sampling_params": LONG, "rid": "long-d"}))
            await asyncio.sleep(1.0)
            refused = (await c.post("/flush_cache")).status_code
            one = await c.post("/abort_request", json={"rid": "long-a"})
            ra = (await a).json()
            assert not b.done()
            await c.post("/abort_request", json={"abort_all": True})
            return refused, one.status_code, ra, (await b).json(), (await d).json()

    refused, status, ra, rb, rd = asyncio.run(main())
    assert refused == 400 and status == 200
    for r, rid in ((ra, "long-a"), (rb, "long-b"), (rd, "long-d")):
        assert r["meta_info"]["id"] == rid and r["meta_info"]["finish_reason"]["type"] == "abort"
        assert r["meta_info"]["completion_tokens"] < 1000
    st = wait_idle(server)
    assert st["is_idle"] and st["protected_tokens"] == 0


def test_stream_disconnect_aborts_the_request(server):
    with server.client.stream("POST", "/generate", json={"text": PROMPT, "sampling_params": LONG, "stream": True}) as r:
        lines = r.iter_lines()
        got = 0
        for line in lines:
            got += line.startswith("data: ")
            if got == 3:
                break
    # 1000 tokens would take far longer than this: the disconnect aborted the request and freed its KV.
    st = wait_idle(server, timeout=5.0)
    assert st["is_idle"] and st["protected_tokens"] == 0
    assert st["available_tokens"] + st["evictable_tokens"] == st["max_total_num_tokens"]
    assert server.client.get("/health").status_code == 200


def test_non_streaming_disconnect_aborts_the_request(server):
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.base_url}/generate", json={"text": PROMPT, "sampling_params": LONG}, timeout=1.0)
    st = wait_idle(server, timeout=5.0)
    assert st["is_idle"] and st["protected_tokens"] == 0


BAD = [
    (b"{not json", "JSON"),
    (b"[1, 2]", "JSON object"),
    ({"text": "hi", "bogus": 1}, "bogus"),
    ({}, "exactly one"),
    ({"text": ""}, "empty"),
    ({"input_ids": [1, 2, 10**9]}, "input_ids"),
    ({"text": "hi", "sampling_params": {"temperature": -1}}, "temperature"),
    ({"text": "hi", "sampling_params": {"top_p": 0}}, "top_p"),
    ({"text": "hi", "sampling_params": {"max_new_tokens": 10**9}}, "context length"),
    ({"text": "hi", "sampling_params": {"nope": 1}}, "nope"),
    ({"text": "hi", "sampling_params": "hot"}, "sampling_params"),
    ({"text": "hi", "return_logprob": True, "logprob_start_len": 50}, "logprob_start_len"),
    ({"text": ["a", "b"], "stream": True}, "streaming"),
    ({"text": "hi", "stream": "yes"}, "stream"),
    ({"text": 5}, "text"),
]


@pytest.mark.parametrize("body, message", BAD)
def test_invalid_requests_are_400(server, body, message):
    if isinstance(body, bytes):
        r = server.client.post("/generate", content=body, headers={"content-type": "application/json"})
    else:
        r = server.client.post("/generate", json=body)
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["object"] == "error" and err["type"] == "BadRequestError" and err["code"] == 400 and err["param"] is None
    assert message.lower() in err["message"].lower()


def test_info_and_health_endpoints(server):
    c = server.client
    assert c.get("/health").status_code == 200
    assert c.get("/health_generate").status_code == 200
    for path in ("/model_info", "/get_model_info"):
        info = c.get(path).json()
        assert info["is_generation"] is True and info["architectures"] == ["LlamaForCausalLM"]
    for path in ("/server_info", "/get_server_info"):
        si = c.get(path).json()
        assert si["model_path"] == "default" and si["max_total_num_tokens"] == 4096 and si["max_running_requests"] >= 1
        kv = si["kv_cache"]  # SmolLM2-135M: 30 layers of 3 KV heads of 64
        assert kv["layout"] == "mha" and kv["row_shape"] == [3, 64] and kv["bytes_per_token"] == 30 * 2 * 3 * 64 * 4
    assert c.post("/abort_request", json={}).status_code == 400
    assert c.post("/abort_request", content=b"nope").status_code == 400


def test_sigterm_stops_server_and_children(server):
    """Runs last: it ends the module's server."""
    kids = child_pids(server.proc.pid)
    assert len(kids) >= 2
    server.proc.send_signal(signal.SIGTERM)
    # uvicorn re-raises the signal after its graceful shutdown, so the exit reads as "terminated by SIGTERM".
    assert server.proc.wait(30) in (0, -signal.SIGTERM)
    deadline = time.monotonic() + 10
    while any(pid_alive(k) for k in kids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(pid_alive(k) for k in kids)
