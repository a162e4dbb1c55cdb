"""End to end through a router subprocess over the two real SmolLM2 workers of tests/router/conftest.py's `fleet`, in
one module so that a run starts the fleet once (under xdist a module stays on one worker; modules spread over both).

Failover: a worker SIGKILLed under load. No request is lost: those the victim had in flight when it died are resent
once to the other worker (they may have been read, so once only) and succeed there, and every request started after
the kill succeeds on the other worker; /workers shows the victim down at once, and with the router's default
health-check and circuit-breaker settings it takes traffic again within 10 s of passing its health check once
restarted on its port.

--cache-feedback: a /flush_cache sent straight to a worker (behind the router's back) leaves phantom affinity without
feedback, and none with it (by the poll, or by the cached tokens the next response reports); a worker restarted (the
failover test's victim) is cleared by the poll.

Routing: a generated-shared-prefix workload lands group by group under cache_aware and spreads under round_robin; SSE
and the OpenAI routes pass through."""
from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import pytest

from radixlm.router.app import WORKER_HEADER
from tests.router.conftest import (WORKER_STARTUP_S, kill_hard, start_router, start_worker_proc, stop_router,
                                   wait_healthy)

pytestmark = pytest.mark.slow


def wait_for(pred, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return False


# ---- failover
N_REQUESTS = 24
CONCURRENCY = 4
PICKUP_S = 10.0  # the restarted victim serves within this of passing its health check


@dataclass(frozen=True)
class Outcome:
    started: float  # time.monotonic() when the client sent it
    status: int
    worker: str  # the x-radixlm-worker header: who served (or failed) it
    body: str


def worker_state(router, url: str) -> dict:
    return next(w for w in router.client.get("/workers").json()["workers"] if w["url"] == url)


def run_and_kill(router, victim) -> tuple[list[Outcome], float]:
    """N_REQUESTS over CONCURRENCY threads; the victim is SIGKILLed once 4 have finished. Returns the outcomes
    and when the kill was complete."""
    done = []
    killed_at: list[float] = []

    def one(i: int) -> Outcome:
        started = time.monotonic()
        with httpx.Client(base_url=router.base_url, timeout=120) as c:
            r = c.post("/generate", json={"text": f"Request {i}: the sky is",
                                          "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}})
        done.append(i)
        return Outcome(started, r.status_code, r.headers.get(WORKER_HEADER, ""), r.text)

    def killer() -> None:
        wait_for(lambda: len(done) >= 4, 120)
        kill_hard(victim)
        killed_at.append(time.monotonic())

    k = threading.Thread(target=killer)
    k.start()
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        results = list(pool.map(one, range(N_REQUESTS)))
    k.join()
    assert killed_at, "the victim was not killed"
    return results, killed_at[0]


# ---- --cache-feedback
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
def cache_aware_router_for(fleet):
    started = []

    def make(*flags: str):
        h = start_router(fleet.urls, "--policy", "cache_aware", *flags)
        started.append(h)
        return h
    yield make
    for h in started:
        stop_router(h)


def test_without_feedback_the_flushed_worker_keeps_phantom_affinity(cache_aware_router_for, fleet):
    router = cache_aware_router_for()
    a = flush_behind_the_routers_back(router, fleet)
    time.sleep(1.0)  # as long as the feedback run waits below: time alone fixes nothing
    before, after, r = next_of_group_a(router)
    assert after["decisions"]["cache_hit"] == before["decisions"]["cache_hit"] + 1, "routed on phantom affinity"
    assert r.headers["x-radixlm-worker"] == a
    assert after["estimated_cached_chars"] - before["estimated_cached_chars"] >= len(GROUP_A)
    assert r.json()["meta_info"]["cached_tokens"] < 10, "the worker really had nothing"
    assert after["tree_chars"][a] > 0 and after["clears"] == 0 and after["phantom_drops"] == 0


def test_with_feedback_the_poll_clears_the_flushed_worker(cache_aware_router_for, fleet):
    router = cache_aware_router_for("--cache-feedback", "--cache-feedback-interval", "0.2", *PATIENT)
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


def test_with_feedback_a_response_reveals_the_phantom_before_the_poll(cache_aware_router_for, fleet):
    # The first poll (at start) takes a baseline; the next one is far off, so only the response can tell.
    router = cache_aware_router_for("--cache-feedback", "--cache-feedback-interval", "60", *PATIENT)
    a = flush_behind_the_routers_back(router, fleet)
    before, after, r = next_of_group_a(router)
    assert r.headers["x-radixlm-worker"] == a and after["clears"] == 0
    assert after["phantom_drops"] == before["phantom_drops"] + 1
    # The phantom sibling (Question 0/1) is gone; the text just served is really cached there now.
    assert after["tree_chars"][a] < before["tree_chars"][a]
    fb = feedback(router)
    assert fb["reported_prompt_tokens"] > 0 and 0 <= fb["reported_cache_hit_rate"] < fb["estimated_cache_hit_rate"]


# ---- failover (with a --cache-feedback watcher)
def test_kill_worker_mid_run_then_restart(fleet):
    """Also test_with_feedback_a_restarted_worker_is_cleared's check, on the same restart (a worker restart is the
    module's costliest step): a cache_aware router with --cache-feedback, which has not routed the traffic of the
    run, watches the victim go and come back."""
    watcher = start_router(fleet.urls, "--policy", "cache_aware", "--cache-feedback", "--cache-feedback-interval", "0.2",
                           *PATIENT)
    router = start_router(fleet.urls, "--policy", "round_robin")  # default health checks and circuit breaker
    try:
        # The victim is the worker group A's prefix lands on, flushed behind the watcher's back.
        a = flush_behind_the_routers_back(watcher, fleet)
        i = fleet.urls.index(a)
        survivor, victim = fleet.workers[1 - i], fleet.workers[i]
        results, killed_at = run_and_kill(router, victim)
        failed = [o for o in results if o.status != 200]
        assert failed == [], failed
        assert {o.worker for o in results if o.started > killed_at} == {survivor.base_url}
        metrics = router.client.get("/metrics").text
        resent = [line for line in metrics.splitlines() if line.startswith("radixlm_router:resends_total{")]
        assert all("maybe_read" in line or "not_sent" in line for line in resent), resent

        # Passive health check: the router saw the victim fail, so it is listed down without waiting.
        assert worker_state(router, victim.base_url)["healthy"] is False
        health = router.client.get("/health").json()
        assert health["healthy_workers"] == 1 and health["total_workers"] == 2
        r = router.client.post("/generate", json={"text": "still up?", "sampling_params": {"max_new_tokens": 1}})
        assert r.status_code == 200 and r.headers[WORKER_HEADER] == survivor.base_url

        port = int(victim.base_url.rsplit(":", 1)[1])
        fleet.workers[i] = wait_healthy(start_worker_proc(port), victim.base_url, timeout=WORKER_STARTUP_S)
        healthy_at = time.monotonic()
        # A down worker is checked every second even with the default 60 s interval; one that refused
        # connections is back after one passed check, which also closes its circuit.
        assert wait_for(lambda: worker_state(router, victim.base_url)["circuit"] == "closed"
                        and worker_state(router, victim.base_url)["healthy"], 30)
        took = time.monotonic() - healthy_at
        assert took < PICKUP_S, f"the restarted worker was listed healthy {took:.1f} s after passing /health"
        served = {router.client.post("/generate", json={"text": f"back {i}", "sampling_params": {
            "max_new_tokens": 1}}).headers[WORKER_HEADER] for i in range(4)}
        assert served == set(fleet.urls)
        metrics = router.client.get("/metrics").text
        assert f'radixlm_router:worker_ejections_total{{worker="{victim.base_url}"}}' in metrics

        # The watcher's health checks are left at their 60 s default: only the new instance_id can reveal the restart.
        assert wait_for(lambda: feedback(watcher)["clears"] >= 1), feedback(watcher)
        fb = feedback(watcher)
        assert fb["tree_chars"][a] == 0 and fb["tree_chars"][survivor.base_url] > 0
        assert fb["poll_errors"] >= 1, "the poll saw the worker gone while it restarted"
    finally:
        stop_router(router)
        stop_router(watcher)


# ---- routing
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
