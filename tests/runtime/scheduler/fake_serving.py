"""Driving a real Scheduler over FakeRunner in tests: requests, serving them to idle, the checks every test makes, and
a draft source that knows the fake model (an oracle with deliberate mistakes)."""
from __future__ import annotations

from radixlm.runtime.spec.draft import Draft, DraftSource
from radixlm.runtime.spec.path import DraftPath
from radixlm.runtime.scheduler.scheduler import Scheduler

from .conftest import request, run_all
from .fake_runner import FIRST_TOKEN, VOCAB, reference

MAX_NEW = 10


def requests(ps: list[list[int]], max_new: int = MAX_NEW, **kw):
    return [request(f"r{i}", p, max_new_tokens=max_new + i % 4, **kw) for i, p in enumerate(ps)]


def serve(sched: Scheduler, reqs, every: int = 0) -> dict:
    """Adds the requests (all at once, or one every `every` steps, so that prompts meet running decodes) and steps
    until idle; returns run_all's results."""
    results: dict = {}

    def collect(outs):
        for out in outs:
            r = results.setdefault(out.rid, {"output_ids": []})
            r["output_ids"] += out.new_output_ids
            r.update(cached_tokens=out.cached_tokens, finish_reason=out.finished_reason,
                     num_retractions=out.num_retractions, prompt_tokens=out.prompt_tokens)

    for req in reqs:
        sched.add_request(req)
        for _ in range(every):
            collect(sched.step())
    for rid, r in run_all(sched).items():
        results.setdefault(rid, {"output_ids": []})["output_ids"] += r.pop("output_ids")
        results[rid].update(r)
    return results


def assert_reference(res: dict, reqs) -> None:
    assert sorted(res) == sorted(r.rid for r in reqs)
    for r in reqs:
        n = r.sampling_params.max_new_tokens
        assert res[r.rid]["output_ids"] == reference(r.input_ids, n), r.rid
        assert res[r.rid]["finish_reason"] == {"type": "length", "length": n}, r.rid


def assert_all_free(sched: Scheduler) -> None:
    sched.check_memory()
    assert sched.is_idle()
    assert sched.allocator.available_size() + sched.tree_cache.evictable_size() == sched.allocator.size
    assert sched.tree_cache.protected_size() == 0
    assert sched.req_to_token_pool.available_size() == sched.req_to_token_pool.size


def new_rows(batch) -> list[int]:
    """Rows of each request admitted to the pass (its prompt, or its chunk)."""
    return batch.worker.extend_lens[len(batch.reqs) - len(batch.new_reqs):]


class OracleDrafts(DraftSource):
    """A draft source that knows the fake model: it proposes its next k tokens, every third draft with a wrong token
    at a varying place and every third with a wrong first token (unless not `mistakes`). `past_max_new`: drafts
    ignore max_new_tokens."""

    def __init__(self, k: int = 3, past_max_new: bool = False, only=None, mistakes: bool = True):
        self.k, self.past_max_new, self.only, self.mistakes = k, past_max_new, only, mistakes
        self.proposals = 0
        self.drafts_past_max_new = 0
        self.learned: list[tuple[str, int, int]] = []
        self.bad_lessons: list = []

    def applies_to(self, req) -> bool:
        return self.only is None or self.only(req.rid)

    def propose(self, req) -> None:
        left = req.sampling_params.max_new_tokens - len(req.output_ids)
        k = self.k if self.past_max_new else min(self.k, left)
        if k <= 0:
            return
        truth = reference(req.origin_input_ids + req.output_ids, k)
        tokens = list(truth)
        self.proposals += 1
        kind = self.proposals % 3
        if kind and self.mistakes:
            j = 0 if kind == 2 else (self.proposals // 3) % k
            tokens[j] = FIRST_TOKEN + (tokens[j] - FIRST_TOKEN + 1) % (VOCAB - FIRST_TOKEN)
        req.kv.draft = Draft(tokens, self, key=tuple(truth))
        self.drafts_past_max_new += k > left

    def learn(self, req, draft: Draft, accepted: int, token: int) -> None:
        truth = list(draft.key)
        first_wrong = next((i for i, (a, b) in enumerate(zip(draft.tokens, truth)) if a != b), None)
        self.learned.append((req.rid, accepted, token))
        if accepted != first_wrong or token != truth[accepted]:
            self.bad_lessons.append((req.rid, draft.tokens, truth, accepted, token))


def with_oracle(sched: Scheduler, **kw) -> OracleDrafts:
    oracle = OracleDrafts(**kw)
    sched.drafts = DraftPath([oracle], None, sched.page_size, sched.grammar_stats)
    return oracle
