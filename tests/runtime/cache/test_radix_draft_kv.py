"""The radix tree's draft-KV marks (TreeNode.draft_kv_len, STANDALONE): a new leaf takes the inserting request's
cursor, a split shares its mark out, nodes already present keep theirs, a catch-up marks its path, and a prompt
moved onto another request's slots when its chunk is cached takes the tree's marks (Planner.cache_chunk)."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from radix_helpers import FakeReq, Sim  # noqa: E402

from radixlm.runtime.cache.radix_cache import RadixKey  # noqa: E402
from radixlm.runtime.cache.radix_node import draft_kv_prefix, mark_draft_kv, path_to  # noqa: E402
from radixlm.runtime.sampling.sampling_params import SamplingParams  # noqa: E402
from radixlm.runtime.scheduler.planner import Planner  # noqa: E402
from radixlm.runtime.scheduler.req import Req  # noqa: E402

torch.set_num_threads(1)


def _finished(sim: Sim, prompt: list[int], draft_kv_len: int) -> None:
    req = sim.admit(FakeReq(prompt))
    sim.prefill(req)
    sim.cache.cache_finished(req.lock, req.req_pool_idx, req.key(), draft_kv_len=draft_kv_len)
    sim.live.remove(req)
    sim.check()


@pytest.mark.parametrize("ps", [1, 4])
def test_marks_follow_inserts_splits_and_catch_ups(ps):
    sim = Sim(size=64, page_size=ps)
    sim.cache.track_draft_kv = True
    prompt = list(range(20, 36))
    _finished(sim, prompt, 5)  # its draft KV stopped at position 5
    hit = sim.admit(FakeReq(prompt[:12] + [90, 91, 92]))  # matches 12 tokens: the leaf splits there
    assert hit.cache_protected_len == 12
    assert draft_kv_prefix(hit.last_node) == 5
    assert [n.draft_kv_len for n in path_to(hit.last_node)] == [5]
    mark_draft_kv(hit.last_node, 12)  # its catch-up wrote the tree's slots of positions [5, 12)
    assert draft_kv_prefix(hit.last_node) == 12
    sim.prefill(hit)
    sim.cache.cache_finished(hit.lock, hit.req_pool_idx, hit.key(), draft_kv_len=hit.kv_committed_len)
    sim.live.remove(hit)
    sim.check()
    # The rest of the first prompt still lacks it (the split's lower half: [12, 16) of a mark of 5).
    rest = sim.cache.match_prefix(RadixKey(prompt))
    assert rest.length == 16 and draft_kv_prefix(rest.last_node) == 12
    # A node present keeps its mark: the duplicate slots of a later writer are freed, not the tree's.
    _finished(sim, prompt + [1, 2, 3, 4], 20)
    again = sim.cache.match_prefix(RadixKey(prompt + [1, 2, 3, 4]))
    assert again.length == 20 and draft_kv_prefix(again.last_node) == 12
    assert again.last_node.draft_kv_len == 4  # the new leaf, [16, 20), all written
    sim.cache.match_prefix(RadixKey(prompt + [1, 2, 9]))  # with pages of 1, splits it after 18: (2, 2)
    sim.check()
    assert draft_kv_prefix(sim.cache.match_prefix(RadixKey(prompt + [1, 2, 3])).last_node) == 12


def _req(sim: Sim, prompt: list[int]) -> Req:
    req = Req("r", prompt, SamplingParams(max_new_tokens=1))
    fake = sim.admit(FakeReq(prompt))
    sim.prefill(fake)
    req.req_pool_idx, req.cache_lock = fake.req_pool_idx, fake.lock
    req.kv.committed = len(prompt)
    return req


@pytest.mark.parametrize("ps", [1, 4])
def test_a_prompt_moved_onto_the_trees_slots_takes_their_marks(ps):
    """Two requests prefill the same prompt: the first caches it while the draft model skipped its pass, the second
    had its own draft KV; once the second's row points at the first one's slots, its cursor falls to the tree's."""
    sim = Sim(size=96, page_size=ps)
    sim.cache.track_draft_kv = True
    planner = Planner(sim.req_pool, sim.alloc, sim.cache, ps)
    prompt = list(range(40, 57))
    skipped, mirrored = _req(sim, prompt), _req(sim, prompt)
    mirrored.kv.draft_kv_len = len(prompt)
    planner.cache_chunk(skipped)
    assert skipped.kv.draft_kv_len == 0
    planner.cache_chunk(mirrored)
    aligned = len(prompt) // ps * ps
    assert mirrored.cache_lock.protected_len == aligned
    assert torch.equal(sim.req_pool.req_to_token[mirrored.req_pool_idx, :aligned],
                       sim.req_pool.req_to_token[skipped.req_pool_idx, :aligned])
    assert mirrored.kv.draft_kv_len == 0
