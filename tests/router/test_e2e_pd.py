"""`radixlm router --pd-disaggregation` in front of one prefill and one decode server (a tiny float32 random Llama):
the same greedy tokens as a plain server, streamed and not; the faults (a room whose prefill never comes, a room no
decode server fetches, a client that goes away) leave both servers' KV accounting whole. One module fixture starts
the three processes; the decode server, called without bootstrap fields, is the plain server it is compared with."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx
import pytest
from transformers import LlamaConfig

from radixlm.runtime.ipc import die_with_parent
from tests.router.conftest import start_router, stop_router
from tests.runtime.models.tiny import random_prompts, save_tiny
from tests.runtime.server.conftest import free_port, stop_server, wait_healthy

CFG = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False)
SP = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
DECODE_TIMEOUT_S = 3


def _server(model: str, *flags: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "radixlm.launch_server", "--model-path", model, "--dtype", "float32", "--port",
           str(port), "--max-total-tokens", "2048", "--random-seed", "0", "--enable-integrity-check", "--log-level",
           "warning", *flags]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, env=env, preexec_fn=die_with_parent), f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def pd(tmp_path_factory):
    model = tmp_path_factory.mktemp("pd-llama")
    save_tiny(LlamaConfig(**CFG), model, seed=0)
    bootstrap = free_port()
    procs = [_server(str(model), "--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port",
                     str(bootstrap)),
             _server(str(model), "--disaggregation-mode", "decode", "--disaggregation-timeout",
                     str(DECODE_TIMEOUT_S))]
    handles = []
    try:
        handles = [wait_healthy(proc, url) for proc, url in procs]
        router = start_router([], "--pd-disaggregation", "--prefill", handles[0].base_url, str(bootstrap),
                              "--decode", handles[1].base_url, "--prefill-policy", "cache_aware",
                              "--decode-policy", "power_of_two")
        try:
            yield router, handles[0], handles[1], bootstrap
        finally:
            stop_router(router)
    finally:
        for proc, _ in procs:
            if proc.poll() is None and not any(h.proc is proc for h in handles):
                proc.kill()
                proc.wait()
        for h in handles:
            stop_server(h)


def _state(h) -> dict:
    return h.client.get("/server_info").json()["internal_states"][0]


def _settled(h) -> dict:
    """The server's state once idle; its accounting checked (free + evictable == pool: nothing held)."""
    deadline = time.monotonic() + 10
    while True:
        s = _state(h)
        if s["is_idle"] or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert s["is_idle"], s
    assert s["protected_tokens"] == 0
    assert s["available_tokens"] + s["evictable_tokens"] == s["max_total_num_tokens"]
    return s


def test_pd_same_greedy_tokens_as_a_plain_server(pd):
    router, prefill, decode, _ = pd
    prompts = random_prompts(3, [6, 21, 40], CFG["vocab_size"])
    plain = [decode.client.post("/generate", json={"input_ids": p, "sampling_params": SP}).json()["output_ids"]
             for p in prompts]
    before_p, before_d = _state(prefill), _state(decode)
    for p, want in zip(prompts, plain):
        r = router.client.post("/generate", json={"input_ids": p, "sampling_params": SP})
        assert r.status_code == 200, r.text
        assert r.json()["output_ids"] == want
        assert r.headers["x-radixlm-decode"] == decode.base_url
    after_p, after_d = _settled(prefill), _settled(decode)
    assert after_d["disaggregation"]["received"] - before_d["disaggregation"]["received"] == len(prompts)
    assert after_p["disaggregation"]["published"] - before_p["disaggregation"]["published"] == len(prompts)
    # The decode server computed no prompt: its prefill passes did not grow.
    assert after_d["stats"]["prefill_batches"] == before_d["stats"]["prefill_batches"]

    r = router.client.post("/v1/completions", json={"prompt": prompts[0], "max_tokens": 8, "temperature": 0,
                                                     "ignore_eos": True})
    assert r.status_code == 200, r.text
    direct = decode.client.post("/v1/completions", json={"prompt": prompts[0], "max_tokens": 8, "temperature": 0,
                                                         "ignore_eos": True})
    assert r.json()["choices"][0]["text"] == direct.json()["choices"][0]["text"]
    r = router.client.post("/generate", json={"input_ids": prompts[1], "sampling_params": SP, "stream": True})
    assert r.status_code == 200
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    assert events[-1]["output_ids"] == plain[1] and len(events) > 1
    _settled(decode)


def test_pd_faults_leave_no_page_behind(pd):
    router, prefill, decode, bootstrap = pd
    ids = random_prompts(4, [12], CFG["vocab_size"])[0]
    # A room whose prefill never comes (a dead or absent prefill server): the decode server ends it after its
    # timeout with a clear error.
    t0 = time.monotonic()
    r = decode.client.post("/generate", json={"input_ids": ids, "sampling_params": SP, "bootstrap_host": "127.0.0.1",
                                              "bootstrap_port": bootstrap, "bootstrap_room": 12345})
    assert time.monotonic() - t0 >= DECODE_TIMEOUT_S - 0.5
    assert "no KV for room 12345" in r.text, r.text
    _settled(decode)
    # A room no decode server fetches (a decode server that died): the prefill server's pages are back at once.
    r = prefill.client.post("/generate", json={"input_ids": ids, "sampling_params": SP, "bootstrap_host": "127.0.0.1",
                                               "bootstrap_port": bootstrap, "bootstrap_room": 777})
    assert r.status_code == 200 and len(r.json()["output_ids"]) == 1
    assert _settled(prefill)["disaggregation"]["unclaimed"] >= 1
    # A client that goes away mid-stream: both servers drop the request (the decode server long before its 480 tokens).
    passes = _state(decode)["stats"]["decode_batches"]
    with httpx.stream("POST", router.base_url + "/generate", timeout=60, json={
            "input_ids": ids, "stream": True, "sampling_params": {**SP, "max_new_tokens": 480}}) as s:
        for line in s.iter_lines():
            if line.startswith("data: {"):
                break
    assert _settled(decode)["stats"]["decode_batches"] - passes < 400
    _settled(prefill)
    # Partial bootstrap fields are refused.
    r = router.client.post("/generate", json={"input_ids": ids, "sampling_params": SP}, )
    assert r.status_code == 200
    bad = decode.client.post("/generate", json={"input_ids": ids, "sampling_params": SP, "bootstrap_room": 1})
    assert bad.status_code == 400 and "go together" in bad.text
