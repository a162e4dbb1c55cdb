"""The draft controller (spec/controller.py, --speculative-measure-window): with a fake clock and scripted step
costs it drafts where drafting was measured to pay and not elsewhere, per batch-size bucket, exploring the other
regime at a bounded rate; through the real Scheduler a controller that chose off proposes no drafts, and greedy
outputs stay those without speculation while it switches drafting on and off."""
from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest

from radixlm.runtime.args import ServerArgs
from radixlm.runtime.spec.controller import MAX_PERIOD_FACTOR, DraftController, _Bucket, bucket
from radixlm.runtime.scheduler.scheduler import Scheduler
from radixlm.runtime.spec.factory import DraftFactory

from tests.runtime.scheduler.conftest import request
from tests.runtime.scheduler.fake_runner import FakeRunner, make_fake_scheduler, make_prompts, record_plans
from tests.runtime.scheduler.fake_serving import assert_all_free, assert_reference, serve
from .test_standalone_drafts import _serve_waves, assert_draft_kv_matches_the_tree, models  # noqa: F401 - fixture
from .test_standalone_drafts import make as make_standalone


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


# A step's (seconds, output tokens per request) in each regime: drafting keeps ~0.8 tokens per request a step
# (1.8 tokens a step) and costs 1.5x the step (draft model passes, verification rows, the pass not planned ahead).
SLOW_ON = {True: (0.0090, 1.8), False: (0.0060, 1.0)}  # on: 200 tokens/s a request, off: 167 -> on
COSTLY_ON = {True: (0.0120, 1.8), False: (0.0060, 1.0)}  # on: 150, off: 167 -> off


def drive(ctl: DraftController, clock: Clock, costs: dict, steps: int, n: int = 1, drafts: int = 4) -> list[bool]:
    """Runs `steps` steps of a batch of n (each request drafting `drafts` tokens a step while on); returns each
    step's decision."""
    decisions = []
    for _ in range(steps):
        on = ctl.decide(n)
        seconds, per_req = costs[on]
        clock.t += seconds
        ctl.observe(per_req * n, n, drafts * n if on else 0)
        decisions.append(on)
    return decisions


def make(**kw) -> tuple[DraftController, Clock]:
    clock = Clock()
    return DraftController(clock=clock, stats=Counter(), **kw), clock


def test_buckets_are_powers_of_two():
    assert [bucket(n) for n in (0, 1, 2, 3, 4, 7, 8, 15, 16)] == [1, 1, 2, 2, 3, 3, 4, 4, 5]


def test_turns_drafting_off_where_it_costs_more_and_explores_at_a_bounded_rate():
    ctl, clock = make(window=8, period=64, settle=2)
    first = drive(ctl, clock, COSTLY_ON, 20)
    assert first[:8] == [True] * 8 and first[8:18] == [False] * 10  # measures on, then off (settle 2 + window 8)
    rest = drive(ctl, clock, COSTLY_ON, 4000)
    explorations = ctl.stats["spec_controller_explorations"]
    # Periods 64, 128, ..., 8 x 64 steps between explorations of 10 steps each.
    assert 4000 // (MAX_PERIOD_FACTOR * 64 + 10) <= explorations <= 4 + 4000 // (MAX_PERIOD_FACTOR * 64)
    assert sum(rest) == explorations * 10
    assert ctl.state()[1]["choice"] is False and ctl.stats["spec_controller_off_steps"] == 4000 + 20 - sum(first + rest)
    # What it cost: within 3% of drafting never (the best fixed regime) for the same tokens.
    tokens = sum(COSTLY_ON[d][1] for d in first + rest)
    spent = clock.t
    assert spent <= 1.03 * tokens * COSTLY_ON[False][0] / COSTLY_ON[False][1]


def test_keeps_drafting_where_it_pays():
    ctl, clock = make(window=8, period=64)
    decisions = drive(ctl, clock, SLOW_ON, 3000)
    assert ctl.state()[1]["choice"] is True
    off = decisions.count(False)
    assert off <= 10 + 10 * (1 + 3000 // (MAX_PERIOD_FACTOR * 64) + 4)
    tokens = sum(SLOW_ON[d][1] for d in decisions)
    assert clock.t <= 1.03 * tokens * SLOW_ON[True][0] / SLOW_ON[True][1]


def test_follows_a_change_back_and_forth():
    """Drafting stops paying (the on regime's own windows show it at once), then pays again (an exploration finds
    it within a period of the off regime)."""
    ctl, clock = make(window=8, period=64)
    drive(ctl, clock, SLOW_ON, 200)
    assert ctl.decide(1) is True
    clock.t += SLOW_ON[True][0]
    ctl.observe(1.8, 1, 4)
    decisions = drive(ctl, clock, COSTLY_ON, 100)
    # Off within a few windows (the average lags by a window or two), until on is explored again (period 64).
    assert not any(decisions[40:90])
    back = drive(ctl, clock, SLOW_ON, 200)
    assert back[-40:] == [True] * 40 and ctl.stats["spec_controller_flips"] >= 2


def test_drafting_stays_on_unless_off_is_faster_by_the_margin():
    """Speculation was asked for: a regime within the margin of the other (noise) keeps drafting."""
    even = {True: (0.0101, 1.0), False: (0.0100, 1.0)}  # on 1% slower
    ctl, clock = make(window=8, period=64, margin=0.02)
    drive(ctl, clock, even, 300)
    assert ctl.state()[1]["choice"] is True
    worse = {True: (0.0103, 1.0), False: (0.0100, 1.0)}  # on 3% slower
    ctl, clock = make(window=8, period=64, margin=0.02)
    drive(ctl, clock, worse, 300)
    assert ctl.state()[1]["choice"] is False


def test_nothing_drafted_measures_nothing():
    """A window of drafting on starts at a step that verified drafts: with nothing to draft, off is never explored
    (drafting on then costs nothing but lookups)."""
    ctl, clock = make(window=8, period=64)
    assert drive(ctl, clock, COSTLY_ON, 200, drafts=0) == [True] * 200
    assert ctl.state()[1]["rate_on"] is None and ctl.stats["spec_controller_off_steps"] == 0


def test_each_batch_bucket_decides_for_itself():
    """At batch 1 drafting pays, at batch 8 it costs more (the batch's verification rows are no longer free)."""
    big = {True: (0.0120, 1.8), False: (0.0065, 1.0)}
    ctl, clock = make(window=8, period=64)
    for _ in range(30):
        drive(ctl, clock, SLOW_ON, 20, n=1)
        drive(ctl, clock, big, 20, n=8)
    state = ctl.state()
    assert state[bucket(1)]["choice"] is True and state[bucket(8)]["choice"] is False
    assert drive(ctl, clock, SLOW_ON, 5, n=1) == [True] * 5
    assert drive(ctl, clock, big, 5, n=9) == [False] * 5  # 9 shares 8's bucket


def test_steps_after_a_switch_and_unclean_steps_are_not_measured():
    """The first `settle` steps after the regime changes ran passes drafted under the other regime, and a step with
    a prefill (requests 0) or one the controller had no say in (skip) measure nothing."""
    ctl, clock = make(window=4, period=64, settle=2)
    for i in range(5):  # on (the first regime: nothing to settle), a prefill step (requests 0) among them
        assert ctl.decide(1) is True
        clock.t += 100.0 if i == 2 else 0.01
        ctl.observe(2, 1 if i != 2 else 0, 3)
    assert ctl.state()[1]["rate_on"] == pytest.approx(200.0)
    ctl.skip()
    clock.t += 100.0
    ctl.observe(1, 1, 3)
    assert ctl.state()[1]["rate_on"] == pytest.approx(200.0)
    for i in range(6):  # off: the first 2 steps (slow leftovers of on) are not measured
        assert ctl.decide(1) is False
        clock.t += 1.0 if i < 2 else 0.01
        ctl.observe(1, 1)
    assert ctl.state()[1]["rate_off"] == pytest.approx(100.0)


# ---------------------------------------------------------------------------------------------- through the Scheduler
def _decided(sched, on: bool) -> None:
    """The controller has measured: `on` is the faster regime for every bucket, and the next exploration is far."""
    ctl = sched.drafts.controller
    ctl.period = 1 << 30
    for b in range(1, 8):
        st = ctl.buckets.setdefault(b, _Bucket())
        st.rate = {True: 2.0 if on else 1.0, False: 1.0 if on else 2.0}
        st.choice, st.period, st.exploring = on, 1 << 30, None


def _repeating(seed: int, n: int) -> list[list[int]]:
    return [p + p + p for p in make_prompts(seed, n, lo=6, hi=12)]


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
def test_controller_off_proposes_no_drafts(overlap):
    sched = make_fake_scheduler(speculative_algorithm="NGRAM", speculative_measure_window=8,
                                overlap_schedule="on" if overlap else "auto", speculative_ngram_min_match_window_size=1)
    assert sched.drafts.controller is not None
    _decided(sched, on=False)
    batches = record_plans(sched)
    reqs = [request(f"r{i}", p, max_new_tokens=20) for i, p in enumerate(_repeating(3, 3))]
    res = serve(sched, reqs)
    assert_reference(res, reqs)
    assert_all_free(sched)
    stats = sched.grammar_stats
    assert stats["ngram_drafts"] == 0 and stats["draft_tokens"] == 0 and not any(b.verifiers for b in batches)
    assert stats["spec_controller_off_steps"] > 0 and stats["spec_controller_on_steps"] == 0
    # The same with the controller's choice on: the lookups draft (the prompts repeat themselves).
    sched = make_fake_scheduler(speculative_algorithm="NGRAM", speculative_measure_window=8,
                                overlap_schedule="on" if overlap else "auto", speculative_ngram_min_match_window_size=1)
    _decided(sched, on=True)
    res = serve(sched, reqs)
    assert_reference(res, reqs)
    assert sched.grammar_stats["ngram_drafts"] > 0 and sched.grammar_stats["spec_controller_off_steps"] == 0


def test_default_server_args_measure_and_grammar_jump_forward_has_no_controller():
    assert make_fake_scheduler(speculative_algorithm="NGRAM",
                               speculative_measure_window=8).drafts.controller is not None
    assert make_fake_scheduler(speculative_measure_window=8).drafts.controller is None  # jump-forward only


@pytest.mark.parametrize("algorithm", ["NGRAM", "RADIX", "NGRAM_RADIX"])
@pytest.mark.parametrize("kwargs", [{}, {"overlap_schedule": "on"}, {"page_size": 4},
                                    {"overlap_schedule": "on", "speculative_max_batch_rows": 8}],
                         ids=["sync", "overlap", "page4", "overlap-batch-rule"])
def test_greedy_outputs_unchanged_while_the_controller_switches(algorithm, kwargs):
    """A controller measuring in 1-step windows with no settling and exploring every step flips drafting on and off
    all the time (the real clock decides which): drafts are cut or not made mid-request, outputs stay the same."""
    sched = make_fake_scheduler(speculative_algorithm=algorithm, speculative_measure_window=1,
                                speculative_ngram_min_match_window_size=1, **kwargs)
    ctl = sched.drafts.controller
    ctl.period, ctl.settle = 1, 0
    reqs = [request(f"r{i}", p, max_new_tokens=24) for i, p in enumerate(_repeating(5, 6))]
    res = serve(sched, reqs)
    assert_reference(res, reqs)
    again = [request(f"a{i}", p, max_new_tokens=30) for i, p in enumerate(_repeating(5, 6))]
    res = serve(sched, again)
    assert_reference(res, again)
    assert_all_free(sched)
    stats = sched.grammar_stats
    if "speculative_max_batch_rows" in kwargs:  # 6 requests: the batch rule stops drafting, the controller has no say
        assert stats["spec_controller_on_steps"] == stats["spec_controller_off_steps"] == stats["draft_tokens"] == 0
    else:
        assert stats["spec_controller_on_steps"] > 0 and stats["spec_controller_off_steps"] > 0
        assert stats["draft_tokens"] > 0


@pytest.mark.parametrize("kwargs, every", [({}, 0), ({"overlap_schedule": "on"}, 1), ({"page_size": 4}, 0)],
                         ids=["sync", "overlap", "page4"])
def test_draft_model_outputs_and_kv_unchanged_while_the_controller_switches(models, kwargs, every):  # noqa: F811
    """STANDALONE: while drafting is off the draft model skips the target's passes (lazy KV) and catches up when it
    is on again; outputs are those without speculation and the tree's slots hold the draft model's own KV."""
    expected = _serve_waves(make_standalone(models, None, **kwargs), every)
    sched = make_standalone(models, "other", speculative_measure_window=1, **kwargs)
    ctl = sched.drafts.controller
    ctl.period, ctl.settle = 1, 0
    assert _serve_waves(sched, every) == expected
    checked, total = assert_draft_kv_matches_the_tree(sched)  # slots skipped while off have none: not checked
    assert 0 < checked <= total
    stats = sched.grammar_stats
    assert stats["spec_controller_on_steps"] > 0 and stats["spec_controller_off_steps"] > 0
    assert stats["model_drafts"] > 0 and stats["draft_model_skipped_passes"] > 0


def test_tensor_parallel_ranks_go_without_it():
    """Its decisions follow one rank's clock; tensor-parallel ranks must decide alike."""
    runner = FakeRunner(1024, 1, 32, 0, 512)
    runner.parallel = SimpleNamespace(tp_size=2, tp_rank=0, broadcast_object=lambda x: x, all_true=lambda x: x)
    args = ServerArgs(model_path="fake-model", device="cpu", random_seed=0, max_total_tokens=1024,
                      speculative_algorithm="NGRAM", speculative_measure_window=8)
    assert Scheduler(args, runner, tokenizer=None, eos_token_ids=frozenset(),
                     drafts=DraftFactory.load(args, runner)).drafts.controller is None
