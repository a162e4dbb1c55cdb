"""Scheduler mechanics on a tiny random model: chunked prefill, retraction, aborts, page sizes, and the
KV accounting invariant (checked after every step: enable_integrity_check)."""
from __future__ import annotations

import random

import pytest

from radixlm.runtime.scheduler import planner as batch_module

from .conftest import make_scheduler, request, run_all


def prompts(seed: int, n: int, lo: int = 10, hi: int = 120) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 500) for _ in range(rng.randrange(lo, hi))] for _ in range(n)]


def outputs(tiny_model_dir, ps, max_new_tokens=12, **kwargs):
    sched = make_scheduler(tiny_model_dir, **kwargs)
    for i, p in enumerate(ps):
        sched.add_request(request(f"r{i}", p, max_new_tokens=max_new_tokens))
    res = run_all(sched)
    return {k: v["output_ids"] for k, v in res.items()}, res, sched


@pytest.fixture(scope="module")
def baseline(tiny_model_dir):
    return outputs(tiny_model_dir, prompts(0, 8), chunked_prefill_size=-1)[0]


@pytest.mark.parametrize("kwargs", [
    {"chunked_prefill_size": 16},
    {"disable_radix_cache": True},
    {"page_size": 4},
    {"page_size": 4, "chunked_prefill_size": 8},
    {"max_prefill_tokens": 32},
    {"schedule_policy": "fcfs"},
    {"radix_eviction_policy": "lfu", "max_total_tokens": 260},
])
def test_same_greedy_outputs_across_scheduling_modes(tiny_model_dir, baseline, kwargs):
    got, res, sched = outputs(tiny_model_dir, prompts(0, 8), **kwargs)
    assert got == baseline
    assert all(r["finish_reason"] == {"type": "length", "length": 12} for r in res.values())


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("path", ["request_by_request", "one_scatter"])
def test_req_to_token_write_paths_keep_outputs(tiny_model_dir, baseline, monkeypatch, page_size, path):
    # Every table write one request at a time, or every one (prefills included) as one scatter.
    if path == "request_by_request":
        monkeypatch.setattr(batch_module, "TABLE_SCATTER_MAX_TOKENS", 0)
    else:
        monkeypatch.setattr(batch_module, "TABLE_SCATTER_MAX_TOKENS", 10**9)
        monkeypatch.setattr(batch_module, "TABLE_SLICE_MAX_SPANS", 0)
    got, _res, sched = outputs(tiny_model_dir, prompts(0, 8), page_size=page_size)
    assert got == baseline
    sched.check_memory()


def test_retraction_under_memory_pressure_keeps_outputs(tiny_model_dir, baseline):
    # An optimistic admission (low new_token_ratio) overcommits the pool, so decode must retract.
    got, res, sched = outputs(tiny_model_dir, prompts(0, 8), max_total_tokens=300, chunked_prefill_size=-1,
                              schedule_conservativeness=0.05)
    assert sched.stats["retractions"] > 0
    assert sum(r["num_retractions"] for r in res.values()) == sched.stats["retractions"]
    assert got == baseline
    sched.check_memory()


def test_radix_hit_reports_prompt_minus_one_cached(tiny_model_dir):
    ps = prompts(1, 4)
    sched = make_scheduler(tiny_model_dir)
    for i, p in enumerate(ps):
        sched.add_request(request(f"a{i}", p))
    first = run_all(sched)
    for i, p in enumerate(ps):
        sched.add_request(request(f"b{i}", p))
    second = run_all(sched)
    for i, p in enumerate(ps):
        assert first[f"a{i}"]["cached_tokens"] == 0
        assert second[f"b{i}"]["cached_tokens"] == len(p) - 1
        assert second[f"b{i}"]["output_ids"] == first[f"a{i}"]["output_ids"]


def test_extra_key_namespaces_never_share(tiny_model_dir):
    p = prompts(2, 1)[0]
    sched = make_scheduler(tiny_model_dir)
    sched.add_request(request("a", p, extra_key="tenant-a"))
    run_all(sched)
    sched.add_request(request("b", p, extra_key="tenant-b"))
    sched.add_request(request("c", p, extra_key="tenant-a"))
    res = run_all(sched)
    assert res["b"]["cached_tokens"] == 0
    assert res["c"]["cached_tokens"] == len(p) - 1


def _held_slots(sched) -> int:
    return sched.allocator.size - sched.allocator.available_size() - sched.tree_cache.evictable_size()


def test_abort_mid_decode_frees_what_it_held(tiny_model_dir):
    sched = make_scheduler(tiny_model_dir, chunked_prefill_size=-1)
    sched.add_request(request("keep", prompts(3, 1)[0], max_new_tokens=30))
    sched.add_request(request("drop", prompts(4, 1)[0], max_new_tokens=30))
    for _ in range(5):
        sched.step()
    sched.abort_request("drop")
    outs = sched.step()
    assert [o.finished_reason["type"] for o in outs if o.rid == "drop"] == ["abort"]
    assert [r.rid for r in sched.running] == ["keep"]
    res = run_all(sched)
    assert len(res["keep"]["output_ids"]) == 30
    assert _held_slots(sched) == 0 and sched.tree_cache.protected_size() == 0
    sched.check_memory()


def test_abort_mid_chunked_prefill_frees_what_it_held(tiny_model_dir):
    sched = make_scheduler(tiny_model_dir, chunked_prefill_size=16)
    sched.add_request(request("long", prompts(5, 1, lo=100, hi=101)[0]))
    sched.step()
    sched.step()
    assert sched.chunked_req is not None and sched.chunked_req.kv.committed == 32
    sched.abort_request("long")
    outs = sched.step()
    assert outs[0].finished_reason["type"] == "abort" and outs[0].new_output_ids == []
    assert sched.is_idle() and sched.chunked_req is None
    assert _held_slots(sched) == 0 and sched.tree_cache.protected_size() == 0
    sched.check_memory()
    # The chunks that were computed stay shareable.
    assert sched.tree_cache.evictable_size() == 32


def test_abort_waiting_request_never_runs(tiny_model_dir):
    sched = make_scheduler(tiny_model_dir)
    sched.add_request(request("w", prompts(6, 1)[0]))
    sched.abort_request("w")
    outs = sched.step()
    assert outs[0].finished_reason["type"] == "abort" and sched.stats["prefill_batches"] == 0


def test_max_new_tokens_zero_only_prefills(tiny_model_dir):
    p = prompts(7, 1)[0]
    sched = make_scheduler(tiny_model_dir)
    sched.add_request(request("pre", p, max_new_tokens=0))
    res = run_all(sched)
    assert res["pre"]["output_ids"] == [] and res["pre"]["finish_reason"] == {"type": "length", "length": 0}
    assert sched.tree_cache.evictable_size() == len(p)


def test_request_larger_than_decode_budget_is_aborted_not_crashed(tiny_model_dir):
    sched = make_scheduler(tiny_model_dir, max_total_tokens=64, chunked_prefill_size=-1)
    sched.add_request(request("big", prompts(8, 1, lo=50, hi=51)[0], max_new_tokens=40))
    res = run_all(sched)
    assert res["big"]["finish_reason"]["type"] == "abort"
    assert "Out of memory" in res["big"]["finish_reason"]["message"]
    sched.check_memory()


def _logprob_run(tiny_model_dir, p, **kwargs):
    sched = make_scheduler(tiny_model_dir, **kwargs)
    sched.add_request(request("lp", p, max_new_tokens=6, return_logprob=True, logprob_start_len=0, top_logprobs_num=2))
    inp, out = [], []
    for _ in range(100):
        if sched.is_idle():
            break
        for o in sched.step():
            inp += o.input_token_logprobs
            out += o.output_token_logprobs
    return inp, out


def test_prompt_logprobs_identical_with_chunked_prefill_and_pages(tiny_model_dir):
    p = prompts(9, 1, lo=70, hi=71)[0]
    base_in, base_out = _logprob_run(tiny_model_dir, p, chunked_prefill_size=-1)
    assert [t for _, t in base_in] == p and base_in[0][0] is None and len(base_out) == 6
    for kwargs in ({"chunked_prefill_size": 16}, {"chunked_prefill_size": 8, "page_size": 4}):
        got_in, got_out = _logprob_run(tiny_model_dir, p, **kwargs)
        assert [t for _, t in got_in] == p and got_in[0][0] is None
        assert max(abs(a[0] - b[0]) for a, b in zip(got_in[1:], base_in[1:])) < 1e-5
        assert [t for _, t in got_out] == [t for _, t in base_out]


def test_zero_new_tokens_still_reports_the_next_tokens_top_logprobs(tiny_model_dir):
    sched = make_scheduler(tiny_model_dir)
    sched.add_request(request("next", [5, 6, 7, 8], max_new_tokens=0, return_logprob=True, top_logprobs_num=3))
    sched.add_request(request("one", [5, 6, 7, 8], max_new_tokens=1, return_logprob=True, top_logprobs_num=3))
    tops: dict = {}
    for _ in range(20):
        if sched.is_idle():
            break
        for o in sched.step():
            tops.setdefault(o.rid, []).extend(o.output_top_logprobs)
            if o.rid == "next" and o.finished_reason is not None:
                assert o.new_output_ids == [] and o.finished_reason["type"] == "length"
    assert len(tops["next"]) == 1 and len(tops["next"][0]) == 3
    assert tops["next"] == tops["one"]  # the same distribution: the one after the prompt


def test_chunked_prefill_under_memory_pressure_with_running_decodes(tiny_model_dir):
    ps = prompts(10, 5, lo=10, hi=20) + prompts(11, 1, lo=150, hi=151)
    base, _, _ = outputs(tiny_model_dir, ps, max_new_tokens=40, chunked_prefill_size=-1)
    got, res, sched = outputs(tiny_model_dir, ps, max_new_tokens=40, chunked_prefill_size=16,
                              max_total_tokens=260, schedule_conservativeness=0.05)
    assert got == base
    assert all(r["finish_reason"]["type"] == "length" for r in res.values())


def test_prompt_logprobs_computed_in_row_chunks_are_unchanged(tiny_model_dir, monkeypatch):
    from radixlm.runtime.executor import logits

    p = prompts(12, 1, lo=60, hi=61)[0]
    base_in, base_out = _logprob_run(tiny_model_dir, p, chunked_prefill_size=-1)
    monkeypatch.setattr(logits, "INPUT_LOGPROB_CHUNK_ROWS", 7)
    got_in, got_out = _logprob_run(tiny_model_dir, p, chunked_prefill_size=-1)
    assert [t for _, t in got_in] == [t for _, t in base_in] == p
    assert max(abs(a[0] - b[0]) for a, b in zip(got_in[1:], base_in[1:])) < 1e-6
    assert got_out == base_out


@pytest.mark.parametrize("overlap", [False, True])
def test_output_sink_gets_outputs_while_a_pass_runs_and_loses_none(tiny_model_dir, overlap):
    """With an output sink, outputs of a processed pass go out after the next launch (while the device runs it);
    every request's stream of outputs is the one step() returns without a sink."""
    def streams(use_sink: bool):
        sched = make_scheduler(tiny_model_dir, overlap_schedule="on" if overlap else "auto", chunked_prefill_size=16)
        got: dict[str, list] = {}
        in_flight_at_sink = []

        def deliver(outs):
            for o in outs:
                got.setdefault(o.rid, []).append((o.new_output_ids, o.finished_reason))

        if use_sink:
            sched.output_sink = lambda outs: (in_flight_at_sink.append(sched.inflight is not None), deliver(outs))
        for i, p in enumerate(prompts(3, 6)):
            sched.add_request(request(f"r{i}", p, max_new_tokens=7, stream=True))
        for _ in range(10_000):
            if sched.is_idle():
                break
            deliver(sched.step())
        return got, in_flight_at_sink

    plain, _ = streams(False)
    sunk, flags = streams(True)
    assert sunk == plain and len(plain) == 6
    assert all(flags)  # the sink only ever ran with a pass on the device
    # Without overlap the sink carries outputs; with it, step() returns them while the next pass runs.
    assert flags or overlap
