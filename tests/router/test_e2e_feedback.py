"""--cache-feedback end to end over two real SmolLM2 workers: a /flush_cache sent straight to a worker (behind
the router's back) leaves phantom affinity without feedback, and none with it (by the poll, or by the cached
tokens the next response reports)."""
from __future__ import annotations

import time

import httpx
import pytest

from tests.router.conftest import kill_hard, start_router, start_worker_proc, stop_router, wait_healthy

pytestmark = pytest.mark.slow

GROUP_A = "You are a ship's navigator. Plot every course by the stars and explain your reasoning. " * 4
# A loaded 2-core machine can keep a worker from answering a /cache_state poll within the default 5 s: the tests
# check what the polls do, not how fast the workers answer them.
PATIENT = ("--health-check-timeout-secs", "30")
GROUP_B = "You are a baker. Describe each loaf you make, its crust, its crumb and its rising time. " * 4


def generate(router, text: str) -> httpx.Response:
    r = router.client.post("/generate", json={"text": text, "sampling_params": {"max_new_tokens": 1,
                                                                               "temperature": 0}})
    assert r.status_code == 200, r.text
    return r


def feedback(router) -> dict:
    return router.client.get("/cache_feedback").json()


def wait_for(pred, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return False


def flush_behind_the_routers_back(router, fleet) -> str:
    """Group A lands on one worker (twice: real affinity), group B on the other; then A's worker is flushed
    directly. Returns A's worker."""
    assert router.client.post("/flush_cache").status_code == 200
    a = generate(router, GROUP_A + "Question 0?").headers["x-radixlm-worker"]
    again = generate(router, GROUP_A + "Question 1?")
    assert again.headers["x-radixlm-worker"] == a and again.json()["meta_info"]["cached_tokens"] > 50
    assert generate(router, GROUP_B + "Question 0?").headers["x-radixlm-worker"] != a
    assert httpx.post(a + "/flush_cache", timeout=30).status_code == 200
    return a


def next_of_group_a(router) -> tuple[dict, dict, httpx.Response]:
    before = feedback(router)
    r = generate(router, GROUP_A + "Question 2?")
    return before, feedback(router), r


@pytest.fixture
def router_for(fleet):
    started = []

    def make(*flags: str):
        h = start_router(fleet.urls, "--policy", "cache_aware", *flags)
        started.append(h)
        return h
    yield make
    for h in started:
        stop_router(h)


def test_without_feedback_the_flushed_worker_keeps_phantom_affinity(router_for, fleet):
    router = router_for()
    a = flush_behind_the_routers_back(router, fleet)
    time.sleep(1.0)  # as long as the feedback run waits below: time alone fixes nothing
    before, after, r = next_of_group_a(router)
    assert after["decisions"]["cache_hit"] == before["decisions"]["cache_hit"] + 1, "routed on phantom affinity"
    assert r.headers["x-radixlm-worker"] == a
    assert after["estimated_cached_chars"] - before["estimated_cached_chars"] >= len(GROUP_A)
    assert r.json()["meta_info"]["cached_tokens"] < 10, "the worker really had nothing"
    assert after["tree_chars"][a] > 0 and after["clears"] == 0 and after["phantom_drops"] == 0


def test_with_feedback_the_poll_clears_the_flushed_worker(router_for, fleet):
    router = router_for("--cache-feedback", "--cache-feedback-interval", "0.2", *PATIENT)
    a = flush_behind_the_routers_back(router, fleet)
    assert wait_for(lambda: feedback(router)["clears"] >= 1), feedback(router)
    assert feedback(router)["tree_chars"][a] == 0
    before, after, r = next_of_group_a(router)
    # No worker is credited with A any more: the estimated match is 0 and the load decides.
    assert after["estimated_cached_chars"] == before["estimated_cached_chars"]
    assert after["decisions"].get("min_load", 0) == before["decisions"].get("min_load", 0) + 1
    assert after["decisions"]["cache_hit"] == before["decisions"]["cache_hit"]
    assert after["polls"] > 0 and after["poll_errors"] == 0
    metrics = router.client.get("/metrics").text
    assert 'radixlm_router:cache_feedback_corrections_total{kind="clear"}' in metrics


def test_with_feedback_a_response_reveals_the_phantom_before_the_poll(router_for, fleet):
    # The first poll (at start) takes a baseline; the next one is far off, so only the response can tell.
    router = router_for("--cache-feedback", "--cache-feedback-interval", "60", *PATIENT)
    a = flush_behind_the_routers_back(router, fleet)
    before, after, r = next_of_group_a(router)
    assert r.headers["x-radixlm-worker"] == a and after["clears"] == 0
    assert after["phantom_drops"] == before["phantom_drops"] + 1
    # The phantom sibling (Question 0/1) is gone; the text just served is really cached there now.
    assert after["tree_chars"][a] < before["tree_chars"][a]
    fb = feedback(router)
    assert fb["reported_prompt_tokens"] > 0 and 0 <= fb["reported_cache_hit_rate"] < fb["estimated_cache_hit_rate"]


def test_with_feedback_a_restarted_worker_is_cleared(router_for, fleet):
    # Health checks are left at their 60 s default: only the new instance_id can reveal the restart.
    router = router_for("--cache-feedback", "--cache-feedback-interval", "0.2", *PATIENT)
    a = flush_behind_the_routers_back(router, fleet)
    i = fleet.urls.index(a)
    kill_hard(fleet.workers[i])
    fleet.workers[i] = wait_healthy(start_worker_proc(int(a.rsplit(":", 1)[1])), a)
    assert wait_for(lambda: feedback(router)["clears"] >= 1), feedback(router)
    fb = feedback(router)
    assert fb["tree_chars"][a] == 0 and fb["tree_chars"][fleet.urls[1 - i]] > 0
    assert fb["poll_errors"] >= 1, "the poll saw the worker gone while it restarted"
