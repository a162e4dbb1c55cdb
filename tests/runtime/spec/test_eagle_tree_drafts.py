"""Tree drafts (--speculative-eagle-topk K > 1) through the real Scheduler over a tiny random-weight Llama (float32,
CPU): one verification pass per tree with a tree mask, the longest accepted path kept and its KV moved into place.

An oracle source that knows the greedy outputs proposes trees whose true path hides among wrong siblings (at any
sibling index, sometimes broken at some depth), so paths through later siblings are accepted deep; the EAGLE head's
own trees (random weights: few accepted) are checked node by node against a from-scratch reference. Outputs equal
those without speculation across pages, chunks, retraction and overlap, with the KV accounting checked after every
step; mutations (a causal mask instead of the tree's, no KV compaction) change them."""
from __future__ import annotations

import random

import pytest
import torch

from radixlm.runtime.spec.tree import TreeBuild, depths, nodes_within, row_tokens, verify_mask, walk
from radixlm.runtime.spec.draft import Draft, DraftSource
from radixlm.runtime.spec.path import DraftPath
from radixlm.runtime.spec.sources.model import EagleSource

from tests.runtime.scheduler.conftest import request
from tests.runtime.scheduler.fake_serving import serve
from .test_eagle_drafts import MODES, _reference_head, setup  # noqa: F401 - the module's fixture
from .test_standalone_drafts import make


# ---------------------------------------------------------------------- the tree helpers
def test_verify_mask_rows_see_their_ancestors_only():
    parents = [-1, -1, 0, 0, 1, 2]
    mask = verify_mask(parents, 2)  # a row before the root, the root, then the six nodes
    assert mask[:2, :2].tolist() == [[True, False], [True, True]]
    assert mask[2:, :2].all() and not mask[:2, 2:].any()
    seen = {i: {j for j in range(6) if mask[2 + i, 2 + j]} for i in range(6)}
    assert seen == {0: {0}, 1: {1}, 2: {0, 2}, 3: {0, 3}, 4: {1, 4}, 5: {0, 2, 5}}
    assert depths(parents) == [1, 1, 2, 2, 2, 3] and nodes_within(parents, 2) == 5


def test_walk_follows_the_targets_choice_at_each_node():
    tokens, parents = [5, 6, 7, 8, 9], [-1, -1, 1, 1, 3]
    # the target's choice at the root, then at each node
    assert walk(parents, tokens, [6, 0, 8, 0, 9, 1].__getitem__) == ([1, 3, 4], 1)
    assert walk(parents, tokens, [6, 0, 7, 0, 9, 0].__getitem__) == ([1, 2], 0)
    assert walk(parents, tokens, [4, 0, 7, 0, 9, 0].__getitem__) == ([], 4)
    assert [row_tokens(tokens, parents, r) for r in (0, 1, 5)] == [[], [5], [6, 8, 9]]


def test_select_keeps_the_best_nodes_as_a_tree_in_depth_order():
    build = TreeBuild([1, 2, 3, 4, 5, 6], [-1, -1, 0, 0, 1, 2], [-0.1, -2.0, -0.3, -0.5, -2.5, -0.4])
    tokens, parents = build.select(4)
    assert tokens == [1, 3, 4, 6] and parents == [-1, 0, 0, 1]
    assert Draft(tokens, None, parents=parents).cut(2).parents == [-1, 0]


# ---------------------------------------------------------------------- an oracle's trees
class TreeOracle(DraftSource):
    """Proposes trees around the greedy outputs `truth`: a level's siblings are distinct tokens, the true one (if the
    level has it) at a random index; a level breaks the true path one time in five."""

    def __init__(self, truth: dict[str, list[int]], depth: int = 4, seed: int = 0, every: int = 1):
        self.truth, self.depth, self.rng, self.every = truth, depth, random.Random(seed), every
        self.proposed = 0
        self.asked = 0

    def applies_to(self, req) -> bool:
        return True

    def propose(self, req) -> None:
        self.asked += 1
        if self.asked % self.every:
            return
        truth = self.truth[req.rid][len(req.output_ids):][: self.depth]
        tokens, parents, level = [], [], [(-1, True)]
        for t in truth:
            nxt = []
            for parent, on_path in level:
                siblings = self.rng.sample(range(3, 500), self.rng.randint(1, 3))
                if on_path and self.rng.random() < 0.8:
                    siblings = [s for s in siblings if s != t][:2]
                    siblings.insert(self.rng.randrange(len(siblings) + 1), t)
                for s in siblings:
                    tokens.append(s)
                    parents.append(parent)
                    nxt.append((len(tokens) - 1, on_path and s == t))
            level = nxt[:4]
        if tokens:
            req.kv.draft = Draft(tokens, self, parents=parents)
            self.proposed += 1

    def learn(self, req, draft, accepted: int, token: int) -> None:
        pass


def _requests(seed: int = 81):
    g = random.Random(seed)
    prompts = [[g.randrange(3, 500) for _ in range(g.randint(10, 30))] for _ in range(5)]
    prompts.append(prompts[0])
    return [request(f"r{i}", p, max_new_tokens=9 + 2 * i) for i, p in enumerate(prompts)]


def _with_oracle(sched, truth) -> TreeOracle:
    oracle = TreeOracle(truth)
    sched.drafts = DraftPath([oracle], None, sched.page_size, sched.grammar_stats)
    return oracle


def _off(paths, kwargs, every):
    return {k: v["output_ids"] for k, v in serve(make({"target": paths["target"]}, None, **kwargs), _requests(),
                                                   every).items()}


@pytest.mark.parametrize("kwargs, every", MODES)
def test_oracle_trees_keep_outputs_and_kv(setup, kwargs, every):
    paths, _, _ = setup
    expected = _off(paths, kwargs, every)
    sched = make({"target": paths["target"]}, None, **kwargs)
    oracle = _with_oracle(sched, expected)
    got = serve(sched, _requests(), every)
    assert {k: v["output_ids"] for k, v in got.items()} == expected
    stats = sched.grammar_stats
    assert oracle.proposed >= 6 and stats["accepted_draft_tokens"] > stats["draft_verifications"]
    assert sched.stats["tree_kv_moves"] > 0  # paths through later siblings: their KV moved into place
    sched.check_memory()
    if "max_total_tokens" in kwargs:
        assert sched.stats["retractions"] > 0


@pytest.mark.parametrize("mutation", ["causal_mask", "no_compaction"])
def test_mutations_change_outputs(setup, monkeypatch, mutation):
    """Without the tree mask (the nodes' rows causal over each other) or without moving the accepted nodes' KV
    into place, outputs differ from those without speculation."""
    from radixlm.runtime.scheduler import planner

    paths, _, _ = setup
    expected = _off(paths, {}, 0)
    if mutation == "causal_mask":
        monkeypatch.setattr(planner, "verify_mask",
                            lambda parents, before: torch.ones(before + len(parents), before + len(parents),
                                                               dtype=torch.bool).tril())
    else:
        monkeypatch.setattr(planner.Planner, "compact_tree", lambda self, req, path: 0)
    sched = make({"target": paths["target"]}, None)
    _with_oracle(sched, expected)
    got = serve(sched, _requests())
    assert {k: v["output_ids"] for k, v in got.items()} != expected


# ---------------------------------------------------------------------- the EAGLE head's trees
def _eagle_tree(paths, **kw):
    return make({"target": paths["target"]}, None, speculative_algorithm="EAGLE",
                speculative_draft_model_path=paths["head"], speculative_num_draft_tokens=7, speculative_num_steps=3,
                speculative_eagle_topk=3, **kw)


def _record_trees(sched, rids: list | None = None) -> list[tuple[list[int], Draft]]:
    """(tokens, draft) of every draft the head proposes; `rids` gets each one's request id."""
    source = next(s for s in sched.drafts.sources if isinstance(s, EagleSource))
    seen, propose = [], source.propose_batch

    def recording(reqs, limits):
        propose(reqs, limits)
        drafted = [r for r in reqs if r.kv.draft is not None]
        seen.extend((r.origin_input_ids + r.output_ids, r.kv.draft) for r in drafted)
        if rids is not None:
            rids.extend(r.rid for r in drafted)

    source.propose_batch = recording
    return seen


def _reference_topk(hf, w, tokens: list[int], path: list[int], k: int) -> list[int]:
    """The k likeliest tokens the head gives after the sequence `tokens` and then the draft tokens `path`."""
    with torch.no_grad():
        hidden = hf.model(torch.tensor([tokens[:-1]])).last_hidden_state[0]
        embed, lm_head = hf.model.embed_tokens.weight, hf.lm_head.weight
        features, pair_tokens = hidden, list(tokens[1:])
        out = _reference_head(w, embed, features, pair_tokens)[-1]
        for t in path:
            features, pair_tokens = torch.cat([features, out[None]]), pair_tokens + [t]
            out = _reference_head(w, embed, features, pair_tokens)[-1]
        return torch.topk(out @ lm_head.T, k).indices.tolist()


@pytest.mark.parametrize("kwargs, every", MODES)
def test_eagle_trees_match_the_reference_and_keep_outputs(setup, kwargs, every):
    paths, hf, weights = setup
    expected = _off(paths, kwargs, every)
    sched = _eagle_tree(paths, **kwargs)
    seen = _record_trees(sched)
    got = serve(sched, _requests(), every)
    assert {k: v["output_ids"] for k, v in got.items()} == expected
    trees = [(t, d) for t, d in seen if d.parents is not None]
    assert trees and sched.grammar_stats["tree_drafts"] == len(trees)
    for tokens, draft in trees[:4]:
        assert max(depths(draft.parents)) <= 3 and len(draft.tokens) <= 6
        for i, parent in enumerate(draft.parents):  # each node is among the head's top 3 after its path
            path = row_tokens(draft.tokens, draft.parents, parent + 1)
            assert draft.tokens[i] in _reference_topk(hf, weights, tokens, path, 3), (tokens, draft)
    sched.check_memory()


def test_sampled_and_greedy_requests_draft_trees_together(setup):
    """Sampled requests (temperature, a repetition penalty: their rows read the node's path) draft trees beside
    greedy ones in the same passes; the greedy outputs equal those without speculation."""
    paths, _, _ = setup
    expected = _off(paths, {}, 0)
    sched = _eagle_tree(paths)
    rids: list[str] = []
    seen = _record_trees(sched, rids)
    reqs = _requests()
    for r in reqs[::2]:
        r.sampling_params.temperature = 0.8
        r.sampling_params.repetition_penalty = 1.3
    got = serve(sched, reqs)
    assert {rid for rid, (_, d) in zip(rids, seen) if d.parents is not None} == {r.rid for r in reqs}
    assert all(got[r.rid]["output_ids"] == expected[r.rid] for r in reqs[1::2])
    sched.check_memory()


def test_backend_without_tree_masks_drafts_chains(setup, monkeypatch):
    from radixlm.runtime.layers.attention.torch_native import TorchNativeAttnBackend

    paths, _, _ = setup
    expected = _off(paths, {}, 0)
    monkeypatch.setattr(TorchNativeAttnBackend, "supports_tree_mask", False)
    sched = _eagle_tree(paths)
    seen = _record_trees(sched)
    got = serve(sched, _requests())
    assert {k: v["output_ids"] for k, v in got.items()} == expected
    assert seen and all(d.parents is None for _, d in seen)
    assert sched.grammar_stats["tree_drafts_unsupported"] == 1


def test_head_tree_steps_without_their_mask_are_caught(setup, monkeypatch):
    """Mutation: the head's tree steps attending to every frontier so far (not only their ancestors) -- the
    reference tells."""
    from radixlm.runtime.spec import eagle_tree
    from radixlm.runtime.spec.tree import TreeMask

    paths, hf, weights = setup
    monkeypatch.setattr(eagle_tree, "TreeMask", lambda start, mask: TreeMask(start, torch.ones_like(mask)))
    sched = _eagle_tree(paths)
    seen = _record_trees(sched)
    serve(sched, _requests())

    def agrees(tokens, draft) -> bool:
        for i, parent in enumerate(draft.parents):
            path, at = [], parent
            while at >= 0:
                path.insert(0, draft.tokens[at])
                at = draft.parents[at]
            if draft.tokens[i] not in _reference_topk(hf, weights, tokens, path, 3):
                return False
        return True

    assert not all(agrees(t, d) for t, d in seen[:6] if d.parents is not None)


def test_head_pairs_follow_accepted_tree_paths(setup):
    """Oracle trees and the head's drafts by turns: after a verification that kept a path through later siblings,
    the head's pairs were written from the path's rows (the target's hidden states of the accepted nodes), so its
    next trees still equal the reference's."""
    paths, hf, weights = setup
    expected = _off(paths, {}, 0)
    sched = _eagle_tree(paths)
    head = next(s for s in sched.drafts.sources if isinstance(s, EagleSource))
    seen = _record_trees(sched)
    oracle = TreeOracle(expected, every=2)
    sched.drafts = DraftPath([oracle, head], None, sched.page_size, sched.grammar_stats)
    got = serve(sched, _requests())
    assert {k: v["output_ids"] for k, v in got.items()} == expected
    assert sched.stats["tree_kv_moves"] > 0 and len(seen) >= 6
    for tokens, draft in seen:
        for i, parent in enumerate(draft.parents):  # each node is among the head's top 3 after its path
            path = row_tokens(draft.tokens, draft.parents, parent + 1)
            assert draft.tokens[i] in _reference_topk(hf, weights, tokens, path, 3), (tokens, draft)
    sched.check_memory()


def _logprobs(sched, reqs) -> dict[str, list]:
    for r in reqs:
        sched.add_request(r)
    got: dict[str, list] = {}
    while not sched.is_idle():
        for out in sched.step():
            got.setdefault(out.rid, []).extend(out.output_token_logprobs)
    return got


def test_logprobs_of_accepted_paths_equal_those_without_drafts(setup):
    paths, _, _ = setup
    expected = _off(paths, {}, 0)

    def reqs():
        out = _requests()
        for r in out:
            r.return_logprob, r.top_logprobs_num = True, 2
        return out

    off = _logprobs(make({"target": paths["target"]}, None), reqs())
    sched = make({"target": paths["target"]}, None)
    _with_oracle(sched, expected)
    on = _logprobs(sched, reqs())
    assert sched.stats["tree_kv_moves"] > 0 and on.keys() == off.keys()
    for rid in off:
        assert [t for _, t in on[rid]] == [t for _, t in off[rid]] == expected[rid]
        assert torch.allclose(torch.tensor([lp for lp, _ in on[rid]]), torch.tensor([lp for lp, _ in off[rid]]),
                              atol=1e-4)


@pytest.mark.parametrize("n", [3, 6])
def test_a_tree_has_num_draft_tokens_nodes_with_its_root(setup, n):
    """SGLang's count: --speculative-num-draft-tokens N is the verified tree's nodes, the root (the newest token)
    among them, so the head drafts N - 1 nodes (radixlm's old count drafted N)."""
    paths, _, _ = setup
    expected = _off(paths, {}, 0)
    sched = make({"target": paths["target"]}, None, speculative_algorithm="EAGLE",
                 speculative_draft_model_path=paths["head"], speculative_num_draft_tokens=n, speculative_num_steps=3,
                 speculative_eagle_topk=3)
    seen = _record_trees(sched)
    got = serve(sched, _requests())
    assert {k: v["output_ids"] for k, v in got.items()} == expected
    trees = [d for _, d in seen if d.parents is not None]
    assert trees and max(len(d.tokens) for d in trees) == n - 1
    sched.check_memory()
