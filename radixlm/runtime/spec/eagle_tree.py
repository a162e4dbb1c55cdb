"""EAGLE tree drafts (--speculative-eagle-topk K > 1, SGLang's expansion): the head's last output gives the root's K
likeliest children; each later step runs the head over the frontier (K nodes a request, one head pass for all
requests) and scores the K children of every frontier node by cumulative log-probability: all K * K become
candidates, the best K the next frontier. The best --speculative-num-draft-tokens - 1 candidates form the draft
(spec_tree.TreeBuild.select): SGLang's count of the verified tree's nodes includes the root, the newest token.

A frontier node's pair is (its parent's output, its token) at position (newest token's) + depth - 1, as a chain
step's; its KV goes to the request row's scratch slot (step - 1) * K + f, which the table points at from index
(newest token's position) + (step - 1) * K + f on, and it attends to the request's head KV before that index and to
its ancestors' scratch slots only (a TreeMask), so no step sees another branch. Head passes run eagerly (REQUEST_SPANS
with masks; a backend without supports_tree_mask gets chains instead, spec/sources/model.py); each step reads its frontier's
tokens on the host (a pass's rows are host lists), the tree is assembled from one read of every step's candidates."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from radixlm.runtime.executor.forward_batch import ForwardMode, ModelWorkerBatch
from radixlm.runtime.executor.logits import LogitsPlan
from radixlm.runtime.spec.tree import TreeBuild, TreeMask
from radixlm.runtime.host_to_device import HostCopy, host_to_device

if TYPE_CHECKING:
    from radixlm.runtime.spec.runners.eagle import EagleRunner


def table_width(steps: int, topk: int) -> int:
    """Request-table entries past the newest token's position that a tree of `steps` steps points at scratch."""
    return max(steps - 1, 0) * topk


@torch.inference_mode()
def propose_tree(runner: "EagleRunner", rows: list[int], positions: list[int], steps: list[int], topk: int,
                 num_nodes: int) -> list[tuple[list[int], list[int]]]:
    """(tokens, parents) of each request row's tree (at most steps[i] deep, num_nodes nodes), from its last catch-up
    output; its newest token is at positions[i]."""
    n, k, n_steps = len(rows), topk, max(steps, default=0)
    if not n_steps:
        return [([], []) for _ in rows]
    dev = runner.device
    model, target_logits = runner.model, runner.logits_processor.logits
    runner.point_at_scratch(rows, positions, [table_width(n_steps, k)] * n)
    out = runner._last_out[host_to_device(rows, torch.int64, dev)]
    logp, tokens = model.draft_topk(out, target_logits, k)  # (n, K): the root's children, the first frontier
    scores = logp
    features = out.repeat_interleave(k, dim=0)  # each frontier node's parent's output
    # Per frontier node, the scratch columns (of n_steps * K) it sees: its ancestors' and its own.
    seen = torch.zeros(n, k, max(n_steps - 1, 1) * k, dtype=torch.bool, device=dev)
    # Host-side record per step: (tokens, scores) of the candidates, and the frontier's picks among them.
    record: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = [(tokens, scores, None)]
    frontier_tokens = tokens
    for step in range(1, n_steps):
        col = (step - 1) * k
        seen[:, :, col : col + k] |= torch.eye(k, dtype=torch.bool, device=dev)
        masks = [TreeMask(p, seen[i, :, : col + k].clone()) for i, p in enumerate(positions)]
        wb = ModelWorkerBatch(
            input_ids=frontier_tokens.reshape(-1).tolist(), positions=[p + step - 1 for p in positions for _ in range(k)],
            req_pool_indices=rows, prefix_lens=[p + col for p in positions], extend_lens=[k] * n,
            seq_lens=[p + col + k for p in positions],
            out_cache_loc=host_to_device([runner.scratch_slot(r, col + f) for r in rows for f in range(k)],
                                         torch.int64, dev),
            logits=LogitsPlan(), tree_masks=masks)
        out = runner._head(wb, ForwardMode.REQUEST_SPANS, features)
        logp, child = model.draft_topk(out, target_logits, k)  # (n * K, K)
        cand = (scores.reshape(n, k, 1) + logp.reshape(n, k, k)).reshape(n, k * k)
        scores, pick = cand.topk(k, dim=-1)  # the next frontier, among the K * K candidates
        parent = pick // k
        record.append((child.reshape(n, k * k), cand, pick))
        frontier_tokens = torch.gather(child.reshape(n, k * k), 1, pick)
        batch_rows = torch.arange(n, device=dev)[:, None]
        features = out.reshape(n, k, -1)[batch_rows, parent].reshape(n * k, -1)
        seen = seen[batch_rows, parent]
    got = HostCopy(*[t for rec in record for t in rec if t is not None]).get()
    return [_tree(got, i, k, steps[i], num_nodes) for i in range(n)]


def _tree(got: list[torch.Tensor], i: int, k: int, steps: int, num_nodes: int) -> tuple[list[int], list[int]]:
    """Request i's tree from the host copy of every step's (tokens, scores[, picks])."""
    tokens, scores = got[0][i].tolist(), got[1][i].tolist()
    build = TreeBuild(list(tokens), [-1] * k, list(scores))
    frontier = list(range(k))
    at = 2
    for _ in range(1, steps):
        child, cand, pick = got[at][i].tolist(), got[at + 1][i].tolist(), got[at + 2][i].tolist()
        at += 3
        first = len(build.tokens)
        for c in range(k * k):
            build.tokens.append(child[c])
            build.parents.append(frontier[c // k])
            build.scores.append(cand[c])
        frontier = [first + c for c in pick]
    return build.select(num_nodes)
