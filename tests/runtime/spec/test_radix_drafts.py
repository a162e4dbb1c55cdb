"""The radix cache as a draft source (--speculative-algorithm RADIX, NGRAM_RADIX) through the real Scheduler, and the
batch rule that shrinks drafts as the batch grows (--speculative-max-batch-rows): outputs are those without
speculation in every scheduling mode, the KV accounting holds after every step, accepted tokens end up cached."""
from __future__ import annotations

from collections import Counter

import pytest

from radixlm.runtime.cache.radix_node import RadixKey
from radixlm.runtime.spec.draft import Draft, DraftSource, DraftTraits
from radixlm.runtime.spec.path import DraftPath
from radixlm.runtime.spec.sources.radix import RadixSource

from tests.runtime.scheduler.conftest import make_scheduler, request, run_all
from tests.runtime.scheduler.fake_runner import make_fake_scheduler, make_prompts, record_plans, reference
from tests.runtime.scheduler.fake_serving import OracleDrafts, assert_all_free, assert_reference, requests, serve

MODES = [
    pytest.param({}, 0, id="default"),
    pytest.param({"page_size": 4}, 0, id="page4"),
    pytest.param({"chunked_prefill_size": 16}, 2, id="chunked16"),
    pytest.param({"page_size": 4, "chunked_prefill_size": 8}, 2, id="page4-chunked8"),
    pytest.param({"overlap_schedule": "on"}, 1, id="overlap"),
    pytest.param({"graph_rows": 64}, 2, id="mixed"),
    pytest.param({"max_total_tokens": 240, "schedule_conservativeness": 0.05}, 0, id="retraction"),
]


def _asked_again(seed: int, n: int, max_new: int):
    """A first round of questions, then the same questions again (with room for more tokens than were answered,
    and one in two with a new tail: the tree then holds no continuation of the whole sequence)."""
    first = make_prompts(seed, n, lo=10, hi=30)
    again = [p if i % 2 == 0 else p + [7, 8, 9] for i, p in enumerate(first)]
    return (requests(first, max_new=max_new),
            [request(f"again{i}", p, max_new_tokens=max_new + 6) for i, p in enumerate(again)])


@pytest.mark.parametrize("algorithm", ["RADIX", "NGRAM_RADIX"])
@pytest.mark.parametrize("kwargs, every", MODES)
def test_outputs_unchanged_and_repeated_answers_drafted(kwargs, every, algorithm):
    sched = make_fake_scheduler(speculative_algorithm=algorithm, speculative_num_draft_tokens=5, **kwargs)
    small = "max_total_tokens" in kwargs
    first, again = _asked_again(41, 8 if small else 6, 24 if small else 10)
    res = serve(sched, first, every)  # the KV accounting is checked after every step
    assert_reference(res, first)
    before = Counter(sched.grammar_stats)
    res = serve(sched, again, every)
    assert_reference(res, again)
    assert_all_free(sched)
    stats = sched.grammar_stats
    drafted = stats["draft_tokens"] - before["draft_tokens"]
    kept = stats["accepted_draft_tokens"] - before["accepted_draft_tokens"]
    assert stats["radix_path_drafts"] > before["radix_path_drafts"]
    # Repeated questions: the earlier answers are drafted and kept (the fake model is deterministic); past them
    # (6 tokens more than were answered) and after a new tail, drafts may be rejected.
    assert kept >= 3 * 6 and kept <= drafted
    if small:
        assert sched.stats["retractions"] > 0
    if kwargs.get("graph_rows"):
        assert sched.stats["mixed_batches"] > 0
    # Accepted draft tokens were verified and cached like any other: every answer is in the tree (with a small
    # pool, later requests evicted earlier ones).
    for r in again if not small else ():
        seq = r.input_ids + res[r.rid]["output_ids"]
        aligned = (len(seq) - 1) // sched.page_size * sched.page_size
        assert sched.tree_cache.match_prefix(RadixKey(seq[:-1])).length == aligned, r.rid


def test_rejected_draft_kv_left_allocated_breaks_the_accounting(monkeypatch):
    """Mutation: verification that does not free the KV of rejected draft tokens; the integrity check after the
    step catches it (so the passing tests above show that RADIX drafts' rejected KV is freed)."""
    sched = make_fake_scheduler(speculative_algorithm="RADIX")
    p = make_prompts(43, 1, lo=12, hi=13)[0]
    serve(sched, [request("a", p + [5, 5, 5, 5], max_new_tokens=1)])  # the tree says 5, 5, 5 follow p
    take = sched.drafts.take_verdict

    def keeping_rejected(req, verdict, logprobs):
        take(req, verdict, logprobs)
        return None

    monkeypatch.setattr(sched.drafts, "take_verdict", keeping_rejected)
    with pytest.raises(AssertionError):
        serve(sched, [request("b", p, max_new_tokens=12)])  # the model rejects them: their KV stays allocated


def test_drafts_from_another_request_in_the_same_context():
    """Fork branches: a request whose sequence runs into text another request cached (the other one's prompt extends
    its own) drafts the rest of that text; the kgram lookup finds the other's prompt text from a new context."""
    sched = make_fake_scheduler(speculative_algorithm="RADIX", speculative_num_draft_tokens=6)
    base = make_prompts(44, 1, lo=12, hi=13)[0]
    longer = base + reference(base, 20)  # someone already continued `base` (as the model would)
    serve(sched, [request("long", longer, max_new_tokens=1)])
    res = serve(sched, [request("fork", base, max_new_tokens=15)])
    assert res["fork"]["output_ids"] == reference(base, 15)
    assert sched.grammar_stats["accepted_draft_tokens"] == 15 - 15 // 6  # every draft kept: 5 drafted, 1 sampled
    assert sched.grammar_stats["radix_kgram_drafts"] == 0
    other = [3, 4, 5] + longer[10:14]  # a new context ending with k tokens the tree holds
    serve(sched, [request("quote", other, max_new_tokens=4)])
    assert sched.grammar_stats["radix_kgram_drafts"] > 0
    assert_all_free(sched)


def test_lookups_leave_lru_state_and_locks_alone():
    sched = make_fake_scheduler(speculative_algorithm="RADIX", speculative_num_draft_tokens=5)
    p = make_prompts(45, 1, lo=12, hi=13)[0]
    serve(sched, [request("a", p, max_new_tokens=10)])
    tree = sched.tree_cache
    source = next(s for s in sched.drafts.sources if isinstance(s, RadixSource))
    sched.add_request(request("b", p, max_new_tokens=10))
    sched.step()  # admitted (its prompt's path locked), prefilled with a draft, verified
    req = sched.running[0]
    req.kv.draft = None

    def state():
        return ([(n.id, n.last_access_time, n.hit_count, n.lock_ref) for n in tree._nodes()], tree._clock,
                list(tree.evict_queue.heap), tree.evictable_size(), tree.protected_size())

    before = state()
    source.propose(req)
    assert req.kv.draft is not None and req.kv.draft.tokens == reference(p, 10)[len(req.output_ids):][:4]
    assert state() == before
    req.kv.draft = None


# ---------------------------------------------------------------------- the batch rule
def _with_batch_rule(sched, rows: int, **kw) -> OracleDrafts:
    oracle = OracleDrafts(**kw)
    sched.drafts = DraftPath([oracle], None, sched.page_size, sched.grammar_stats, rows, lambda: len(sched.running))
    return oracle


@pytest.mark.parametrize("n, cap", [(2, 4), (6, 1), (10, 0)])
def test_decode_passes_stay_within_the_row_budget(n, cap):
    """B = 16 rows: 2 requests draft 4 (k), 6 draft 1 each ((16 - 6) // 6), 10 none -- until enough finish."""
    sched = make_fake_scheduler()
    oracle = _with_batch_rule(sched, 16, k=4, mistakes=False)
    assert min(sched.drafts.draft_cap(n), 4) == cap
    batches = record_plans(sched)
    reqs = requests(make_prompts(46, n, lo=8, hi=20), max_new=12)
    res = serve(sched, reqs)
    assert_reference(res, reqs)
    assert_all_free(sched)
    decode = [b for b in batches if not b.new_reqs]
    for b in decode:
        m = len(b.reqs)
        assert b.num_rows <= max(16, m)
        assert b.num_rows - m <= m * min(4, (16 - m) // m if m <= 16 else 0)
    first = decode[0]
    assert first.num_rows == n * (1 + min(cap, 4))
    if cap == 0:  # no draft while more than 8 run; drafts again once enough have finished
        assert any(b.verifiers for b in decode) and oracle.proposals > 0
        assert all(not b.verifiers for b in decode if len(b.reqs) > 8)


def test_drafts_made_for_a_smaller_batch_are_cut_when_it_grows():
    """A draft proposed while few requests ran is cut at planning time when the pass holds more (fit_batch)."""
    sched = make_fake_scheduler()
    _with_batch_rule(sched, 12, k=4, mistakes=False)
    batches = record_plans(sched)
    ps = make_prompts(47, 6, lo=8, hi=20)
    reqs = requests(ps[:1], max_new=16)
    for r in reqs:
        sched.add_request(r)
    sched.step()
    sched.step()
    more = [request(f"m{i}", p, max_new_tokens=16) for i, p in enumerate(ps[1:])]
    res = serve(sched, more)
    res.update(run_all(sched))
    for b in batches:
        if not b.new_reqs:
            assert b.num_rows <= max(12, len(b.reqs))
    assert sched.grammar_stats["draft_tokens_cut"] > 0
    assert_all_free(sched)


def test_exact_sources_are_not_cut():
    class Exact(DraftSource):
        traits = DraftTraits(batch_adaptive=False)

        def applies_to(self, req):
            return True

        def propose(self, req):
            req.kv.draft = Draft([5, 6, 7], self)

    path = DraftPath([Exact()], None, 1, Counter(), max_batch_rows=4, batch_size=lambda: 100)
    from .test_ngram import _req

    req = _req([1, 2, 3])
    path.attach(req)
    path.propose(req)
    assert req.kv.draft.tokens == [5, 6, 7]
    path.fit_batch([req] * 100)
    assert req.kv.draft.tokens == [5, 6, 7]
    assert path.draft_cap(100) == 0 and not path.drafting(100) and path.drafting(2)
    assert DraftPath([], None, 1, Counter()).draft_cap(10_000) is None  # 0: no rule


@pytest.mark.parametrize("algorithm", ["NGRAM", "RADIX"])
def test_large_batches_overlap_and_small_ones_draft(algorithm):
    """With drafts off for the batch (more than B/2 requests), requests of a guessing source are planned ahead by the
    overlap scheduler as if no speculation were configured; once few remain they draft again."""
    sched = make_fake_scheduler(speculative_algorithm=algorithm, speculative_max_batch_rows=4,
                                overlap_schedule="on", speculative_ngram_min_match_window_size=1)
    ps = [p + p for p in make_prompts(48, 6, lo=6, hi=12)]
    serve(sched, [request(f"r{i}", p, max_new_tokens=30 if i == 0 else 6) for i, p in enumerate(ps)])
    batches = record_plans(sched)
    # The same again: x0 runs alone at the end, with its earlier answer in the tree.
    reqs = [request(f"x{i}", p, max_new_tokens=24 if i == 0 else 6) for i, p in enumerate(ps)]
    res = serve(sched, reqs)
    assert_reference(res, reqs)
    assert_all_free(sched)
    assert sched.stats["overlapped_batches"] > 0
    assert any(b.verifiers for b in batches if len(b.reqs) == 1)
    assert all(not b.verifiers for b in batches if len(b.reqs) > 2 and not b.new_reqs)


# ---------------------------------------------------------------------- a real model
def test_a_real_model_asked_again_keeps_its_earlier_answer_as_drafts(tiny_model_dir):
    """A random-weight Llama answers a prompt; asked the same again (another request), RADIX drafts the cached answer
    and the model keeps it: fewer passes, the same tokens as without speculation; the request's statistics say so."""
    prompt = [(11 * j) % 500 + 3 for j in range(24)]
    runs = {}
    for algo in (None, "RADIX"):
        sched = make_scheduler(tiny_model_dir, speculative_algorithm=algo)
        sched.add_request(request("first", prompt, max_new_tokens=20))
        first = run_all(sched)["first"]["output_ids"]
        passes = sched.stats["decode_batches"] + sched.stats["prefill_batches"]
        sched.add_request(request("again", prompt, max_new_tokens=24))
        ids, last = [], None
        while not sched.is_idle():
            for o in sched.step():
                ids += o.new_output_ids
                last = o
        passes = sched.stats["decode_batches"] + sched.stats["prefill_batches"] - passes
        runs[algo] = (first, ids, passes, last)
    assert runs["RADIX"][:2] == runs[None][:2]
    first, ids, passes, last = runs["RADIX"]
    assert ids[:20] == first and len(ids) == 24
    assert last.spec_verify_ct > 0 and last.spec_accepted_tokens >= 16  # the 20 cached tokens, less the sampled
    assert passes <= runs[None][2] - 12  # 24 tokens in far fewer passes


@pytest.mark.parametrize("n", [3, 6])
def test_num_draft_tokens_counts_the_verified_token(n):
    """SGLang's --speculative-num-draft-tokens N: the cache's continuation is drafted N - 1 tokens at a time (the
    verify pass's N-th token is the request's newest, the root)."""
    from .test_ngram import draft_lengths

    sched = make_fake_scheduler(speculative_algorithm="RADIX", speculative_num_draft_tokens=n)
    base = make_prompts(44, 1, lo=12, hi=13)[0]
    serve(sched, [request("long", base + reference(base, 20), max_new_tokens=1)])
    lengths = draft_lengths(next(s for s in sched.drafts.sources if isinstance(s, RadixSource)))
    res = serve(sched, [request("fork", base, max_new_tokens=15)])
    assert res["fork"]["output_ids"] == reference(base, 15)
    assert lengths and max(lengths) == n - 1
    assert sched.grammar_stats["accepted_draft_tokens"] == sum(lengths)  # every draft kept
    assert_all_free(sched)


@pytest.mark.parametrize("algorithm", ["NGRAM", "RADIX"])
def test_large_batches_do_no_per_request_draft_work(algorithm, monkeypatch):
    """While the batch rule stops every source of the running requests (more than B/2 run), taking a pass's tokens
    makes no per-request draft call: speculation configured costs large batches no host time per token."""
    calls = []
    propose = DraftPath.propose

    def counted(self, req, batch=None, defer=True):
        if batch is None and len(sched.running) > 2:
            calls.append(req.rid)
        propose(self, req, batch, defer)

    monkeypatch.setattr(DraftPath, "propose", counted)
    sched = make_fake_scheduler(speculative_algorithm=algorithm, speculative_max_batch_rows=4,
                                overlap_schedule="on")
    reqs = [request(f"r{i}", p, max_new_tokens=8) for i, p in enumerate(make_prompts(49, 6, lo=6, hi=12))]
    res = serve(sched, reqs)
    assert_reference(res, reqs)
    assert sched.stats["decode_batches"] > 0 and calls == []
