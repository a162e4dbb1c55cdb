"""STANDALONE under the batch rule (--speculative-max-batch-rows 8: drafts while at most 4 requests run): while the
batch is larger the draft model runs no pass at all, and a request catches its draft KV up before the draft model
runs its rows again or it drafts (spec/sources/model.py). A workload crosses the threshold both ways -- two long requests alone, ten short ones joining
them, the two alone again, then requests hitting the short ones' cached prompts and answers (written while the draft
model was skipped) -- in each scheduling mode. Greedy outputs equal those without speculation; the draft model ran
no pass in a step that could not draft; every request's draft KV equals a recomputation when it drafts, and so does
every slot the radix tree says has draft KV."""
from __future__ import annotations

import pytest

from radixlm.runtime.cache.radix_node import RadixKey, draft_kv_prefix
from radixlm.runtime.executor.cuda_graph_runner import CudaGraphRunner
from radixlm.runtime.spec.runners.draft_model import DraftModelRunner, KVSpan
from radixlm.runtime.scheduler.scheduler import Scheduler

from tests.runtime.scheduler.conftest import request
from tests.runtime.scheduler.fake_runner import make_prompts
from .test_standalone_drafts import _assert_slots, _draft_runner, assert_draft_kv_matches_the_tree, make
from .test_standalone_drafts import models  # noqa: F401 - a fixture

RULE = {"speculative_max_batch_rows": 8}
DRAFTING_MAX = 4  # requests a pass may have and still draft under RULE

MODES = [
    pytest.param({}, id="default"),
    pytest.param({"page_size": 4}, id="page4"),
    pytest.param({"chunked_prefill_size": 16}, id="chunked16"),
    pytest.param({"overlap_schedule": "on"}, id="overlap"),
    pytest.param({"max_total_tokens": 200, "schedule_conservativeness": 0.05}, id="retraction"),
]


class Recorder:
    """Counts the draft model's forward passes per scheduler step, and checks each drafting request's draft KV
    against a recomputation when it drafts."""

    def __init__(self, sched: Scheduler):
        self.sched = sched
        self.runner = runner = _draft_runner(sched)
        self.calls = 0
        self.off_steps = 0  # steps whose batch was too large to draft before and after them
        self.drafted_rows = 0
        runner.model.register_forward_pre_hook(lambda *_: setattr(self, "calls", self.calls + 1))
        propose = runner.propose

        def checked(rows, last_tokens, positions, *args, **kw):
            reqs = {r.req_pool_idx: r for r in sched.running}
            for row, pos in zip(rows, positions):
                req = reqs[row]
                tokens = (req.origin_input_ids + req.output_ids)[:pos]
                slots = sched.req_to_token_pool.req_to_token[row, :pos].clone()
                _assert_slots(runner, tokens, slots, list(range(pos)), sched.page_size)
                self.drafted_rows += 1
            return propose(rows, last_tokens, positions, *args, **kw)

        runner.propose = checked

    def _live(self) -> int:
        return sum(not r.finished() for r in self.sched.running)

    def step(self) -> list:
        before, calls = self._live(), self.calls
        out = self.sched.step()
        if before > DRAFTING_MAX and self._live() > DRAFTING_MAX:
            self.off_steps += 1
            assert self.calls == calls, "the draft model ran while no request could draft"
        return out


def _collect(results: dict, outs) -> None:
    for out in outs:
        r = results.setdefault(out.rid, {"output_ids": [], "finish_reason": None})
        r["output_ids"] += out.new_output_ids
        r["finish_reason"] = out.finished_reason


def _run(sched: Scheduler, step, abort: bool = False) -> dict:
    """The workload; `abort`: one short request is aborted while the draft model is skipped."""
    results: dict = {}

    def until_idle():
        for _ in range(2000):
            if sched.is_idle():
                return
            _collect(results, step())
        raise AssertionError("not idle")

    shorts = make_prompts(62, 10, lo=10, hi=24)
    for i, p in enumerate(make_prompts(61, 2, lo=10, hi=20)):
        sched.add_request(request(f"L{i}", p, max_new_tokens=40))
    for _ in range(4):
        _collect(results, step())
    for i, p in enumerate(shorts):
        sched.add_request(request(f"S{i}", p, max_new_tokens=8))
    for _ in range(3):
        _collect(results, step())
    if abort:
        sched.abort_request("S3")
    until_idle()
    hits = [shorts[i] + results[f"S{i}"]["output_ids"][:5] + [7, 8] for i in (0, 1, 2)]
    for i, p in enumerate(hits):
        sched.add_request(request(f"H{i}", p, max_new_tokens=12))
    until_idle()
    sched.check_memory()
    assert sched.is_idle() and sched.tree_cache.protected_size() == 0
    return {rid: (r["output_ids"], r["finish_reason"]) for rid, r in results.items()}


def _stale_hits(sched: Scheduler) -> int:
    """Tokens of the cache hits the last wave will find that the tree says lack draft KV."""
    tree, missing = sched.tree_cache, 0
    shorts = make_prompts(62, 10, lo=10, hi=24)
    for p in shorts[:3]:
        match = tree.match_prefix(RadixKey(p[:-1]))
        missing += match.length - min(draft_kv_prefix(match.last_node), match.length)
    return missing


@pytest.mark.parametrize("kwargs", MODES)
def test_crossing_the_batch_rule_both_ways(models, kwargs):  # noqa: F811 - the fixture
    kwargs = {**RULE, **kwargs}
    off = make(models, None, **kwargs)
    expected = _run(off, off.step)
    for draft in ("same", "other"):
        sched = make(models, draft, **kwargs)
        rec = Recorder(sched)
        got = _run(sched, rec.step)
        assert got == expected, draft
        stats = sched.grammar_stats
        assert rec.off_steps >= 3 and stats["draft_model_skipped_passes"] >= rec.off_steps, (rec.off_steps, dict(stats))
        assert stats["draft_model_catch_ups"] > 0 and stats["model_drafts"] > 0
        assert rec.drafted_rows >= stats["model_drafts"]
        checked, total = assert_draft_kv_matches_the_tree(sched)
        assert 0 < checked <= total
        if draft == "same":
            kept, drafted = stats["accepted_draft_tokens"], stats["draft_tokens"]
            assert kept >= 0.9 * drafted > 0, (kept, drafted)
        if "max_total_tokens" in kwargs:
            assert sched.stats["retractions"] > 0
    if "max_total_tokens" in kwargs:
        assert off.stats["retractions"] > 0


def test_cache_hits_on_prefixes_written_while_skipped_catch_up(models):  # noqa: F811 - the fixture
    """The last wave's prompts hit the short requests' prompts and answers, cached while the draft model was
    skipped: the tree knows they lack draft KV, the requests' catch-ups cover them (checked when they draft), and
    the nodes they wrote say so afterwards."""
    sched = make(models, "same", **RULE)
    rec = Recorder(sched)
    seen: list[int] = []
    add = sched.add_request

    def spy(msg):
        if msg.rid.startswith("H") and not seen:
            seen.append(_stale_hits(sched))
        add(msg)

    sched.add_request = spy
    _run(sched, rec.step)
    assert seen and seen[0] > 0
    assert _stale_hits(sched) < seen[0]


def test_graph_rows(models):  # noqa: F811 - the fixture
    """As on CUDA, passes of one row per token replay (padded) graphs -- here their eager stand-ins -- short
    catch-ups among them."""
    def with_graphs(sched: Scheduler) -> Scheduler:
        runners = [sched.runner] + ([_draft_runner(sched)] if sched.args.speculative_algorithm else [])
        for runner in runners:
            runner.graph_runner = CudaGraphRunner(runner, 32, use_graphs=False)
        return sched

    off = with_graphs(make(models, None, **RULE))
    expected = _run(off, off.step)
    sched = with_graphs(make(models, "same", **RULE))
    draft = _draft_runner(sched)
    replays, replay = [], draft.graph_runner.replay
    extend_kv = draft.extend_kv
    catching_up = []

    def counted(fb):
        replays.append(bool(catching_up))
        return replay(fb)

    def marked(spans: list[KVSpan]):
        catching_up.append(True)
        extend_kv(spans)
        catching_up.pop()

    draft.graph_runner.replay, draft.extend_kv = counted, marked
    assert _run(sched, Recorder(sched).step) == expected
    assert any(replays) and sched.grammar_stats["draft_model_catch_ups"] > 0
    assert_draft_kv_matches_the_tree(sched)
    kept, drafted = sched.grammar_stats["accepted_draft_tokens"], sched.grammar_stats["draft_tokens"]
    assert kept >= 0.9 * drafted > 0, (kept, drafted)


def test_abort_while_skipped(models):  # noqa: F811 - the fixture
    """A request aborted while the draft model is skipped frees its slots in both pools; the others are as
    without speculation."""
    off = make(models, None, **RULE)
    expected = _run(off, off.step)
    sched = make(models, "same", **RULE)
    got = _run(sched, Recorder(sched).step, abort=True)
    assert got.pop("S3")[1]["type"] == "abort"
    assert got == {k: v for k, v in expected.items() if k != "S3"}
    assert_draft_kv_matches_the_tree(sched)


def test_no_catch_up_is_caught(models, monkeypatch):  # noqa: F811 - the fixture
    """Mutation: the catch-up computes nothing (the cursor still moves). Outputs stay exact (verification), but the
    check when a request drafts fails: the tests above show the catch-up restores the draft KV."""
    monkeypatch.setattr(DraftModelRunner, "extend_kv", lambda self, spans: None)
    sched = make(models, "same", **RULE)
    with pytest.raises(AssertionError, match="not close"):
        _run(sched, Recorder(sched).step)
