"""The overlap scheduler while drafting (spec/path.py has the design): NGRAM, RADIX and STANDALONE
drafts made while a pass of the request is in flight continue a guess of its token, and the passes verifying them
launch ahead. Greedy outputs equal those without speculation and without overlap, the KV accounting holds after
every step (enable_integrity_check), and a wrong guess keeps none of its draft."""
from __future__ import annotations

import pytest

from radixlm.runtime.spec.path import DraftPath
from radixlm.runtime.scheduler.scheduler import Scheduler

from tests.runtime.scheduler.conftest import make_scheduler, request
from tests.runtime.scheduler.fake_serving import serve
from .test_standalone_drafts import assert_draft_kv_matches_the_tree, make, models  # noqa: F401 - a fixture

OVERLAP = {"overlap_schedule": "on"}


def _prompts() -> list[list[int]]:
    """Prompts a random-weight model soon loops on (its drafts then mostly hold)."""
    return [[(7 * i + 3 * j) % 500 + 3 for j in range(20)] for i in range(4)]


def _record_passes(sched: Scheduler) -> list[tuple[bool, bool]]:
    """(verifies a draft, reads a token in flight) per forward pass of the target."""
    passes, forward = [], sched.runner.forward

    def recorded(wb):
        passes.append((bool(wb.logits.verify_rows), wb.has_in_flight))
        return forward(wb)

    sched.runner.forward = recorded
    return passes


def _serve(sched: Scheduler, waves: int = 1) -> dict:
    """The prompts (one every step, so prompts meet running decodes), `waves` times, each wave taking 20 more
    tokens: a later wave finds the earlier answers in the tree, then goes on past them."""
    out = {}
    for w in range(waves):
        reqs = [request(f"w{w}r{i}", p, max_new_tokens=20 * (w + 1)) for i, p in enumerate(_prompts())]
        res = serve(sched, reqs, every=1)
        out.update({rid: r["output_ids"] for rid, r in res.items()})
    sched.check_memory()
    assert sched.is_idle() and sched.tree_cache.protected_size() == 0
    return out


def _assert_drafted_ahead(sched: Scheduler, passes: list[tuple[bool, bool]]) -> None:
    stats = sched.grammar_stats
    assert stats["guessed_drafts"] > 0 and stats["guessed_drafts_accepted_tokens"] > 0, dict(stats)
    assert sched.stats["overlapped_batches"] > 0
    assert any(verifies and in_flight for verifies, in_flight in passes)


@pytest.mark.parametrize("algo, waves", [("NGRAM", 1), ("RADIX", 2), ("NGRAM_RADIX", 2)])
def test_lookup_drafts_launch_ahead(tiny_model_dir, algo, waves):
    expected = _serve(make_scheduler(tiny_model_dir), waves)
    assert _serve(make_scheduler(tiny_model_dir, speculative_algorithm=algo), waves) == expected
    sched = make_scheduler(tiny_model_dir, speculative_algorithm=algo, **OVERLAP)
    passes = _record_passes(sched)
    assert _serve(sched, waves) == expected
    _assert_drafted_ahead(sched, passes)


def test_a_wrong_guess_keeps_nothing(tiny_model_dir, monkeypatch):
    """Mutation: every guess of a token in flight is made wrong (its continuation kept as the source made it). The
    drafts launched ahead on it keep no token -- even where the continuation is what the model says after the real
    token -- and outputs are unchanged."""
    split = DraftPath._split_guess

    def wrong(self, req):
        split(self, req)
        draft = req.kv.draft
        if draft is not None and draft.guess is not None:
            pos, token = draft.guess
            draft.guess = (pos, token + 1)

    expected = _serve(make_scheduler(tiny_model_dir))
    monkeypatch.setattr(DraftPath, "_split_guess", wrong)
    sched = make_scheduler(tiny_model_dir, speculative_algorithm="NGRAM", **OVERLAP)
    assert _serve(sched) == expected
    stats = sched.grammar_stats
    assert stats["guessed_drafts"] + stats["draft_guesses_wrong"] > 0
    assert stats["guessed_drafts_accepted_tokens"] == 0 and stats["draft_guesses_right"] == 0


@pytest.mark.parametrize("kwargs", [pytest.param({}, id="default"), pytest.param({"page_size": 4}, id="page4")])
def test_draft_model_drafts_launch_ahead(models, kwargs):  # noqa: F811 - the fixture
    """STANDALONE: one long request among short ones, under a batch rule that stops drafts while more than two
    run: the passes launch ahead, and once the long one runs alone it drafts with its pass in flight -- a chain
    from its newest known token, whose KV that pass writes. With its own checkpoint as the draft model its guesses
    hold; the draft pool keeps its invariant."""
    kwargs = {**OVERLAP, "speculative_max_batch_rows": 5, **kwargs}

    def run(sched: Scheduler) -> dict:
        reqs = [request(f"r{i}", p, max_new_tokens=60 if i == 0 else 8) for i, p in enumerate(_prompts())]
        res = {rid: r["output_ids"] for rid, r in serve(sched, reqs, 1).items()}
        sched.check_memory()
        return res

    expected = run(make(models, None, **kwargs))
    sched = make(models, "same", **kwargs)
    passes = _record_passes(sched)
    assert run(sched) == expected
    _assert_drafted_ahead(sched, passes)
    assert_draft_kv_matches_the_tree(sched)
    other = make(models, "other", **kwargs)
    assert run(other) == expected
    assert other.grammar_stats["guessed_drafts"] > 0
