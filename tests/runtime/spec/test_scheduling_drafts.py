"""Drafts and logprobs through the real Scheduler over FakeRunner: whatever a draft source proposes (here an oracle
that knows the fake model and makes deliberate mistakes), outputs are the reference continuations, rejected tokens'
KV goes back, the source learns each rejection, and logprobs are the fake model's."""
from __future__ import annotations

import pytest
import torch

from radixlm.runtime.scheduler import cursor as cursor_module

from tests.runtime.scheduler.conftest import request
from tests.runtime.scheduler.fake_runner import fake_logits, make_fake_scheduler, make_prompts, record_plans, reference, seq_hash
from tests.runtime.scheduler.fake_serving import MAX_NEW, assert_all_free, assert_reference, requests, serve, with_oracle


# ---------------------------------------------------------------------- logprobs
def _expected_lp(tokens: list[int], target: int) -> float:
    return float(torch.log_softmax(fake_logits([seq_hash(tokens)]), dim=-1)[0, target])


DRAFT_MODES = [
    pytest.param({}, 0, id="default"),
    pytest.param({"page_size": 4}, 0, id="page4"),
    pytest.param({"chunked_prefill_size": 16}, 0, id="chunked16"),
    pytest.param({"page_size": 4, "chunked_prefill_size": 8}, 2, id="page4-chunked8"),
    pytest.param({"disable_radix_cache": True, "page_size": 4}, 0, id="no-radix-page4"),
    pytest.param({"overlap_schedule": "on"}, 1, id="overlap"),
    pytest.param({"graph_rows": 64}, 2, id="mixed"),
    pytest.param({"mixed_chunk": "on", "chunked_prefill_size": 16, "overlap_schedule": "on"}, 2,
                 id="mixed-chunk16-overlap"),
    pytest.param({"max_total_tokens": 240, "schedule_conservativeness": 0.05}, 0, id="retraction"),
    pytest.param({"max_total_tokens": 240, "schedule_conservativeness": 0.05, "page_size": 4}, 0,
                 id="retraction-page4"),
]


@pytest.mark.parametrize("past_max_new", [False, True], ids=["within-max-new", "past-max-new"])
@pytest.mark.parametrize("kwargs, every", DRAFT_MODES)
def test_drafts_keep_outputs_and_kv_accounting(kwargs, every, past_max_new):
    sched = make_fake_scheduler(**kwargs)
    oracle = with_oracle(sched, past_max_new=past_max_new)
    batches = record_plans(sched)
    small_pool = "max_total_tokens" in kwargs
    reqs = requests(make_prompts(10, 8, lo=10, hi=40), max_new=24 if small_pool else MAX_NEW)
    res = serve(sched, reqs, every)  # the integrity check runs after every step
    assert_reference(res, reqs)
    assert_all_free(sched)
    stats = sched.grammar_stats
    assert 0 < stats["accepted_draft_tokens"] < stats["draft_tokens"]
    assert sched.stats["jump_decode_batches"] > 0
    assert any(wb.logits.verify_rows for wb in sched.runner.passes)
    # A prompt's draft is verified by its prefill (its last chunk, when chunked).
    assert any(b.new_reqs and b.verifiers and set(b.verifiers) & set(b.new_reqs) for b in batches)
    for b in batches:
        rows = b.worker.logits.verify_rows
        assert len(rows) == len(set(rows)) and all(0 <= r < b.num_rows for r in rows)
    assert oracle.learned and not oracle.bad_lessons
    assert len(oracle.learned) < oracle.proposals
    if past_max_new:
        assert oracle.drafts_past_max_new > 0
    if small_pool:
        assert sched.stats["retractions"] > 0
    if kwargs.get("graph_rows") or kwargs.get("mixed_chunk") == "on":
        assert sched.stats["mixed_batches"] > 0
    if kwargs.get("mixed_chunk") == "on":  # drafted decode rows rode along with a prompt's chunk
        assert any(b.chunk is not None and set(b.verifiers) - set(b.new_reqs) for b in batches)


def test_drafts_for_some_requests_only_with_overlap():
    """Requests without drafts beside requests with them: overlap waits while a drafted request runs."""
    sched = make_fake_scheduler(overlap_schedule="on", graph_rows=64)
    oracle = with_oracle(sched, only=lambda rid: rid in ("r0", "r3"))
    reqs = requests(make_prompts(11, 6, lo=10, hi=40), max_new=16)
    res = serve(sched, reqs, every=2)
    assert_reference(res, reqs)
    assert_all_free(sched)
    assert {rid for rid, _, _ in oracle.learned} <= {"r0", "r3"} and oracle.learned
    assert sched.stats["overlapped_batches"] > 0
    # No pass plans a drafted request while one of its passes is in flight (cursor.can_plan_ahead).
    for wb in sched.runner.passes:
        if wb.logits.verify_rows:
            assert not wb.has_in_flight


def test_a_cursor_keeping_rejected_draft_kv_is_caught(monkeypatch):
    """Mutation: KVCursor.taken without its roll-back over rejected draft tokens. The position after the kept tokens
    then keeps the KV written for a rejected draft token, and the next token read through it changes."""

    def taken_without_rollback(self, known, appended):
        self.committed = min(self.committed, known + self.in_flight)

    sched = make_fake_scheduler()
    oracle = with_oracle(sched)
    reqs = requests(make_prompts(12, 4), max_new=12)
    monkeypatch.setattr(cursor_module.KVCursor, "taken", taken_without_rollback)
    res = serve(sched, reqs)
    with pytest.raises(AssertionError):
        assert_reference(res, reqs)
    assert oracle.bad_lessons  # the model rejected drafts that were right


@pytest.mark.parametrize("start, warm", [(0, False), (10, True)], ids=["from-0", "from-10-cached"])
@pytest.mark.parametrize("kwargs", [{}, {"chunked_prefill_size": 8}, {"page_size": 4, "chunked_prefill_size": 8},
                                    {"overlap_schedule": "on"}])
@pytest.mark.parametrize("drafts", [False, True], ids=["no-drafts", "drafts"])
def test_logprobs_are_the_fake_models(kwargs, drafts, start, warm):
    """Prompt logprobs (from logprob_start_len; the cached prefix stops short of it) and output logprobs with their
    top candidates are those of the fake model's logits, whichever rows computed them (chunks, verify rows)."""
    sched = make_fake_scheduler(**kwargs)
    if drafts:
        with_oracle(sched)
    p = make_prompts(13, 1, lo=30, hi=31)[0]
    if warm:
        serve(sched, [request("warm", p)])
    got_in, got_out, got_top, cached = [], [], [], []
    sched.add_request(request("lp", p, max_new_tokens=7, return_logprob=True, logprob_start_len=start,
                              top_logprobs_num=2))
    for _ in range(200):
        if sched.is_idle():
            break
        for o in sched.step():
            got_in += o.input_token_logprobs
            got_out += o.output_token_logprobs
            got_top += o.output_top_logprobs
            cached.append(o.cached_tokens)
    ps_ = kwargs.get("page_size", 1)
    assert cached[-1] == ((start - 1) // ps_ * ps_ if warm else 0)
    out = reference(p, 7)
    first = max(start, 1)
    assert [t for _, t in got_in] == p[start:]
    assert (got_in[0][0] is None) == (start == 0)
    assert [lp for lp, _ in got_in[first - start:]] == pytest.approx(
        [_expected_lp(p[:i], p[i]) for i in range(first, len(p))], abs=1e-5)
    assert [t for _, t in got_out] == out
    assert [lp for lp, _ in got_out] == pytest.approx([_expected_lp(p + out[:j], out[j]) for j in range(7)], abs=1e-5)
    assert [[t for _, t in top] for top in got_top] == [[out[j], _second(p + out[:j])] for j in range(7)]
    if drafts:
        assert sched.grammar_stats["accepted_draft_tokens"] > 0
    assert_all_free(sched)


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("at", [1, 4, 7])
def test_a_stop_token_inside_a_kept_draft_ends_the_request_there(page_size, at):
    p = make_prompts(24, 1)[0]
    ref = reference(p, 12)
    stop = ref[at]
    assert stop not in ref[:at]
    sched = make_fake_scheduler(page_size=page_size)
    oracle = with_oracle(sched, k=5, past_max_new=True, mistakes=False)
    r = request("s", p, max_new_tokens=12)
    r.sampling_params.stop_token_ids = {stop}
    res = serve(sched, [r])
    assert res["s"]["output_ids"] == ref[: at + 1]
    assert res["s"]["finish_reason"] == {"type": "stop", "matched": stop}
    # Drafts of 5 right tokens: the prefill's verdict holds ref[:6], the next one ref[6:12].
    # (the stats count a verdict's kept draft tokens, also those past the stop token)
    assert oracle.proposals == 1 + (at > 5) and sched.grammar_stats["accepted_draft_tokens"] == 5 * oracle.proposals
    assert not oracle.learned
    assert_all_free(sched)


def _second(tokens: list[int]) -> int:
    return int(fake_logits([seq_hash(tokens)]).topk(2, dim=-1).indices[0, 1])
