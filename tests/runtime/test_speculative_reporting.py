"""Draft statistics reach the client and the operator: meta_info has the request's verification passes, draft tokens
and kept tokens (only when it had drafts), /metrics the totals and their ratio."""
from __future__ import annotations

from radixlm.runtime.front import ReqState
from radixlm.runtime.messages import ReqOutput
from radixlm.runtime.metrics import ServerMetrics


class Tok:
    def decode(self, ids, **kw) -> str:
        return "x" * len(ids)


def _out(**kw) -> ReqOutput:
    return ReqOutput("r", [5, 6], {"type": "length", "length": 2}, prompt_tokens=3, completion_tokens=2,
                     cached_tokens=0, **kw)


def test_meta_info_reports_drafts_only_when_there_were_some():
    meta = ReqState("r", Tok(), False, False).update(_out(), "xx")["meta_info"]
    assert "spec_verify_ct" not in meta
    meta = ReqState("r", Tok(), False, False).update(
        _out(spec_verify_ct=1, spec_draft_tokens=4, spec_accepted_tokens=1), "xx")["meta_info"]
    assert (meta["spec_verify_ct"], meta["spec_draft_tokens"], meta["spec_accepted_tokens"]) == (1, 4, 1)


def test_metrics_report_draft_totals_and_accept_rate():
    m = ServerMetrics()
    m.set_state({"max_total_num_tokens": 100, "num_running_reqs": 0, "num_waiting_reqs": 0, "available_tokens": 100,
                 "evictable_tokens": 0, "stats": {"draft_tokens": 40, "accepted_draft_tokens": 30,
                                                                 "draft_verifications": 12,
                                                                 "spec_controller_off_steps": 7}})
    text = m.render().decode()
    assert "radixlm:spec_draft_tokens 40.0" in text and "radixlm:spec_accepted_tokens 30.0" in text
    assert "radixlm:spec_accept_rate 0.75" in text
    assert "radixlm:spec_verifications 12.0" in text and "radixlm:spec_accept_length 3.5" in text  # (30 + 12) / 12
    assert "radixlm:spec_controller_off_steps 7.0" in text
