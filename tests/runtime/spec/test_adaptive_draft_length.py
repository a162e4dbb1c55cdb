"""Per-request adaptive draft length (spec/adaptive.py): the next draft is one token longer than the moving
average of tokens kept, within [1, max_len]; DraftPath applies it to sources with adaptive_length, per request, on
top of the batch rule."""
from __future__ import annotations

from radixlm.runtime.spec.draft import Draft, DraftSource, DraftTraits
from radixlm.runtime.spec.path import DraftPath
from radixlm.runtime.spec.adaptive import DraftLength

from tests.runtime.scheduler.conftest import request
from tests.runtime.scheduler.fake_runner import FIRST_TOKEN, VOCAB, make_fake_scheduler, make_prompts, reference
from tests.runtime.scheduler.fake_serving import assert_reference, serve


def _run(length: DraftLength, verdict, steps: int) -> list[int]:
    """The lengths proposed over `steps` verdicts, verdict(drafted) giving the tokens kept."""
    seen = []
    for _ in range(steps):
        n = length.next_len()
        seen.append(n)
        length.update(n, verdict(n))
    return seen


def test_starts_at_the_longest_and_stays_there_while_every_token_is_kept():
    assert _run(DraftLength(6), lambda n: n, 10) == [6] * 10


def test_misses_shrink_to_one_token_and_never_to_zero():
    seen = _run(DraftLength(8), lambda n: 0, 8)
    assert seen[0] == 8 and seen == sorted(seen, reverse=True)
    assert seen[4:] == [1] * 4


def test_hits_after_misses_grow_it_back_a_token_at_a_time():
    length = DraftLength(5)
    _run(length, lambda n: 0, 6)
    seen = _run(length, lambda n: n, 12)
    assert seen[0] == 1 and seen[-1] == 5
    assert all(0 <= b - a <= 1 for a, b in zip(seen, seen[1:])), seen


def test_partial_acceptance_settles_one_past_what_is_kept():
    assert _run(DraftLength(8), lambda n: min(n, 2), 12)[-4:] == [3] * 4
    assert _run(DraftLength(3), lambda n: min(n, 5), 5) == [3] * 5  # never past max_len


class _Adaptive(DraftSource):
    """Proposes 8 tokens: the fake model's own for rids starting with 'hit', wrong ones otherwise."""

    traits = DraftTraits(adaptive_length=True, max_len=6)

    def __init__(self):
        self.verified: dict[str, list[int]] = {}

    def applies_to(self, req) -> bool:
        return True

    def propose(self, req) -> None:
        truth = reference(req.origin_input_ids + req.output_ids, 8)
        tokens = truth if req.rid.startswith("hit") else [FIRST_TOKEN + (t - FIRST_TOKEN + 1) % (VOCAB - FIRST_TOKEN)
                                                          for t in truth]
        req.kv.draft = Draft(tokens, self)

    def learn(self, req, draft, accepted, token) -> None:
        pass


def test_draft_path_shortens_each_request_by_its_own_history():
    sched = make_fake_scheduler()
    source = _Adaptive()
    sched.drafts = DraftPath([source], None, sched.page_size, sched.grammar_stats)
    take = sched.drafts.take_verdict

    def recording(req, verdict, logprobs):
        source.verified.setdefault(req.rid, []).append(len(req.kv.draft.tokens))
        return take(req, verdict, logprobs)

    sched.drafts.take_verdict = recording
    p, q = make_prompts(61, 2, lo=10, hi=20)
    reqs = [request("hit", p, max_new_tokens=40), request("miss", q, max_new_tokens=40)]
    assert_reference(serve(sched, reqs), reqs)
    hit, miss = source.verified["hit"], source.verified["miss"]
    # Cut from 8 to max_len; the last draft also to the tokens left.
    assert hit[:-1] == [6] * (len(hit) - 1)
    assert miss[0] == 6 and miss[-10:] == [1] * 10
    sched.check_memory()
