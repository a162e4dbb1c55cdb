"""Prompt lookup (--speculative-algorithm NGRAM): the draft is what followed the latest earlier occurrence of the
longest matching run of latest tokens; outputs are those without speculation, in every scheduling mode."""
from __future__ import annotations

from collections import Counter

import pytest

from radixlm.runtime.sampling.sampling_params import SamplingParams
from radixlm.runtime.spec.sources.ngram import NGramSource
from radixlm.runtime.scheduler.req import Req

from tests.runtime.scheduler.conftest import make_scheduler, request, run_all
from tests.runtime.scheduler.fake_runner import make_fake_scheduler, make_prompts
from tests.runtime.scheduler.fake_serving import assert_all_free, assert_reference, requests, serve


def _req(prompt: list[int], output: list[int] = (), max_new_tokens: int = 16) -> Req:
    sp = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
    sp.normalize()
    req = Req("r", list(prompt), sp)
    req.output_ids = list(output)
    return req


def _drafted(source: NGramSource, req: Req) -> list[int] | None:
    req.kv.draft = None
    source.propose(req)
    return None if req.kv.draft is None else req.kv.draft.tokens


@pytest.mark.parametrize("prompt, output, k, lo, hi, expected", [
    ([1, 2, 3, 4, 5, 1, 2], [], 4, 1, 4, [3, 4, 5, 1]),  # (1, 2) last ended at 2
    ([1, 2, 3, 4, 5, 1, 2], [], 2, 1, 4, [3, 4]),  # k tokens at most
    ([7, 9, 8, 7, 9, 5, 9], [], 3, 1, 4, [5, 9]),  # no run of 2 matches; (9,) ended at 2 and 5: the latest wins
    ([1, 2, 3, 9, 2, 3, 4, 8], [2, 3], 2, 1, 4, [4, 8]),  # the output's tokens count; the latest of two (2, 3) wins
    ([1, 2, 3, 4], [], 4, 1, 4, None),  # nothing repeats
    ([5, 1, 2, 6, 2], [], 3, 2, 4, None),  # only runs of >= 2 are looked up: (6, 2) never occurred before
    ([3, 3, 3], [], 4, 1, 4, [3]),  # a run may overlap the one looked up; the draft stops at the known tokens
])
def test_lookup(prompt, output, k, lo, hi, expected):
    source = NGramSource(k, lo, hi, Counter())
    assert _drafted(source, _req(prompt, output)) == expected


def test_lookup_follows_the_growing_output_and_tokens_left():
    source = NGramSource(4, 1, 3, Counter())
    req = _req([10, 11, 12, 13, 14, 10, 11], max_new_tokens=3)
    assert _drafted(source, req) == [12, 13, 14]  # cut to the 3 tokens max_new_tokens leaves
    req.output_ids += [12, 13]
    assert _drafted(source, req) == [14]
    req.output_ids.append(20)
    assert _drafted(source, req) is None  # nothing left to take
    other = _req([10, 11, 12, 13, 14, 10, 11], [12, 13, 14, 10, 11])
    assert _drafted(source, other) == [12, 13, 14, 10]


def test_drafts_back_off_while_rejected_outright():
    from radixlm.runtime.spec.sources.ngram import MAX_BACKOFF

    source = NGramSource(2, 1, 2, Counter())
    req = _req([1, 2, 3, 1, 2, 3, 1, 2], max_new_tokens=1000)

    def reject():
        draft = req.kv.draft
        source.learn(req, draft, 0, 99)

    waits = []
    for _ in range(6):
        assert _drafted(source, req) == [3, 1]
        reject()
        skipped = 0
        while _drafted(source, req) is None:
            skipped += 1
        waits.append(skipped)
    assert waits == [1, 2, 4, 8, 16, 16] and MAX_BACKOFF == 16
    source.learn(req, req.kv.draft, 1, 99)  # a token kept: the next rejection waits one step again
    reject()
    assert _drafted(source, req) is None and _drafted(source, req) == [3, 1]


def test_a_full_run_drafts_while_shorter_runs_back_off():
    """Drafts from a run of max_window tokens and from shorter ones back off apart: single-token matches rejected
    outright (free text) wait, while the output starting to repeat a passage (a full run) drafts at once."""
    source = NGramSource(2, 1, 2, Counter())
    req = _req([1, 5, 6, 2, 7, 8, 1], max_new_tokens=100)
    assert _drafted(source, req) == [5, 6] and req.kv.draft.key is False  # (8, 1) never occurred: (1,) did
    source.learn(req, req.kv.draft, 0, 99)
    assert _drafted(source, req) is None and _drafted(source, req) == [5, 6]
    source.learn(req, req.kv.draft, 0, 99)  # the shorter runs now wait 2 steps
    req.output_ids += [5, 6]
    assert _drafted(source, req) == [2, 7] and req.kv.draft.key is True  # (5, 6) ended at 3


def test_a_single_token_match_does_not_draft_by_default():
    """--speculative-ngram-min-match-window-size defaults to 2: the latest token alone found earlier (a chat
    template's newline, a common word) drafts nothing."""
    from radixlm.runtime.args import ServerArgs

    args = ServerArgs(speculative_algorithm="NGRAM")
    source = NGramSource(args.max_draft_tokens, args.speculative_ngram_min_match_window_size,
                         args.speculative_ngram_max_match_window_size, Counter())
    assert _drafted(source, _req([1, 5, 6, 2, 7, 8, 1])) is None
    assert _drafted(source, _req([1, 5, 6, 2, 7, 8, 1, 5])) == [6, 2, 7, 8]


@pytest.mark.parametrize("kwargs, every", [
    ({}, 0), ({"page_size": 4}, 0), ({"chunked_prefill_size": 16}, 2), ({"overlap_schedule": "on"}, 1),
    ({"graph_rows": 64}, 2), ({"max_total_tokens": 240, "schedule_conservativeness": 0.05}, 0),
])
def test_outputs_unchanged_with_ngram_drafts(kwargs, every):
    sched = make_fake_scheduler(speculative_algorithm="NGRAM", speculative_num_draft_tokens=4, **kwargs)
    # Prompts that repeat themselves: the source proposes from the first copy (the fake model rarely agrees).
    reqs = requests([p + p[: len(p) // 2] for p in make_prompts(31, 6, lo=8, hi=30)],
                    max_new=24 if "max_total_tokens" in kwargs else 10)
    res = serve(sched, reqs, every)  # the KV accounting is checked after every step
    assert_reference(res, reqs)
    assert_all_free(sched)
    assert sched.grammar_stats["ngram_drafts"] > 0 and sched.grammar_stats["draft_tokens"] > 0


def test_a_real_model_that_repeats_itself_accepts_drafts(tiny_model_dir):
    """A random-weight model soon loops; prompt lookup then drafts what it will say, and the outputs stay those of
    plain decoding."""
    prompts = [[(7 * i + 3 * j) % 500 + 3 for j in range(20)] for i in range(4)]
    outs = {}
    for algo in (None, "NGRAM"):
        sched = make_scheduler(tiny_model_dir, speculative_algorithm=algo)
        for i, p in enumerate(prompts):
            sched.add_request(request(f"r{i}", p, max_new_tokens=48))
        outs[algo] = {rid: r["output_ids"] for rid, r in run_all(sched).items()}
        stats = sched.grammar_stats
    assert outs["NGRAM"] == outs[None]
    assert stats["accepted_draft_tokens"] > 0


def test_each_request_reports_its_drafts():
    """ReqOutput carries each request's verification passes, draft tokens and kept tokens; they add up to the
    scheduler's totals (and reach meta_info and /metrics: tests/runtime/test_speculative_reporting.py)."""
    sched = make_fake_scheduler(speculative_algorithm="NGRAM", speculative_num_draft_tokens=4)
    reqs = requests([p + p for p in make_prompts(32, 4, lo=6, hi=20)])
    last = {}
    for req in reqs:
        sched.add_request(req)
    while not sched.is_idle():
        for out in sched.step():
            last[out.rid] = out
    stats = sched.grammar_stats
    assert sum(o.spec_draft_tokens for o in last.values()) == stats["draft_tokens"] > 0
    assert sum(o.spec_accepted_tokens for o in last.values()) == stats["accepted_draft_tokens"]
    assert all(o.spec_verify_ct <= o.completion_tokens for o in last.values())
    assert any(o.spec_verify_ct for o in last.values())


def draft_lengths(source) -> list[int]:
    """Lengths of the drafts `source` proposes from now on (no pass in flight here: no guessed token among them)."""
    lengths, propose = [], source.propose

    def recording(req: Req) -> None:
        propose(req)
        if req.kv.draft is not None and req.kv.draft.source is source:
            lengths.append(len(req.kv.draft.tokens))

    source.propose = recording
    return lengths


@pytest.mark.parametrize("n", [2, 4, 7])
def test_num_draft_tokens_counts_the_verified_token(n):
    """--speculative-num-draft-tokens N as SGLang counts it: a request's verify pass holds N tokens, its newest
    (the root) among them, so a step drafts at most N - 1 tokens (radixlm's old count drafted N)."""
    sched = make_fake_scheduler(speculative_algorithm="NGRAM", speculative_num_draft_tokens=n)
    source = next(s for s in sched.drafts.sources if isinstance(s, NGramSource))
    assert _drafted(source, _req([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2])) == [3, 4, 5, 6, 7, 8, 9, 10][: n - 1]
    lengths = draft_lengths(source)
    reqs = requests([p + p + p for p in make_prompts(33, 4, lo=10, hi=16)], max_new=12)
    res = serve(sched, reqs)
    assert_reference(res, reqs)
    assert lengths and max(lengths) == n - 1
    assert_all_free(sched)
