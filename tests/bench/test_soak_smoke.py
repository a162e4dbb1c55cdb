"""benchmarks/serving/soak.py without servers: the request plans, the classification of answers, the summaries and the
process-group cleanup."""
from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.lib import targets  # noqa: E402
from benchmarks.lib.soak_traffic import (GENERATION, MALFORMED, MAX_TOKENS, SPECS, Expect, Kind, Mode,  # noqa: E402
                                         Outcome, Record, classify, percentiles, pick, plan, report, sse_error,
                                         summarize)
from benchmarks.serving import soak  # noqa: E402


def test_every_kind_has_a_spec_and_a_bounded_plan():
    rng = random.Random(0)
    assert list(SPECS) == list(Kind)
    for kind in Kind:
        for _ in range(20):
            p = plan(kind, rng)
            assert p.kind is kind and p.path.startswith("/")
            if kind is Kind.BAD_JSON:
                with pytest.raises(ValueError):
                    json.loads(p.content())
                continue
            body = json.loads(p.content()) if p.content() else {}
            sp = body.get("sampling_params", {})
            limit = sp.get("max_new_tokens", body.get("max_tokens", 0))
            if kind in GENERATION:
                assert 1 <= limit <= MAX_TOKENS and 1 <= sp.get("n", body.get("n", 1)) <= 4
            assert (p.mode is Mode.OPERATOR_ABORT) == (p.rid is not None and body.get("rid") == p.rid)
    assert all(SPECS[k].expect is not Expect.SUCCESS for k in MALFORMED)
    assert {pick(rng) for _ in range(3000)} == set(Kind)


def test_malformed_values_are_the_ones_named():
    rng = random.Random(1)
    body = lambda k: json.loads(plan(k, rng).content())  # noqa: E731
    assert body(Kind.TOP_LOGPROBS_HUGE)["top_logprobs_num"] == 10**6 and body(Kind.TOP_LOGPROBS_HUGE)["return_logprob"]
    assert body(Kind.N_HUGE)["n"] == 40000
    assert body(Kind.ECHO_LOGPROBS_HUGE)["logprobs"] == 10**6 and body(Kind.ECHO_LOGPROBS_HUGE)["echo"]
    assert body(Kind.NEGATIVE_MAX_TOKENS)["max_tokens"] < 0
    assert body(Kind.NEGATIVE_TEMPERATURE)["temperature"] == -1
    assert body(Kind.EMPTY_MESSAGES)["messages"] == []
    assert len(body(Kind.STOP_LIST_HUGE)["sampling_params"]["stop"]) == 1000
    assert all(any(not 0 <= i < 49152 for i in body(Kind.INPUT_IDS_OUT_OF_VOCAB)["input_ids"]) for _ in range(10))


@pytest.mark.parametrize("expect,status,kw,outcome", [
    (Expect.SUCCESS, 200, {}, Outcome.OK),
    (Expect.SUCCESS, 400, {}, Outcome.UNEXPECTED_STATUS),
    (Expect.REJECT, 400, {}, Outcome.REJECTED),
    (Expect.REJECT, 422, {}, Outcome.REJECTED),
    (Expect.REJECT, 200, {}, Outcome.UNEXPECTED_STATUS),
    (Expect.EITHER, 200, {}, Outcome.OK),
    (Expect.EITHER, 400, {}, Outcome.REJECTED),
    (Expect.REJECT, 503, {"retry_after": True}, Outcome.BUSY),
    (Expect.SUCCESS, 503, {}, Outcome.UNEXPECTED_5XX),
    (Expect.SUCCESS, 500, {}, Outcome.UNEXPECTED_5XX),
    (Expect.REJECT, 502, {}, Outcome.UNEXPECTED_5XX),
    (Expect.SUCCESS, 504, {"retry_after": True}, Outcome.UNEXPECTED_5XX),
    (Expect.SUCCESS, 200, {"stream_error": "{...}"}, Outcome.STREAM_ERROR),
    (Expect.SUCCESS, None, {"connection_error": True}, Outcome.CONNECTION_ERROR),
    (Expect.SUCCESS, None, {"connection_error": True, "server_down": True}, Outcome.SERVER_DOWN),
    (Expect.SUCCESS, 503, {"retry_after": True, "server_down": True}, Outcome.SERVER_DOWN),
    (Expect.SUCCESS, 200, {"stream_error": "{...}", "server_down": True}, Outcome.SERVER_DOWN),
    (Expect.SUCCESS, 500, {"server_down": True}, Outcome.UNEXPECTED_5XX),
])
def test_classify(expect, status, kw, outcome):
    assert classify(expect, status, **kw) is outcome


def test_sse_error():
    ok = 'data: {"text": "a", "meta_info": {}}\n\ndata: [DONE]\n\n'
    assert sse_error(ok) is None
    assert "boom" in sse_error(ok.replace("[DONE]", '{"error": {"message": "boom", "code": 503}}'))
    anthropic = ('event: message_start\ndata: {"type": "message_start"}\n\n'
                 'event: error\ndata: {"type": "error", "error": {}}\n\n')
    assert sse_error(anthropic) == '{"type": "error", "error": {}}'


def test_percentiles_and_summary():
    assert percentiles([]) == {}
    p = percentiles([float(i) for i in range(1, 101)])
    assert (p["p50"], p["p99"], p["max"], p["mean"]) == (51.0, 99.0, 100.0, 50.5)
    recs = [Record(Kind.GENERATE, 200, Outcome.OK, 0.1), Record(Kind.GENERATE, 503, Outcome.BUSY, 0.3),
            Record(Kind.BAD_JSON, 400, Outcome.REJECTED, 0.01),
            Record(Kind.CLIENT_CANCEL_EARLY, None, Outcome.CANCELLED, 0.2)]
    s = summarize(recs)
    assert s["generate"].total == 2 and s["generate"].statuses == {"200": 1, "503": 1}
    assert s["generate"].outcomes == {"ok": 1, "busy": 1} and s["generate"].latency_ms["max"] == 300.0
    assert s["client_cancel_early"].statuses == {"none": 1}


def test_args_and_loopback():
    a = soak.parse_args(["--quick", "--target", "both"])
    assert (a.duration, a.concurrency, a.target) == (20.0, 8, "both")
    assert soak.parse_args([]).duration == 600.0 and targets.HOST == "127.0.0.1"
    with pytest.raises(SystemExit):
        soak.parse_args(["--concurrency", "0"])


def test_process_group_is_killed_with_its_children(tmp_path):
    t = targets.start_target("sleeper", ["sh", "-c", "sleep 60 & sleep 60"], 1, tmp_path, False)
    time.sleep(0.3)
    assert t.dead_reason() is None and t.rss_mib() > 0
    targets.stop_targets([t])
    assert t.dead_reason() is not None
    deadline = time.monotonic() + 5  # SIGKILL lands asynchronously; the killed wait as zombies for init
    while left := [pid for pid in (int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit())
                   if (st := targets._stat(pid)) and st[2] == str(t.popen.pid) and st[0] != "Z"]:
        assert time.monotonic() < deadline, left
        time.sleep(0.05)


def test_report_lists_kinds_and_verdicts():
    stats = summarize([Record(Kind.GENERATE, 200, Outcome.OK, 0.1),
                       Record(Kind.N_HUGE, 500, Outcome.UNEXPECTED_5XX, 0.2)])
    result = {"requests": 2, "elapsed_s": 1.0, "outcomes": {"ok": 1, "unexpected_5xx": 1},
              "unexpected": [{"outcome": "unexpected_5xx", "status": 500, "kind": "n_40000", "request": "POST /v1/...",
                              "response": "Internal Server Error"}],
              "kv_idle_check": [{"target": "server", "idle_ok": True, "available_tokens": 8192}],
              "rss_mib": {"server": {"start_mib": 100.0, "end_mib": 110.0, "growth_mib": 10.0}},
              "pass": False, "failures": ["1 unexpected responses"]}
    text = report(result, stats)
    assert "n_40000" in text and "500:1" in text and "unexpected_5xx 500 [n_40000]" in text
    assert "growth +10.0" in text and text.rstrip().endswith("FAIL: 1 unexpected responses")
