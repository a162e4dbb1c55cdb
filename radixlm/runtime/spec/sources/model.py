"""A draft model as a draft source (--speculative-algorithm STANDALONE, SGLang's name): a small model with the
target's tokenizer proposes its continuation (greedy; for a sampled request drawn from its own distribution with the
request's sampling parameters, that distribution kept for verification's rejection sampling), one draft pass per
token, for every drafting request of a
processed pass at once (DraftPath collects them: `deferred`, then propose_batch).

Its KV lives in its own pool over the target's slots (spec/runners/draft_model.py has the invariant). A target pass is
also a draft pass over the same rows (write_kv, via DraftPath.on_launch) when a request of it may draft soon, so
the draft model keeps the KV of every position but the request's newest token, as the target does; a draft starts
from that token. While the batch rule keeps every request from drafting, the draft model runs no pass at all (large
batches pay nothing for it): each request's kv.draft_kv_len stays where its draft KV stops, and before the draft
model runs its rows again, or before it drafts, an extend pass over the positions it lacks catches it up
(_catch_up; as SGLang's draft extend after a prefill, over every missed position). A radix-tree node knows how
much of it has draft KV (TreeNode.draft_kv_len, from the inserting request's cursor): a cache hit on a prefix
written while the draft model was skipped starts its cursor there (Planner), so the catch-up covers the cached
positions too, and marks the tree's nodes it wrote.
Draft lengths follow each request's acceptance history (adaptive_length, spec/adaptive.py) within
--speculative-num-steps, and shrink with the batch (batch_adaptive, DraftPath.draft_cap). An EAGLE head
(EagleSource) drafts the same way; only its KV is written differently (after each pass, spec/runners/eagle.py)."""
from __future__ import annotations

import logging
import weakref
from collections import Counter
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from radixlm.runtime.cache.radix_cache import RadixCache
from radixlm.runtime.cache.radix_node import mark_draft_kv
from radixlm.runtime.spec.runners.draft_model import DraftModelRunner, KVSpan
from radixlm.runtime.spec.runners.eagle import PairSpan
from radixlm.runtime.spec.eagle_tree import propose_tree, table_width
from radixlm.runtime.spec.tree import path_rows
from radixlm.runtime.spec.draft_sampling import DraftSampling
from radixlm.runtime.spec.draft import Draft, DraftSource, DraftTraits
from radixlm.runtime.spec.backoff import Backoff

if TYPE_CHECKING:
    from radixlm.runtime.scheduler.planner import ScheduleBatch
    from radixlm.runtime.scheduler.req import Req

logger = logging.getLogger(__name__)


class DraftModelSource(DraftSource):
    lazy_kv = True  # skips the target's passes while none of their requests may draft, and catches up later

    def __init__(self, runner: DraftModelRunner, stats: Counter, tree: RadixCache | None = None):
        self.runner = runner
        self.max_len = runner.max_steps
        # Its drafts shrink as the batch grows and follow each request's acceptance; it proposes for a pass's
        # requests together. With a pass of the request in flight, its chain starts at the newest known token,
        # whose KV that pass writes (in both pools): the first token guesses the one in flight (DraftPath's note).
        self.traits = DraftTraits(batch_adaptive=True, guesses=True, deferred=True, adaptive_length=True,
                                  max_len=self.max_len, sees_launch=True)
        self.stats = stats
        self.tree = tree if self.lazy_kv else None
        if self.tree is not None:
            self.tree.track_draft_kv = True
        self._backoffs: weakref.WeakKeyDictionary[Req, Backoff] = weakref.WeakKeyDictionary()

    def applies_to(self, req: Req) -> bool:
        return True  # a grammar's request drafts too where jump-forward forces nothing (cut where it refuses)

    def on_launch(self, batch: ScheduleBatch, drafting: bool) -> None:
        """The draft model runs the pass's rows when a request of it may draft soon (`drafting`: the batch rule) or
        the pass verifies a draft of its own; requests whose draft KV stops short of their rows catch up first."""
        wb = batch.worker
        if not (drafting or any(r.kv.draft is not None and r.kv.draft.source is self for r in batch.verifiers)):
            self.stats["draft_model_skipped_passes"] += 1
            return
        self._catch_up(batch.reqs, [min(start, req.seqlen) for req, start in zip(batch.reqs, wb.prefix_lens)])
        self.runner.write_kv(wb)
        self.stats["draft_model_kv_passes"] += 1
        for req, start, end in zip(batch.reqs, wb.prefix_lens, wb.seq_lens):
            if req.kv.draft_kv_len >= start:  # rows start at most at seqlen (a token in flight), where it caught up
                req.kv.draft_kv_len = end

    def _has_kv(self, req: Req) -> bool:
        """Both models hold the KV of every position but the newest token's and no pass of it is in flight; or, for
        a source that guesses, one plain pass is in flight, which writes the newest token's."""
        kv = req.kv
        flying = kv.in_flight if self.traits.guesses else 0
        return (req.req_pool_idx is not None and not req.finished() and kv.in_flight == flying <= 1
                and kv.draft is None and bool(req.output_ids) and kv.committed == req.seqlen - 1 + flying)

    def ready(self, req: Req) -> bool:
        """Whether the request drafts in this step (counts a step of its back-off)."""
        if not self._has_kv(req):
            return False
        backoff = self._backoffs.get(req)
        return backoff is None or not backoff.waiting()

    def propose(self, req: Req) -> None:
        self.propose_batch([req], [None])

    def propose_batch(self, reqs: list[Req], limits: list[int | None]) -> None:
        """Drafts of up to min(limit, --speculative-num-steps, tokens left) tokens for each request (after the guess
        of its token in flight, if one is)."""
        todo, steps = [], []
        context = self.runner.model_config.context_len
        for req, limit in zip(reqs, limits):
            flying = req.kv.in_flight
            k = min(self.max_len, req.tokens_left() - flying, context - req.seqlen - flying)
            if limit is not None:
                k = min(k, limit)
            if k > 0 and self._has_kv(req):
                todo.append(req)
                steps.append(k + flying)
        if not todo:
            return
        self._catch_up(todo, [req.seqlen - 1 for req in todo])
        for req, draft in zip(todo, self._drafts(todo, steps)):
            req.kv.draft = draft
            if req.kv.in_flight:  # the chain's first step wrote the newest token's draft KV at its slot
                req.kv.draft_kv_len = max(req.kv.draft_kv_len, req.seqlen)
        self.stats["model_drafts"] += len(todo)
        self.stats["draft_model_passes"] += max(steps)

    def _catch_up(self, reqs: list[Req], ends: list[int]) -> None:
        """Each request's missing draft KV below ends[i] (positions [kv.draft_kv_len, ends[i]): tokens on the host,
        slots the target wrote or is writing), in extend passes; the tree's nodes on the request's locked path
        learn that their slots have it now."""
        if not self.lazy_kv:
            return
        behind = [(req, end) for req, end in zip(reqs, ends) if req.kv.draft_kv_len < end]
        if not behind:
            return
        spans = [KVSpan(req.req_pool_idx, req.kv.draft_kv_len, _tokens(req, req.kv.draft_kv_len, end))
                 for req, end in behind]
        self.runner.extend_kv(spans)
        self.stats["draft_model_catch_ups"] += len(spans)
        self.stats["draft_model_catch_up_tokens"] += sum(len(s.tokens) for s in spans)
        for req, end in behind:
            req.kv.draft_kv_len = end
            lock = req.cache_lock
            if self.tree is not None and lock is not None and lock.protected_len:
                mark_draft_kv(lock.node, min(end, lock.protected_len))

    def _drafts(self, todo: list[Req], steps: list[int]) -> list[Draft]:
        chains, probs = self._chains(todo, steps)
        return [Draft(tokens, self, q=q) for tokens, q in zip(chains, probs)]

    def _chains(self, todo: list[Req], steps: list[int]) -> tuple[list[list[int]], list[torch.Tensor | None]]:
        """Each request's chain from its newest known token, and for a sampled request the distribution q each of
        its tokens was drawn from (the request's temperature, top-k/p, min-p over the draft model's logits)."""
        sampling = None
        if any(not r.sampling_params.is_greedy for r in todo):
            sampling = DraftSampling.build([r.sampling_params for r in todo], [r.num_output_tokens() for r in todo],
                                           self.runner.vocab_size, self.runner.device)
        return self.runner.propose([r.req_pool_idx for r in todo], [r.output_ids[-1] for r in todo],
                                   [r.seqlen - 1 for r in todo], steps, [r.kv.in_flight == 1 for r in todo], sampling)

    def learn(self, req: Req, draft: Draft, accepted: int, token: int) -> None:
        """A draft rejected outright makes the request back off (1, 2, 4, ... steps without drafts) as lookups do:
        a draft model that keeps missing a request costs its passes for nothing."""
        backoff = self._backoffs.get(req)
        if backoff is None:
            backoff = self._backoffs[req] = Backoff()
        if backoff.learn(accepted):
            self.stats["model_backoffs"] += 1


class EagleSource(DraftModelSource):
    """An EAGLE head (--speculative-algorithm EAGLE, spec/runners/eagle.py): its KV is written after each pass is
    processed, for every request of the pass (on_processed), before the drafts of those that draft.

    With topk > 1 a request drafts a tree (spec/eagle_tree.py) of at most `num_nodes` drafted nodes (ServerArgs.
    max_draft_tokens: --speculative-num-draft-tokens counts the root too, as SGLang's does), verified in one
    pass with a tree mask (greedy: the target's argmax walks it; sampled: its draws do, spec_tree.walk), where it
    has no grammar (masks are walked along chains), the context has room for the tree, and both models' attention
    backends support tree masks (torch_native and Triton do; a backend without them: chains). Other requests draft
    chains."""

    # Its KV of a position is a pair with the target's hidden state there, which only that target pass has: a
    # skipped pass could not be caught up later, so the head writes every pass's.
    lazy_kv = False

    def __init__(self, runner: DraftModelRunner, stats: Counter, steps: int, topk: int = 1, num_nodes: int = 0):
        super().__init__(runner, stats)
        self.max_len = steps
        # Its KV of a pass is written once the pass is processed: it never drafts with one in flight.
        self.traits = replace(self.traits, guesses=False, max_len=steps, sees_processed=True)
        trees = runner.attn_backend.supports_tree_mask and runner.target.attn_backend.supports_tree_mask
        self.topk = topk if trees else 1
        self.num_nodes = num_nodes
        if topk > 1 and not trees:
            stats["tree_drafts_unsupported"] += 1
            logger.warning("--speculative-eagle-topk %d: the attention backend has no tree masks (torch_native and "
                           "triton have them); the EAGLE head drafts chains", topk)

    def _tree_ok(self, req: Req) -> bool:
        # propose_tree points the table at scratch for the deepest tree of the batch: room for the deepest allowed.
        room = max(table_width(self.max_len, self.topk), self.num_nodes) + 1
        return (self.topk > 1 and req.grammar is None
                and req.seqlen + room <= self.runner.model_config.context_len)

    def _drafts(self, todo: list[Req], steps: list[int]) -> list[Draft]:
        flags = [self._tree_ok(r) for r in todo]
        tree = [i for i, f in enumerate(flags) if f]
        chain = [i for i, f in enumerate(flags) if not f]
        out: list[Draft | None] = [None] * len(todo)
        if chain:
            for i, d in zip(chain, super()._drafts([todo[i] for i in chain], [steps[i] for i in chain])):
                out[i] = d
        if tree:
            trees = propose_tree(self.runner, [todo[i].req_pool_idx for i in tree],
                                 [todo[i].seqlen - 1 for i in tree], [steps[i] for i in tree], self.topk,
                                 self.num_nodes)
            for i, (tokens, parents) in zip(tree, trees):
                out[i] = Draft(tokens, self, parents=parents)
            self.stats["tree_drafts"] += len(tree)
        return out

    def on_launch(self, batch: ScheduleBatch, drafting: bool) -> None:
        self.runner.write_kv(batch.worker)

    def _chains(self, todo: list[Req], steps: list[int]) -> tuple[list[list[int]], list[torch.Tensor | None]]:
        """Greedy chains (a sampled request's draft is a point mass, verified by speculative sampling's rule)."""
        chains = self.runner.propose([r.req_pool_idx for r in todo], [r.output_ids[-1] for r in todo],
                                     [r.seqlen - 1 for r in todo], steps)
        return chains, [None] * len(todo)

    def on_processed(self, batch) -> None:
        wb, spans, row = batch.worker, [], 0
        for req, idx, start, n in zip(batch.reqs, wb.req_pool_indices, wb.prefix_lens, wb.extend_lens):
            # Pair i needs token i + 1: up to the newest token (a chunk: its rows, the next prompt token known).
            end = min(start + n, req.seqlen - 1)
            rows = list(range(row, row + n))
            if req.rid in batch.accepted_paths:  # a tree: the rows before it, then the root's and the path's
                nodes, path = batch.accepted_paths[req.rid]
                root = row + n - nodes - 1
                rows = list(range(row, root)) + [root + r for r in path_rows(path)]
            spans.append(PairSpan(idx, start, end, _tokens(req, start + 1, end + 1), rows[: max(end - start, 0)]))
            row += n
        self.runner.catch_up(wb, spans)


def _tokens(req: Req, start: int, end: int) -> list[int]:
    """The request's tokens at positions [start, end) (all on the host)."""
    origin, n_in = req.origin_input_ids, len(req.origin_input_ids)
    if start >= n_in:
        return req.output_ids[start - n_in : end - n_in]
    return origin[start:end] + req.output_ids[: max(end - n_in, 0)]
