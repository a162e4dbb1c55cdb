"""Serving robustness: disconnects, aborts, floods, the queue limit, invalid input, the API key,
/metrics, the watchdog and SIGTERM. One server (with a key and a queue limit) for most tests; the
SIGTERM test runs last on it. The watchdog test runs a TokenizerManager in-process."""
from __future__ import annotations

import asyncio
import signal
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.runtime.server.conftest import child_pids, kv_idle, kv_state, pid_alive, start_server, stop_server, wait_idle

KEY = "sekrit"
AUTH = {"Authorization": f"Bearer {KEY}"}
MAX_RUNNING, MAX_QUEUED = 8, 16


@pytest.fixture(scope="module")
def srv():
    h = start_server("--max-running-requests", str(MAX_RUNNING), "--max-queued-requests", str(MAX_QUEUED), "--api-key", KEY)
    h.client.headers.update(AUTH)
    yield h
    stop_server(h)




def _gen(text: str = "Once upon a time", n: int = 8, **sp) -> dict:
    return {"text": text, "sampling_params": {"max_new_tokens": n, "temperature": 0, **sp}}


def test_api_key(srv):
    bare = httpx.Client(base_url=srv.base_url, timeout=30)
    for path, method in (("/generate", "POST"), ("/server_info", "GET"), ("/flush_cache", "POST")):
        r = bare.request(method, path, json=_gen())
        assert r.status_code == 401 and r.json()["code"] == 401 and r.json()["message"]
        r = bare.request(method, path, json=_gen(), headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401
    assert bare.post("/generate", json=_gen(), headers=AUTH).status_code == 200
    assert bare.get("/health").status_code == 200
    assert bare.get("/metrics").status_code == 200
    bare.close()


BAD_REQUESTS = [
    ("not json", b"{nope"),
    ("json array", b"[1, 2]"),
    ("json string", b'"hello"'),
    ("no prompt", {"sampling_params": {"max_new_tokens": 4}}),
    ("text and input_ids", {"text": "hi", "input_ids": [1, 2]}),
    ("text wrong type", {"text": 5}),
    ("empty prompt", {"text": ""}),
    ("empty input_ids", {"input_ids": []}),
    ("input_ids strings", {"input_ids": ["a", "b"]}),
    ("input_ids negative", {"input_ids": [-1, 2]}),
    ("input_ids out of vocab", {"input_ids": [10**9]}),
    ("too long prompt", {"input_ids": [1] * 5000}),
    ("unknown top-level field", {"text": "hi", "bogus": 1}),
    ("unknown sampling field", {"text": "hi", "sampling_params": {"bogus": 1}}),
    ("sampling_params not a dict", {"text": "hi", "sampling_params": 3}),
    ("temperature negative", {"text": "hi", "sampling_params": {"temperature": -1}}),
    ("temperature string", {"text": "hi", "sampling_params": {"temperature": "hot"}}),
    ("top_p zero", {"text": "hi", "sampling_params": {"top_p": 0}}),
    ("top_p above one", {"text": "hi", "sampling_params": {"top_p": 1.5}}),
    ("top_k zero", {"text": "hi", "sampling_params": {"top_k": 0}}),
    ("min_p above one", {"text": "hi", "sampling_params": {"min_p": 2}}),
    ("frequency_penalty", {"text": "hi", "sampling_params": {"frequency_penalty": 3}}),
    ("repetition_penalty zero", {"text": "hi", "sampling_params": {"repetition_penalty": 0}}),
    ("max_new_tokens negative", {"text": "hi", "sampling_params": {"max_new_tokens": -5}}),
    ("max_new_tokens float", {"text": "hi", "sampling_params": {"max_new_tokens": 1.5}}),
    ("min above max", {"text": "hi", "sampling_params": {"min_new_tokens": 9, "max_new_tokens": 2}}),
    ("stop wrong type", {"text": "hi", "sampling_params": {"stop": 7}}),
    ("stop_token_ids out of vocab", {"text": "hi", "sampling_params": {"stop_token_ids": [10**9]}}),
    ("stream not bool", {"text": "hi", "stream": "yes"}),
    ("return_logprob not bool", {"text": "hi", "return_logprob": 1}),
    ("top_logprobs_num negative", {"text": "hi", "return_logprob": True, "top_logprobs_num": -1}),
    ("rid not string", {"text": "hi", "rid": 5}),
    ("stream with batch", {"text": ["a", "b"], "stream": True}),
]


@pytest.mark.parametrize("name,body", BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
def test_invalid_generate_is_4xx(srv, name, body):
    kw = {"content": body} if isinstance(body, bytes) else {"json": body}
    r = srv.client.post("/generate", headers={"Content-Type": "application/json"}, **kw)
    assert 400 <= r.status_code < 500, (name, r.status_code, r.text)
    assert r.json()["message"], name


def test_still_healthy_after_invalid_input(srv):
    assert srv.client.get("/health").status_code == 200
    assert srv.client.post("/generate", json=_gen()).status_code == 200


def _metrics(srv) -> dict[str, float]:
    text = httpx.get(srv.base_url + "/metrics").text
    return {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples if not s.labels
            or s.labels == {"le": "+Inf"}}


def test_metrics_move(srv):
    before = _metrics(srv)
    for stream in (False, True):
        r = srv.client.post("/generate", json={**_gen(n=6, ignore_eos=True), "stream": stream})
        assert r.status_code == 200 and "[DONE]" in r.text if stream else r.status_code == 200
    after = _metrics(srv)
    assert after["radixlm:num_requests_total"] - before["radixlm:num_requests_total"] == 2
    assert after["radixlm:generation_tokens_total"] - before["radixlm:generation_tokens_total"] == 12
    assert after["radixlm:prompt_tokens_total"] > before["radixlm:prompt_tokens_total"]
    assert after["radixlm:cached_tokens_total"] > before["radixlm:cached_tokens_total"]  # same prompt twice
    for h in ("e2e_request_latency_seconds", "queue_time_seconds"):
        assert after[f"radixlm:{h}_count"] - before[f"radixlm:{h}_count"] == 2, h
    assert after["radixlm:time_to_first_token_seconds_count"] - before["radixlm:time_to_first_token_seconds_count"] == 1
    assert after["radixlm:inter_token_latency_seconds_count"] > before["radixlm:inter_token_latency_seconds_count"]
    assert 0 < after["radixlm:cache_hit_rate"] <= 1
    assert after["radixlm:num_running_reqs"] == 0 and 0 <= after["radixlm:token_usage"] <= 1


async def _stream_then_drop(base: str, i: int) -> None:
    async with httpx.AsyncClient(base_url=base, timeout=60, headers=AUTH) as c:
        body = {**_gen(f"Story number {i}:", n=400, ignore_eos=True), "stream": True}
        async with c.stream("POST", "/generate", json=body) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    return  # leaving the block drops the connection mid-stream


def test_killed_streams_free_kv(srv):
    async def main():
        await asyncio.gather(*(_stream_then_drop(srv.base_url, i) for i in range(16)))
    asyncio.run(main())
    assert kv_idle(wait_idle(srv, timeout=8))


def test_abort_all(srv):
    results: list[dict] = []

    def run():
        results.append(srv.client.post("/generate", json=_gen("Abort me", n=1000, ignore_eos=True)).json())
    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 10
    while kv_state(srv)["num_running_reqs"] == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert srv.client.post("/abort_request", json={"abort_all": True}).status_code == 200
    for t in threads:
        t.join(20)
    assert len(results) == 3 and all(r["meta_info"]["finish_reason"]["type"] == "abort" for r in results), results
    assert kv_idle(wait_idle(srv))


async def _fire(base: str, n: int, timeout: float, max_new: int) -> list[int | None]:
    async with httpx.AsyncClient(base_url=base, timeout=timeout, headers=AUTH,
                                 limits=httpx.Limits(max_connections=n)) as c:
        async def one(i):
            try:
                r = await c.post("/generate", json=_gen(f"Flood {i}", n=max_new, ignore_eos=True))
                return r.status_code if r.status_code != 503 or "queue full" in r.json()["message"] else -1
            except httpx.TimeoutException:
                return None
        return await asyncio.gather(*(one(i) for i in range(n)))


def test_flood_with_client_timeouts(srv):
    codes = asyncio.run(_fire(srv.base_url, 100, 0.5, 64))
    assert -1 not in codes and set(codes) <= {None, 200, 503}
    assert kv_idle(wait_idle(srv))
    deadline = time.monotonic() + 5  # handlers of timed-out clients notice the disconnect within ~0.5 s
    while (r := srv.client.post("/generate", json=_gen())).status_code == 503 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert r.status_code == 200, r.text


def test_queue_full(srv):
    codes = asyncio.run(_fire(srv.base_url, 40, 60, 6))
    assert codes.count(503) >= 1 and codes.count(200) >= MAX_RUNNING, codes
    assert set(codes) <= {200, 503}
    assert kv_idle(wait_idle(srv))


def test_sigterm_drains(srv):
    """Runs last on the module server: in-flight requests finish (or fail cleanly), every process exits."""
    kids = child_pids(srv.proc.pid)
    codes: list[int] = []

    def run(i):
        try:
            r = httpx.post(srv.base_url + "/generate", json=_gen(f"Drain {i}", n=12, ignore_eos=True), headers=AUTH, timeout=60)
            assert r.status_code == 200 or (r.status_code == 503 and r.json()["message"]), r.text
            codes.append(r.status_code)
        except httpx.TransportError:
            codes.append(-1)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    srv.proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(60)
    assert codes.count(200) == 4, codes
    assert srv.proc.wait(40) is not None
    deadline = time.monotonic() + 10
    while any(pid_alive(k) for k in kids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(pid_alive(k) for k in kids)


def test_watchdog_fails_stalled_requests():
    """In-process: a TokenizerManager over a 'scheduler' that never answers (no model needed)."""
    from types import SimpleNamespace

    from radixlm.runtime.args import ServerArgs
    from radixlm.runtime.messages import TokenizedGenerateReqInput
    from radixlm.runtime.sampling.sampling_params import SamplingParams
    from radixlm.runtime.ipc import PortArgs
    from radixlm.runtime.tokenizer_manager import RequestFailed, TokenizerManager

    ports = PortArgs.new()
    info = SimpleNamespace(vocab_size=100, context_len=64, max_total_num_tokens=64, max_running_requests=4,
                           embedding_dim=0, model_path="/nonexistent")  # not a model directory: a text-only front
    runtime = SimpleNamespace(server_args=ServerArgs(watchdog_timeout=0.4), info=info, ports=ports, dead_child=lambda: None)
    tm = TokenizerManager(runtime, tokenizer=None)

    async def main():
        await tm.start()
        try:
            await asyncio.sleep(0.8)
            assert tm.dead is None  # idle (nothing pending) for longer than the timeout: not a stall
            msg = TokenizedGenerateReqInput("r1", [1, 2, 3], SamplingParams())
            t0 = time.monotonic()
            with pytest.raises(RequestFailed, match="watchdog") as failed:
                async for _ in tm.generate_stream(msg, False):
                    pass
            assert 0.4 <= time.monotonic() - t0 < 3 and tm.dead and not tm.rid_to_state
            assert failed.value.status_code == 500  # accepted, then failed: a router must not resend it
        finally:
            await tm.stop()
    asyncio.run(main())
    ports.cleanup()
