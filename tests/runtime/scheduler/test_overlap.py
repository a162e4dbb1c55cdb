"""The overlap scheduler on CPU (--overlap-schedule on): batch N+1 is launched before batch N's results are
processed. Outputs must equal those of the synchronous scheduler in every mode, including the tricky ones
(chunked prefill, pages, retraction, aborts, logprobs, seeded sampling), and no KV may leak."""
from __future__ import annotations

import pytest

from radixlm.runtime.messages import TokenizedGenerateReqInput
from radixlm.runtime.sampling.sampling_params import SamplingParams

from .conftest import make_scheduler, request, run_all
from .test_scheduler import prompts


def _run(model_dir: str, reqs: list[TokenizedGenerateReqInput], **kwargs):
    sched = make_scheduler(model_dir, **kwargs)
    for r in reqs:
        sched.add_request(r)
    res = run_all(sched)
    sched.check_memory()
    assert sched.allocator.available_size() + sched.tree_cache.evictable_size() == sched.allocator.size
    return res, sched


def _greedy(n: int, seed: int = 0, max_new_tokens: int = 12, **kw) -> list[TokenizedGenerateReqInput]:
    return [request(f"r{i}", p, max_new_tokens=max_new_tokens + i % 5, **kw) for i, p in enumerate(prompts(seed, n))]


@pytest.mark.parametrize("kwargs", [
    {},
    {"chunked_prefill_size": 16},
    {"page_size": 4, "chunked_prefill_size": 8},
    {"disable_radix_cache": True},
    {"max_total_tokens": 300, "chunked_prefill_size": -1, "schedule_conservativeness": 0.05},  # retraction
])
def test_overlap_outputs_equal_synchronous(tiny_model_dir, kwargs):
    base, _ = _run(tiny_model_dir, _greedy(8), **kwargs)
    got, sched = _run(tiny_model_dir, _greedy(8), overlap_schedule="on", **kwargs)
    assert {k: v["output_ids"] for k, v in got.items()} == {k: v["output_ids"] for k, v in base.items()}
    assert {k: v["finish_reason"] for k, v in got.items()} == {k: v["finish_reason"] for k, v in base.items()}
    assert sched.stats["overlapped_batches"] > 0
    if "schedule_conservativeness" in kwargs:
        assert sched.stats["retractions"] > 0


def _sampled(n: int) -> list[TokenizedGenerateReqInput]:
    reqs = []
    for i, p in enumerate(prompts(4, n)):
        sp = SamplingParams(max_new_tokens=10, temperature=0.9, top_p=0.9, sampling_seed=100 + i, min_new_tokens=3,
                            stop_token_ids=[7, 11, 13, 17, 19, 23])
        sp.normalize()
        reqs.append(TokenizedGenerateReqInput(rid=f"s{i}", input_ids=p, sampling_params=sp, return_logprob=True,
                                              top_logprobs_num=2))
    return reqs


def test_overlap_seeded_sampling_and_logprobs_equal_synchronous(tiny_model_dir):
    # Per-request seeds depend on the output position (pending tokens included), min_new_tokens on the count.
    base, _ = _run(tiny_model_dir, _sampled(6))
    got, sched = _run(tiny_model_dir, _sampled(6), overlap_schedule="on")
    for rid in base:
        assert got[rid]["output_ids"] == base[rid]["output_ids"]
        assert got[rid]["finish_reason"] == base[rid]["finish_reason"]
    assert sched.stats["overlapped_batches"] > 0


def test_overlap_penalties_fall_back_to_synchronous_steps(tiny_model_dir):
    def reqs():
        out = _greedy(4)
        sp = SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True, frequency_penalty=1.5)
        sp.normalize()
        out.append(TokenizedGenerateReqInput(rid="pen", input_ids=prompts(5, 1)[0], sampling_params=sp))
        return out

    base, _ = _run(tiny_model_dir, reqs())
    got, _ = _run(tiny_model_dir, reqs(), overlap_schedule="on")
    assert {k: v["output_ids"] for k, v in got.items()} == {k: v["output_ids"] for k, v in base.items()}


def test_overlap_abort_mid_decode_frees_what_it_held(tiny_model_dir):
    sched = make_scheduler(tiny_model_dir, chunked_prefill_size=-1, overlap_schedule="on")
    sched.add_request(request("keep", prompts(3, 1)[0], max_new_tokens=30))
    sched.add_request(request("drop", prompts(4, 1)[0], max_new_tokens=30))
    for _ in range(5):
        sched.step()
    assert sched.inflight is not None
    sched.abort_request("drop")
    outs = sched.step()
    assert [o.finished_reason["type"] for o in outs if o.rid == "drop"] == ["abort"]
    res = run_all(sched)
    assert len(res["keep"]["output_ids"]) == 30
    assert sched.inflight is None and sched.tree_cache.protected_size() == 0
    assert sched.allocator.available_size() + sched.tree_cache.evictable_size() == sched.allocator.size
    sched.check_memory()


def test_overlap_flush_right_after_the_last_output(tiny_model_dir):
    sched = make_scheduler(tiny_model_dir, overlap_schedule="on")
    sched.add_request(request("a", prompts(6, 1)[0], max_new_tokens=5))
    done = False
    while not done:
        done = any(o.finished_reason for o in sched.step())
    # The pass launched after the last token may still be in flight: the flush processes it and succeeds.
    assert sched.flush_cache()
    assert sched.tree_cache.evictable_size() == 0 and sched.allocator.available_size() == sched.allocator.size


def test_overlap_requests_arriving_while_others_decode(tiny_model_dir):
    """New prefills launched while a decode is in flight, and decodes launched while a prefill is in flight (its
    requests' first tokens still on the device), give the synchronous scheduler's outputs."""
    def run(**kw):
        sched = make_scheduler(tiny_model_dir, chunked_prefill_size=24, **kw)
        reqs = _greedy(12, seed=9)
        out: dict = {}
        for step in range(10_000):
            if step % 3 == 0 and reqs:
                sched.add_request(reqs.pop(0))
            if not reqs and sched.is_idle():
                break
            for o in sched.step():
                out.setdefault(o.rid, []).extend(o.new_output_ids)
        sched.check_memory()
        return out, sched

    base, _ = run()
    got, sched = run(overlap_schedule="on")
    assert got == base and sched.stats["overlapped_batches"] > 10
