"""End to end through a router subprocess over two real SmolLM2 workers: a generated-shared-prefix workload
lands group by group under cache_aware and spreads under round_robin; SSE and the OpenAI routes pass through."""
from __future__ import annotations

import json

import pytest

from tests.router.conftest import start_router, stop_router

pytestmark = pytest.mark.slow

GROUPS, PER_GROUP = 3, 4  # 3 groups over 2 workers: round robin cannot keep a group on one worker by chance


def system_prompt(g: int) -> str:
    topics = ["astronomy and the night sky", "cooking Italian pasta at home", "repairing old bicycles"]
    return (f"You are assistant number {g}, an expert in {topics[g]}. " * 6) + "Answer in one word. "


def run_workload(router) -> tuple[dict[int, set[str]], int, int]:
    """Interleaved groups, one request at a time. Returns workers per group, cached and prompt tokens of the
    requests after each group's first."""
    where: dict[int, set[str]] = {g: set() for g in range(GROUPS)}
    cached = prompt = 0
    for p in range(PER_GROUP):
        for g in range(GROUPS):
            r = router.client.post("/generate", json={
                "text": system_prompt(g) + f"Question {p}: name a colour.",
                "sampling_params": {"max_new_tokens": 1, "temperature": 0}})
            assert r.status_code == 200, r.text
            where[g].add(r.headers["x-radixlm-worker"])
            if p > 0:
                cached += r.json()["meta_info"]["cached_tokens"]
                prompt += r.json()["meta_info"]["prompt_tokens"]
    return where, cached, prompt


@pytest.fixture
def router_for(fleet):
    started = []

    def make(*flags: str):
        h = start_router(fleet.urls, *flags)
        started.append(h)
        assert h.client.post("/flush_cache").status_code == 200  # every run starts from cold workers
        return h
    yield make
    for h in started:
        stop_router(h)


def test_cache_aware_keeps_groups_on_one_worker(router_for):
    router = router_for("--policy", "cache_aware")
    where, cached, prompt = run_workload(router)
    assert all(len(ws) == 1 for ws in where.values()), where
    assert len(set().union(*where.values())) == 2, "groups are spread over both workers"
    assert cached / prompt > 0.7, (cached, prompt)
    info = router.client.get("/server_info").json()
    assert info["estimated_cache_hit_rate"] > 0.5
    metrics = router.client.get("/metrics").text
    assert 'radixlm_router:worker_selection_total{policy="cache_aware"' in metrics


def test_round_robin_spreads_groups(router_for):
    router = router_for("--policy", "round_robin")
    where, cached, prompt = run_workload(router)
    assert all(len(ws) == 2 for ws in where.values()), where
    # Each group's prefix is prefilled on both workers: fewer hits than cache_aware's one miss per group.
    assert cached / prompt < 0.7, (cached, prompt)


def test_streaming_openai_and_admin_routes(router_for, fleet):
    router = router_for("--policy", "cache_aware")
    with router.client.stream("POST", "/generate", json={
            "text": "Count: one, two,", "stream": True, "sampling_params": {"max_new_tokens": 3}}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and len(events) >= 2
    assert "text" in json.loads(events[-2][6:])
    chat = router.client.post("/v1/chat/completions", json={
        "model": "default", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
    assert chat.status_code == 200 and chat.json()["usage"]["completion_tokens"] >= 1
    msg = router.client.post("/v1/messages", json={
        "model": "default", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]})
    assert msg.status_code == 200 and msg.json()["type"] == "message"
    models = router.client.get("/v1/models").json()
    assert len(models["data"]) == 1
    loads = router.client.get("/v1/loads").json()["workers"]
    assert sorted(w["worker"] for w in loads) == sorted(fleet.urls)
    assert all(w["loads"] and "num_running_reqs" in w["loads"][0] for w in loads)
    bad = router.client.post("/generate", content=b"{oops", headers={"content-type": "application/json"})
    assert bad.status_code == 400 and bad.json()["object"] == "error"
