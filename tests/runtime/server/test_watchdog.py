"""The watchdog against a real server: it counts the scheduler's passes, not the replies sent, so a non-streaming
request (nothing goes back until it ends) several times longer than --watchdog-timeout completes, and so does a
program with fork, join and gen_string beside a CPU-heavy process; a scheduler process that stops stepping still
trips it. The stopped-scheduler test runs last: it ends the server."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

import radixlm as sgl
from radixlm.lang.ir import REGEX_STR
from tests.runtime.server.conftest import child_pids, pid_alive, start_server, stop_server

WATCHDOG_S = 3.0


@pytest.fixture(scope="module")
def srv():
    h = start_server("--watchdog-timeout", str(WATCHDOG_S))
    yield h
    stop_server(h)


@pytest.fixture
def cpu_hog():
    """A second CPU-heavy process beside the server (bounded: it exits by itself after 10 minutes)."""
    hog = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 600\nwhile time.time() < end: pass"])
    yield hog
    hog.kill()
    hog.wait()


def rss_pages(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1])


# The long request's length in seconds (a margin over the 3 x WATCHDOG_S the test requires), and its token bounds.
LONG_REQUEST_S = 5 * WATCHDOG_S
PROBE_TOKENS = 32
MAX_LONG_TOKENS = 2000  # within --max-total-tokens 4096 with the prompt


def _generate(srv, tokens: int):
    return srv.client.post("/generate", json={"text": "Write a long essay about cats.", "sampling_params": {
        "max_new_tokens": tokens, "ignore_eos": True, "temperature": 0}}, timeout=600)


def test_long_non_streaming_request_outlives_the_watchdog_timeout(srv):
    # Sized from this machine's decode speed: a fixed 600 tokens took 30 s on an idle 2-core CPU, 46 s on a busy one.
    t0 = time.monotonic()
    assert _generate(srv, PROBE_TOKENS).status_code == 200
    per_token = (time.monotonic() - t0) / PROBE_TOKENS  # with the prefill: an overestimate, hence the margin above
    tokens = min(MAX_LONG_TOKENS, max(PROBE_TOKENS, round(LONG_REQUEST_S / per_token)))
    for _ in range(3):  # a probe slowed by a burst of load gives too few tokens: twice as many again
        t0 = time.monotonic()
        r = _generate(srv, tokens)
        elapsed = time.monotonic() - t0
        assert r.status_code == 200, r.text
        assert r.json()["meta_info"]["completion_tokens"] == tokens
        if elapsed > 3 * WATCHDOG_S or tokens == MAX_LONG_TOKENS:
            break
        tokens = min(MAX_LONG_TOKENS, 2 * tokens)
    assert elapsed > 3 * WATCHDOG_S, f"the request took {elapsed:.1f} s: too short to show anything"
    assert srv.client.get("/health").status_code == 200


def test_fork_branches_and_join_under_cpu_contention(srv, cpu_hog):
    # SGLang's parallel-decoding program shape: a shared prefix, forked branches decoded side by side, a join.
    @sgl.function
    def parallel_decoding(s, topic):
        s += "Write an expository essay on the topic of " + topic + ".\nOutline:\n"
        forks = s.fork(3)
        for i, f in enumerate(forks):
            f += f"Point {i + 1}:" + sgl.gen("detail", max_tokens=48, stop="\n\n", ignore_eos=True)
        s += "".join(f"\nPoint {i + 1}:" + f["detail"] for i, f in enumerate(forks))
        s += "\nIn summary," + sgl.gen("summary", max_tokens=32, ignore_eos=True)
        s += '\nAs JSON: {"title": ' + sgl.gen_string("title", max_tokens=16) + "}"

    state = parallel_decoding.run(topic="the history of tea", temperature=0,
                                  backend=sgl.RuntimeEndpoint(srv.base_url))
    assert state.error() is None, state.error()
    assert state["summary"] and "Point 3:" in state.text() and "In summary," in state.text()
    # SGLang's string contract, closed unless the token limit cut it.
    closed = state.get_meta_info("title")["finish_reason"]["type"] != "length"
    assert re.fullmatch(REGEX_STR if closed else r'"[\w\d\s]*"?', state["title"], re.ASCII), state["title"]
    assert srv.client.get("/health").status_code == 200


def test_a_stopped_scheduler_still_trips_the_watchdog(srv):
    # The scheduler is the child holding the model: the largest resident set.
    kids = [k for k in child_pids(srv.proc.pid) if pid_alive(k)]
    scheduler = max(kids, key=rss_pages)
    os.kill(scheduler, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        r = srv.client.post("/generate", json={"text": "Hello", "sampling_params": {"max_new_tokens": 8}},
                            timeout=120)
        assert r.status_code == 500 and "watchdog" in r.text, r.text
        assert WATCHDOG_S <= time.monotonic() - t0 < 60
        assert srv.proc.wait(60) != 0  # the server exits for a supervisor to restart it
    finally:
        if pid_alive(scheduler):
            os.kill(scheduler, signal.SIGCONT)
