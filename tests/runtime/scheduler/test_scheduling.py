"""The real Scheduler over FakeRunner (no model): greedy outputs must be the fake model's reference continuations in
every scheduling mode -- chunked prefill, pages, no radix cache, shared prefixes, overlap, mixed prefill, admission
bounds, retraction, aborts -- and the KV accounting is checked after every step (enable_integrity_check).
FakeRunner reads each request's prefix back from the KV slots the scheduler planned, so a scheduling bug changes
tokens or raises FakeKVError. Drafts and logprobs: test_scheduling_drafts.py."""
from __future__ import annotations

import random

import pytest
import torch

from radixlm.runtime.executor.forward_batch import IN_FLIGHT

from .conftest import request, run_all
from .fake_runner import FakeKVError, make_fake_scheduler, make_prompts, record_plans, reference
from .fake_serving import MAX_NEW, assert_all_free, assert_reference, new_rows, requests, serve, with_oracle


def planned_over_chunk(sched) -> list[bool]:
    """For each pass planned from now on: whether a prompt's chunk (not its last) was in flight meanwhile."""
    seen: list[bool] = []
    plan = sched.planner.plan

    def watching(*args, **kwargs):
        seen.append(sched.inflight is not None and sched.inflight.batch.chunk is not None)
        return plan(*args, **kwargs)

    sched.planner.plan = watching
    return seen


# ---------------------------------------------------------------------- modes
MODES = [
    pytest.param({}, 0, id="default"),
    pytest.param({}, 2, id="staggered"),
    pytest.param({"chunked_prefill_size": 16}, 0, id="chunked16"),
    pytest.param({"chunked_prefill_size": 8}, 3, id="chunked8-staggered"),
    pytest.param({"page_size": 4}, 0, id="page4"),
    pytest.param({"page_size": 4, "chunked_prefill_size": 8}, 2, id="page4-chunked8"),
    pytest.param({"disable_radix_cache": True}, 2, id="no-radix"),
    pytest.param({"disable_radix_cache": True, "chunked_prefill_size": 8, "page_size": 4}, 0, id="no-radix-chunked"),
    pytest.param({"schedule_policy": "fcfs"}, 2, id="fcfs"),
    pytest.param({"max_prefill_tokens": 32}, 0, id="max-prefill-32"),
    pytest.param({"max_running_requests": 3}, 0, id="max-running-3"),
    pytest.param({"max_running_requests": 3, "overlap_schedule": "on"}, 1, id="max-running-3-overlap"),
    pytest.param({"overlap_schedule": "on"}, 0, id="overlap"),
    pytest.param({"overlap_schedule": "on", "chunked_prefill_size": 8, "page_size": 4}, 2,
                 id="overlap-page4-chunked8"),
    pytest.param({"graph_rows": 64}, 3, id="mixed"),
    pytest.param({"graph_rows": 64, "page_size": 4}, 3, id="mixed-page4"),
    pytest.param({"graph_rows": 64, "overlap_schedule": "on"}, 3, id="mixed-overlap"),
    pytest.param({"radix_eviction_policy": "lfu", "max_total_tokens": 400}, 2, id="lfu-small-pool"),
    pytest.param({"mixed_chunk": "on", "chunked_prefill_size": 16}, 2, id="mixed-chunk16"),
    pytest.param({"mixed_chunk": "on", "chunked_prefill_size": 8, "page_size": 4,
                  "overlap_schedule": "on"}, 3, id="mixed-chunk8-page4-overlap"),
]


@pytest.mark.parametrize("kwargs, every", MODES)
def test_greedy_outputs_equal_reference(kwargs, every):
    sched = make_fake_scheduler(**kwargs)
    batches = record_plans(sched)
    over_chunk = planned_over_chunk(sched)
    reqs = requests(make_prompts(0, 10))
    res = serve(sched, reqs, every)
    assert_reference(res, reqs)
    assert_all_free(sched)
    passes = sched.runner.passes
    assert len(passes) == len(batches) == sched.stats["prefill_batches"] + sched.stats["decode_batches"]

    # Admission bounds, in every mode.
    mix_all = kwargs.get("mixed_chunk") == "on"
    for b in batches:
        assert len(b.reqs) <= sched.admission.config.max_running_requests
        rows = new_rows(b)
        mixed = len(b.reqs) - len(b.new_reqs) if b.new_reqs else 0
        if sched.admission.config.chunked_prefill_size is not None:
            # With --mixed-chunk on the decode rows riding along take their share of the chunk (a chunk keeps a
            # page).
            assert sum(rows) + (mixed if mix_all else 0) <= max(sched.admission.config.chunked_prefill_size, mixed + sched.page_size)
        assert sum(rows[:-1]) < sched.args.max_prefill_tokens  # the last one admitted may go past it
        if mixed and not mix_all:  # a mixed pass: one graph replay
            assert b.num_rows <= sched.runner.graph_rows
    # What each mode is for happened.
    chunk = kwargs.get("chunked_prefill_size")
    if chunk:
        assert any(b.chunk is not None for b in batches)
        assert any(sum(new_rows(b)) == chunk for b in batches)
    if "max_running_requests" in kwargs:
        assert max(len(b.reqs) for b in batches) == kwargs["max_running_requests"]
    if "max_prefill_tokens" in kwargs:
        assert sched.stats["prefill_batches"] > 1 and any(len(b.new_reqs) > 1 for b in batches)
    if kwargs.get("overlap_schedule") == "on":
        assert sched.stats["overlapped_batches"] > 0
        # A prompt's chunk in flight does not hold the next pass back (it is cached in the tree at launch).
        assert any(over_chunk) == bool(chunk)
        assert any(wb.has_in_flight and IN_FLIGHT in wb.input_ids for wb in passes)
    else:
        assert not any(wb.has_in_flight for wb in passes)
    if mix_all:  # a prompt's chunk, not its last, carried decode rows
        assert any(b.chunk is not None and len(b.reqs) > len(b.new_reqs) for b in batches)
    if kwargs.get("graph_rows") or mix_all:
        assert sched.stats["mixed_batches"] > 0
        assert sum(1 for b in batches if b.new_reqs and len(b.reqs) > len(b.new_reqs)) == sched.stats["mixed_batches"]
        if kwargs.get("overlap_schedule") == "on":  # a running request's token in flight in a mixed pass
            assert any(b.new_reqs and IN_FLIGHT in b.worker.input_ids for b in batches)
    else:
        assert sched.stats["mixed_batches"] == 0


@pytest.mark.parametrize("logprob", [False, True])
def test_only_a_pass_of_plain_argmaxes_samples_the_models_dtype(logprob):
    """A pass whose sampling is an argmax alone reads the logits in the model's dtype (no float32 copy); a request
    asking for logprobs makes its passes float32. Outputs equal the reference either way."""
    sched = make_fake_scheduler(graph_rows=64)
    sched.runner.logits_dtype = torch.bfloat16
    dtypes = []
    sample = sched.sampler

    def spy(logits, info, generator=None):
        dtypes.append(logits.dtype)
        return sample(logits, info, generator)

    sched.sampler = spy
    reqs = requests(make_prompts(3, 6), return_logprob=logprob)
    assert_reference(serve(sched, reqs), reqs)
    assert dtypes and set(dtypes) == {torch.float32 if logprob else torch.bfloat16}


# ---------------------------------------------------------------------- prefixes
@pytest.mark.parametrize("kwargs", [{}, {"page_size": 4}, {"overlap_schedule": "on"},
                                    {"chunked_prefill_size": 16, "page_size": 4}, {"graph_rows": 64}])
def test_shared_prefixes_are_cached_and_outputs_unchanged(kwargs):
    ps_ = kwargs.get("page_size", 1)
    head = make_prompts(20, 1, lo=40, hi=41)[0]
    prompts = make_prompts(21, 8, lo=3, hi=20, prefix=head)
    sched = make_fake_scheduler(**kwargs)
    first = requests(prompts)
    res = serve(sched, first, every=3)
    assert_reference(res, first)
    cached = [res[r.rid]["cached_tokens"] for r in first]
    assert cached[0] == 0 and max(cached) >= len(head) // ps_ * ps_
    assert sched.stats["cached_tokens"] == sum(cached) > 0
    # The same prompts again: all but the last token (whole pages) come from the tree.
    again = [request(f"again{i}", p, max_new_tokens=MAX_NEW + i % 4) for i, p in enumerate(prompts)]
    res = serve(sched, again)
    assert_reference(res, again)
    assert [res[r.rid]["cached_tokens"] for r in again] == [(len(p) - 1) // ps_ * ps_ for p in prompts]
    assert_all_free(sched)


def test_extra_key_namespaces_do_not_share():
    p = make_prompts(22, 1, lo=30, hi=31)[0]
    sched = make_fake_scheduler()
    serve(sched, [request("a", p, extra_key="x")])
    res = serve(sched, [request("b", p, extra_key="y"), request("c", p, extra_key="x")])
    assert res["b"]["cached_tokens"] == 0 and res["c"]["cached_tokens"] == len(p) - 1
    assert res["b"]["output_ids"] == res["c"]["output_ids"] == reference(p, 4)


# ---------------------------------------------------------------------- retraction
@pytest.mark.parametrize("kwargs", [{}, {"page_size": 4}, {"overlap_schedule": "on"},
                                    {"chunked_prefill_size": 16}, {"graph_rows": 64}])
def test_retraction_under_a_tiny_pool_keeps_outputs(kwargs):
    sched = make_fake_scheduler(max_total_tokens=240, schedule_conservativeness=0.05, **kwargs)
    reqs = requests(make_prompts(1, 8, lo=10, hi=40), max_new=24)
    res = serve(sched, reqs, every=1 if "graph_rows" in kwargs else 0)
    assert_reference(res, reqs)
    assert sched.stats["retractions"] > 0
    assert sum(r["num_retractions"] for r in res.values()) == sched.stats["retractions"]
    assert_all_free(sched)


def test_the_new_token_ratio_starts_afresh_after_idle():
    """Requests that stop early (a tenth of their budget) teach admission little: after idle the ratio starts at
    init again and decays while a wave decodes."""
    sched = make_fake_scheduler(max_total_tokens=2048)
    init = sched.ratio.init
    prompts = make_prompts(1, 4, lo=10, hi=20)
    early = []
    for i, p in enumerate(prompts):
        early.append(req := request(f"r{i}", p, max_new_tokens=40))
        req.sampling_params.stop_token_ids = {reference(p, 4)[3]}  # the fourth output token stops it
    res = serve(sched, early)
    assert all(len(r["output_ids"]) == 4 for r in res.values())
    assert sched.ratio.budget_use == pytest.approx(0.1)
    assert sched.ratio.value == init  # reset on idle
    sched.add_request(request("late", make_prompts(2, 1, lo=10, hi=20)[0], max_new_tokens=40))
    for _ in range(20):
        sched.step()
    assert sched.running and max(0.1, sched.ratio.min) <= sched.ratio.value < init  # decaying


@pytest.mark.parametrize("conservativeness", [1.0, 0.5])
def test_admission_learns_that_requests_run_to_their_budgets(conservativeness):
    """Requests that ran to max_new_tokens raise the ratio's floor to what they used (times
    schedule_conservativeness): after idle admission starts there and a wave's decode does not decay below it, so a
    pool sized for the whole budgets is not over-committed (scheduler_sim.py --kind retraction budget_use=1.0: no
    retraction)."""
    sched = make_fake_scheduler(max_total_tokens=2048, schedule_conservativeness=conservativeness)
    assert sched.ratio.budget_use is None
    serve(sched, requests(make_prompts(1, 4, lo=10, hi=20), max_new=40))
    assert sched.ratio.budget_use == 1.0
    floor = min(1.0, conservativeness)
    assert sched.ratio.value == pytest.approx(max(sched.ratio.init, floor))
    sched.add_request(request("late", make_prompts(2, 1, lo=10, hi=20)[0], max_new_tokens=40))
    for _ in range(20):
        sched.step()
    assert sched.running and sched.ratio.value == pytest.approx(floor)
    # An aborted request teaches nothing.
    sched.abort_request("late")
    run_all(sched)
    assert sched.ratio.budget_use == 1.0


def test_a_request_that_cannot_fit_is_aborted_and_frees_everything():
    sched = make_fake_scheduler(max_total_tokens=64, chunked_prefill_size=-1)
    reqs = [request("big", make_prompts(2, 1, lo=50, hi=51)[0], max_new_tokens=40)]
    res = serve(sched, reqs)
    assert res["big"]["finish_reason"]["type"] == "abort" and "Out of memory" in res["big"]["finish_reason"]["message"]
    assert res["big"]["output_ids"] == reference(reqs[0].input_ids, len(res["big"]["output_ids"]))
    assert_all_free(sched)


# ---------------------------------------------------------------------- aborts
@pytest.mark.parametrize("drafts", [False, True], ids=["no-drafts", "drafts"])
@pytest.mark.parametrize("kwargs", [{}, {"overlap_schedule": "on"}, {"page_size": 4},
                                    {"chunked_prefill_size": 8, "page_size": 4, "overlap_schedule": "on"}])
def test_aborts_mid_decode_free_everything(kwargs, drafts):
    sched = make_fake_scheduler(**kwargs)
    if drafts:
        with_oracle(sched, past_max_new=True)
    reqs = requests(make_prompts(3, 6, lo=10, hi=40), max_new=30)
    res: dict = {}

    def step():
        for out in sched.step():
            res.setdefault(out.rid, []).append(out)

    for r in reqs:
        sched.add_request(r)
    for _ in range(100):  # until all of them decode
        step()
        if sum(len(r.output_ids) >= 2 for r in sched.running) == 6:
            break
    assert len(sched.running) == 6
    sched.abort_requests(["r1", "r3"])
    for _ in range(4):
        step()
    sched.abort_request("r5")
    sched.abort_request("no-such-request")
    for _ in range(200):
        if sched.is_idle():
            break
        step()
    aborted = {"r1", "r3", "r5"}
    for r in reqs:
        got = [t for o in res[r.rid] for t in o.new_output_ids]
        final = res[r.rid][-1].finished_reason
        if r.rid in aborted:
            assert final["type"] == "abort"
            assert 0 < len(got) < 30 and got == reference(r.input_ids, len(got))
        else:
            assert final["type"] == "length" and got == reference(r.input_ids, 30 + int(r.rid[1:]) % 4)
    assert_all_free(sched)


@pytest.mark.parametrize("overlap", [False, True])
def test_abort_mid_chunked_prefill_and_while_waiting(overlap):
    sched = make_fake_scheduler(chunked_prefill_size=16, max_running_requests=1, overlap_schedule="on" if overlap else "auto")
    long = make_prompts(4, 1, lo=100, hi=101)[0]
    sched.add_request(request("long", long))
    sched.add_request(request("waiting", make_prompts(5, 1)[0]))
    sched.step()
    sched.step()
    assert sched.chunked_req is not None and sched.chunked_req.rid == "long"
    sched.abort_requests(["long", "waiting"])
    outs = sched.step()
    assert sorted((o.rid, o.finished_reason["type"], o.new_output_ids) for o in outs) == [
        ("long", "abort", []), ("waiting", "abort", [])]
    assert sched.is_idle() and sched.chunked_req is None
    assert_all_free(sched)
    assert sched.tree_cache.evictable_size() == 32  # the chunks computed stay shareable
    # And they are right: a request with that prompt reuses them and gets the reference.
    res = serve(sched, [request("again", long)])
    assert res["again"]["cached_tokens"] == 32 and res["again"]["output_ids"] == reference(long, 4)


def test_abort_everything_mid_decode_with_overlap():
    sched = make_fake_scheduler(overlap_schedule="on")
    reqs = requests(make_prompts(6, 5), max_new=40)
    for r in reqs:
        sched.add_request(r)
    for _ in range(5):
        sched.step()
    assert sched.inflight is not None
    sched.abort_requests([r.rid for r in reqs])
    res = run_all(sched)
    assert all(r["finish_reason"]["type"] == "abort" for r in res.values()) and len(res) == 5
    assert_all_free(sched)


# ---------------------------------------------------------------------- the fake's checks fire
def test_the_kv_check_fires_inside_the_scheduler():
    sched = make_fake_scheduler()
    p = make_prompts(7, 1, lo=20, hi=21)[0]
    sched.add_request(request("a", p, max_new_tokens=8))
    sched.step()
    sched.step()
    req = sched.running[0]
    sched.runner.corrupt(int(sched.req_to_token_pool.req_to_token[req.req_pool_idx, 5]))
    with pytest.raises(FakeKVError, match="holds position 6, not 5"):
        sched.step()


def test_a_planner_that_loses_the_cached_prefix_is_caught(monkeypatch):
    """Mutation: new requests' matched prefix not written into their req_to_token rows. FakeRunner then reads slots
    that are not the prefix's."""
    from radixlm.runtime.scheduler.planner import Planner

    def admit_rows_without_prefix(self, new_reqs):
        for req in new_reqs:
            if req.req_pool_idx is None:
                req.req_pool_idx = self.req_to_token_pool.alloc()

    head = make_prompts(8, 1, lo=40, hi=41)[0]
    prompts = make_prompts(9, 2, lo=3, hi=10, prefix=head)
    sched = make_fake_scheduler()
    serve(sched, requests(prompts[:1]))
    res = serve(sched, [request("hit", prompts[1])])  # the real planner: a hit, and the right tokens
    assert res["hit"]["cached_tokens"] == len(head) and res["hit"]["output_ids"] == reference(prompts[1], 4)
    monkeypatch.setattr(Planner, "_admit_rows", admit_rows_without_prefix)
    sched.req_to_token_pool.req_to_token.fill_(0)  # no stale row that happens to hold the right slots
    with pytest.raises(FakeKVError, match="outside the pool"):
        serve(sched, [request("hit-again", prompts[1])])


@pytest.mark.parametrize("kwargs", [{}, {"page_size": 4}, {"overlap_schedule": "on"},
                                    {"chunked_prefill_size": 16, "page_size": 4}])
def test_identical_prompts_admitted_together(kwargs):
    """Several requests prefill the same prompt in one pass: the first to be cached keeps its slots, the others'
    rows are pointed at them (RadixCache.cache_unfinished) and their own slots freed."""
    p = make_prompts(14, 1, lo=45, hi=46)[0]
    sched = make_fake_scheduler(**kwargs)
    reqs = [request(f"same{i}", p, max_new_tokens=8 + i) for i in range(4)]
    res = serve(sched, reqs)
    assert_reference(res, reqs)
    assert_all_free(sched)


@pytest.mark.parametrize("kwargs", [{}, {"overlap_schedule": "on"}, {"page_size": 4}])
def test_long_chunked_prompt_under_memory_pressure_with_running_decodes(kwargs):
    reqs = requests(make_prompts(15, 5, lo=10, hi=20) + make_prompts(16, 1, lo=150, hi=151), max_new=40)
    sched = make_fake_scheduler(chunked_prefill_size=16, max_total_tokens=260, schedule_conservativeness=0.05,
                                **kwargs)
    batches = record_plans(sched)
    res = serve(sched, reqs)
    assert_reference(res, reqs)
    assert any(b.chunk is not None and len(b.reqs) == 1 for b in batches)
    assert_all_free(sched)


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("max_new", [1, 2, 3])
def test_drafts_longer_than_the_few_tokens_left(page_size, max_new):
    sched = make_fake_scheduler(page_size=page_size)
    oracle = with_oracle(sched, k=6, past_max_new=True)
    reqs = [request(f"r{i}", p, max_new_tokens=max_new) for i, p in enumerate(make_prompts(17, 4))]
    res = serve(sched, reqs)
    assert_reference(res, reqs)
    assert oracle.drafts_past_max_new > 0 and sched.grammar_stats["accepted_draft_tokens"] > 0
    assert_all_free(sched)


def test_a_prefill_draft_for_max_new_tokens_zero_yields_no_token():
    sched = make_fake_scheduler()
    with_oracle(sched, past_max_new=True)
    p = make_prompts(18, 1)[0]
    res = serve(sched, [request("zero", p, max_new_tokens=0)])
    assert res["zero"]["finish_reason"] == {"type": "length", "length": 0}
    assert res["zero"]["output_ids"] == []


def test_flush_cache_only_when_idle_and_outputs_unchanged():
    sched = make_fake_scheduler()
    reqs = requests(make_prompts(19, 4))
    assert_reference(serve(sched, reqs), reqs)
    assert sched.tree_cache.evictable_size() > 0
    sched.add_request(request("busy", reqs[0].input_ids))
    sched.step()
    assert not sched.flush_cache()
    run_all(sched)
    assert sched.flush_cache() and sched.tree_cache.evictable_size() == 0
    assert sched.allocator.available_size() == sched.allocator.size
    res = serve(sched, [request("again", reqs[0].input_ids)])
    assert res["again"]["cached_tokens"] == 0 and res["again"]["output_ids"] == reference(reqs[0].input_ids, 4)


@pytest.mark.parametrize("kwargs", [{}, {"overlap_schedule": "on"}])
def test_streaming_outputs_arrive_token_by_token(kwargs):
    sched = make_fake_scheduler(**kwargs)
    reqs = requests(make_prompts(23, 3), stream=True)
    for r in reqs:
        sched.add_request(r)
    chunks: dict = {}
    for _ in range(200):
        if sched.is_idle():
            break
        for o in sched.step():
            chunks.setdefault(o.rid, []).append(o.new_output_ids)
    for r in reqs:
        assert [t for c in chunks[r.rid] for t in c] == reference(r.input_ids, r.sampling_params.max_new_tokens)
        assert all(len(c) == 1 for c in chunks[r.rid])


FUZZ_SEEDS = range(8)


@pytest.mark.parametrize("seed", FUZZ_SEEDS)
def test_random_arrivals_aborts_and_modes(seed):
    """Random modes, prompts sharing random heads, random arrivals and aborts: every output is a prefix of the
    reference (all of it unless aborted), nothing is reported after a request finished, and everything is freed."""
    rng = random.Random(seed)
    ps = rng.choice([1, 2, 4])
    kw: dict = {"page_size": ps}
    if rng.random() < 0.5:
        kw["chunked_prefill_size"] = rng.choice([ps * 2, 8, 16])
    if rng.random() < 0.5:
        kw["overlap_schedule"] = "on"
    if rng.random() < 0.5:
        kw["graph_rows"] = rng.choice([16, 64])
    if rng.random() < 0.5:
        kw.update(max_total_tokens=rng.choice([200, 256]), schedule_conservativeness=rng.choice([0.05, 1.0]))
    if rng.random() < 0.3:
        kw["max_running_requests"] = rng.choice([2, 4])
    sched = make_fake_scheduler(**kw)
    if rng.random() < 0.5:
        with_oracle(sched, k=rng.choice([1, 3, 6]), past_max_new=rng.random() < 0.5)
    heads = make_prompts(100 + seed, 3, lo=5, hi=40) + [[]]
    reqs = [request(f"q{i}", rng.choice(heads) + make_prompts(200 + 10 * seed + i, 1, lo=1, hi=30)[0],
                    max_new_tokens=rng.choice([1, 2, 5, 10, 20]), stream=rng.random() < 0.3)
            for i in range(rng.randrange(4, 10))]
    got: dict = {}
    aborted = set()
    pending = list(reqs)
    for _ in range(3000):
        if pending and rng.random() < 0.4:
            sched.add_request(pending.pop(0))
        if rng.random() < 0.03:
            rid = rng.choice(reqs).rid
            aborted.add(rid)
            sched.abort_request(rid)
        for o in sched.step():
            ids, fin = got.get(o.rid, ([], None))
            assert fin is None, f"{o.rid} reported after it finished"
            got[o.rid] = (ids + o.new_output_ids, o.finished_reason)
        if not pending and sched.is_idle():
            break
    assert sched.is_idle()
    for r in reqs:
        ids, fin = got[r.rid]
        n = r.sampling_params.max_new_tokens
        if fin["type"] == "abort":
            assert r.rid in aborted or "Out of memory" in fin["message"], (r.rid, fin)
            assert ids == reference(r.input_ids, len(ids)) and len(ids) <= n
        else:
            assert fin == {"type": "length", "length": n} and ids == reference(r.input_ids, n), r.rid
    assert_all_free(sched)
