"""priority and timeout_s over HTTP, on the session's shared server (no priority scheduling, no server deadlines): a
priority is accepted and ignored, bad values are refused, and a request's own timeout_s ends it with finish_reason
abort on the native and OpenAI APIs, its KV freed."""
from __future__ import annotations

import pytest

from radixlm.runtime.scheduler.deadlines import request_timeout_message
from tests.runtime.server.conftest import wait_idle

pytestmark = pytest.mark.slow

LONG = {"temperature": 0, "max_new_tokens": 1000, "ignore_eos": True}


def test_priority_and_timeout_fields(server):
    c = server.client
    ok = c.post("/generate", json={"text": "Hi", "sampling_params": {"max_new_tokens": 2}, "priority": 5})
    assert ok.status_code == 200 and ok.json()["meta_info"]["finish_reason"]["type"] == "length"
    for bad in ({"priority": "high"}, {"priority": 1.5}, {"timeout_s": 0}, {"timeout_s": "soon"}):
        r = c.post("/generate", json={"text": "Hi", **bad})
        assert r.status_code == 400, (bad, r.text)
    native = c.post("/generate", json={"text": "Once upon a time", "sampling_params": LONG, "timeout_s": 0.3}).json()
    assert native["meta_info"]["finish_reason"] == {"type": "abort", "message": request_timeout_message(0.3)}
    assert 0 < native["meta_info"]["completion_tokens"] < 1000
    chat = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Tell a story"}],
                                                 "max_tokens": 1000, "ignore_eos": True, "temperature": 0,
                                                 "timeout_s": 0.3, "priority": -3}).json()
    assert chat["choices"][0]["finish_reason"] == "abort"
    info = c.get("/server_info").json()
    assert info["enable_priority_scheduling"] is False and info["req_waiting_timeout"] is None
    state = info["internal_states"][0]
    assert state["req_running_timeout_s"] is None and state["stats"]["deadline_aborts"] >= 2
    wait_idle(server)
