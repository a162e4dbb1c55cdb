"""Draft verification: a pass computed logits at a request's last token and at each of its draft tokens; keep the
draft's tokens while the model's own choice agrees, then take the model's token.

- greedy: a draft token is kept while it equals the argmax of its row, processed as the sampler would process it
  (penalties, logit bias, min_new_tokens, the grammar mask, a thinking budget's forced tokens): the output is the same
  as without the draft.
- sampling: speculative sampling's rule. A draft token x drawn from a distribution q (a draft model sampling
  with the request's parameters) is kept with probability min(1, p(x) / q(x)), and on rejection the token is drawn
  from max(0, p - q) normalized; a draft without q is a point mass (lookups, greedy chains): kept with probability
  p(x), else drawn from p without x. Either way each output token has the distribution it has without the draft.
- a draft made while the token before it was in flight (overlap) continues a guess of that token: where the guess
  was wrong, none of its tokens is kept and the model's token at the in-flight position is taken as without a
  draft (sampled from p whole: nothing was rejected by the rule)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from radixlm.runtime.spec.tree import row_tokens, walk
from radixlm.runtime.host_to_device import HostCopy, host_to_device
from radixlm.runtime.sampling.penalties import apply_penalties_and_bias
from radixlm.runtime.sampling.sampler import top_k_top_p_min_p_filter
from radixlm.runtime.sampling.sampling_batch_info import SamplingBatchInfo, derive_seed
from radixlm.runtime.sampling.sampling_params import SamplingParams


@dataclass
class _Virtual:
    """The request as it would be after `accepted` more tokens: what SamplingBatchInfo reads."""

    sampling_params: SamplingParams
    origin_input_ids: list[int]
    output_ids: list[int]
    eos_token_ids: frozenset[int] = field(default_factory=frozenset)
    thinking: Any = None  # the request's ThinkingTracker: it scans the virtual output past the known tokens


@dataclass
class VerifyResult:
    tokens: list[int]  # accepted draft tokens, then the model's own token
    accepted: int  # how many of `tokens` came from the draft
    violated: bool = False  # no allowed token at the end (conflicting constraints): the request must abort
    path: list[int] | None = None  # a tree draft's accepted nodes (spec/tree.py), root to leaf


@dataclass
class DraftVerification:
    """A pass's drafts checked against its logits. Built when the pass is launched (the masks are filled while the
    device runs it); each request is then settled in order."""

    reqs: list
    drafts: list[list[int]]  # cut before the first token its grammar refuses
    starts: list[int]  # first row of each request in `processed`
    processed: torch.Tensor  # rows after penalties, logit bias and the grammar mask
    choices: HostCopy  # processed argmax per row
    probs: torch.Tensor | None  # sampling distribution per row, when some request samples
    guesses: list[tuple[int, int] | None] = field(default_factory=list)  # Draft.guess per request, if any
    draft_probs: list[torch.Tensor | None] = field(default_factory=list)  # Draft.q per request, if any
    parents: list[list[int] | None] = field(default_factory=list)  # Draft.parents per request (trees), if any

    def choice_list(self) -> list[int]:
        return self.choices.get()[0].tolist()


def draft_layout(drafts: list[list[int]], first_row: int = 0) -> list[int]:
    """Each request's first row: len(draft) + 1 rows per request (its last token, then each draft token)."""
    layout, n = [], first_row
    for d in drafts:
        layout.append(n)
        n += len(d) + 1
    return layout


def plain_greedy(req) -> bool:
    """Greedy with nothing but a grammar shaping the logits (no penalty, bias, min_new_tokens mask or thinking budget
    that may still force a token)."""
    p, thinking = req.sampling_params, getattr(req, "thinking", None)
    return (p.is_greedy and not p.logit_bias and p.repetition_penalty == 1.0 and p.frequency_penalty == 0.0
            and p.presence_penalty == 0.0 and len(req.output_ids) >= p.min_new_tokens
            and (thinking is None or thinking.done))


def build_verification(reqs, drafts: list[list[int]], walked: list[int], layout: list[int],
                       bitmask: torch.Tensor | None, logits: torch.Tensor,
                       apply_bitmask: Callable[[torch.Tensor, torch.Tensor, list[int]], None] | None,
                       guesses: list[tuple[int, int] | None] | None = None,
                       draft_probs: list[torch.Tensor | None] | None = None,
                       parents: list[list[int] | None] | None = None) -> DraftVerification:
    """`logits`: for each request in order, len(draft) + 1 rows (at its last token and at each draft token). Drafts
    are cut to `walked` tokens (what their grammar accepts); `bitmask` (rows at `layout`, None without grammars)
    holds their masks. Row j of a request is processed as the sampler would process it for the request with its
    first j draft tokens appended (penalties, min_new_tokens, grammar mask, temperature, top-k/p, min-p), after the
    token in flight where a draft continues one (`guesses`: (position, guessed token) or None per request; only the
    output's length is read where a pass was in flight: such requests have no penalty). draft_probs: each draft's
    q rows (Draft.q), or None. parents: each draft's Draft.parents (a tree, without a grammar: a row's request is
    the one with the node's path appended), or None."""
    drafts = [d[:w] for d, w in zip(drafts, walked)]
    guesses = guesses or [None] * len(drafts)
    mask_rows = [o + j for o, d in zip(layout, drafts) for j in range(len(d) + 1)]
    logit_rows = [o - layout[0] + j for o, d in zip(layout, drafts) for j in range(len(d) + 1)]
    starts = draft_layout(drafts)
    masked_rows = bitmask[mask_rows] if bitmask is not None else None
    gathered = logit_rows != list(range(logits.shape[0]))
    if gathered:
        logits = logits[host_to_device(logit_rows, torch.int64, logits.device)]
    if all(plain_greedy(r) for r in reqs):
        # Nothing but the grammar mask shapes these rows: no per-row sampling state to build. (The caller's
        # logits stay raw: logprobs are read from them.)
        info, processed = None, logits if gathered else logits.clone()
        if masked_rows is not None:
            apply_bitmask(processed, masked_rows, list(range(len(mask_rows))))
    else:
        parents_of = parents or [None] * len(drafts)
        virtuals = [_Virtual(r.sampling_params, r.origin_input_ids, r.output_ids + ([g[1]] if g else [])
                             + (d[:j] if ps is None else row_tokens(d, ps, j)), r.eos_token_ids,
                             getattr(r, "thinking", None))
                    for r, d, g, ps in zip(reqs, drafts, guesses, parents_of) for j in range(len(d) + 1)]
        info = SamplingBatchInfo.from_reqs(virtuals, logits.shape[-1], logits.device)
        if masked_rows is not None:
            info.vocab_mask, info.vocab_mask_rows, info.apply_vocab_mask = (masked_rows, list(range(len(mask_rows))),
                                                                            apply_bitmask)
        processed = apply_penalties_and_bias(logits, info)
    choices = torch.argmax(processed, dim=-1)
    probs = None
    if info is not None and not info.is_all_greedy:
        probs = torch.softmax(processed.float() / info.temperatures, dim=-1)
        probs = top_k_top_p_min_p_filter(probs, info)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return DraftVerification(reqs, drafts, starts, processed, HostCopy(choices), probs, guesses,
                             draft_probs or [None] * len(drafts), parents or [None] * len(drafts))


def settle(v: DraftVerification, i: int, generator: torch.Generator | None) -> VerifyResult:
    """Request i's verdict; advances its grammar (if it has one) over the returned tokens."""
    req, draft, start = v.reqs[i], v.drafts[i], v.starts[i]
    guess = v.guesses[i] if v.guesses else None
    if guess is not None and req.token_at(guess[0]) != guess[1]:
        draft = []  # it continued another token than the one the pass read: only the in-flight row's logits count
    parents = v.parents[i] if v.parents else None
    if parents is not None:
        if req.sampling_params.is_greedy:
            choose = v.choice_list()[start : start + len(draft) + 1].__getitem__
        else:
            rows, g = v.probs[start : start + len(draft) + 1], _generator(req, generator, v.probs.device)
            choose = lambda row: _draw(rows[row : row + 1], g)  # noqa: E731 - drawn only at the nodes reached
        path, token = walk(parents, draft, choose)
        return VerifyResult([draft[n] for n in path] + [token], len(path), path=path)
    if req.sampling_params.is_greedy:
        choices = v.choice_list()[start : start + len(draft) + 1]
        kept = 0
        while kept < len(draft) and choices[kept] == draft[kept]:
            kept += 1
        token = choices[kept]
    else:
        q = v.draft_probs[i] if v.draft_probs and draft else None
        kept, token = _settle_sampled(v.probs[start : start + len(draft) + 1], draft, req, generator, q)
    grammar = req.grammar
    if grammar is not None:
        for t in draft[:kept]:
            grammar.accept_token(t)
        if not grammar.accept_token(token):
            return VerifyResult(draft[:kept], kept, violated=True)  # every token was masked
    return VerifyResult(draft[:kept] + [token], kept)


def _settle_sampled(probs: torch.Tensor, draft: list[int], req, generator,
                    q: torch.Tensor | None = None) -> tuple[int, int]:
    """Speculative sampling: how many draft tokens are kept, and the token after them. q: the distributions the
    draft tokens were drawn from (rows aligned with `draft`, over at most p's vocabulary); None: point masses."""
    g = _generator(req, generator, probs.device)
    uniforms = torch.rand(len(draft), generator=g, device=probs.device).tolist()
    dev = probs.device
    rows = torch.arange(len(draft), device=dev)
    ids = torch.tensor(draft, dtype=torch.long, device=dev)
    if q is not None:
        q = torch.nn.functional.pad(q[: len(draft)].to(probs.dtype), (0, probs.shape[-1] - q.shape[-1]))
        ratios = (probs[rows, ids] / q[rows, ids].clamp_min(torch.finfo(torch.float32).tiny)).tolist()
    else:
        ratios = probs[rows, ids].tolist()
    kept = 0
    while kept < len(draft) and uniforms[kept] < ratios[kept]:
        kept += 1
    row = probs[kept : kept + 1].clone()
    if kept < len(draft):  # rejected: draw from the residual max(0, p - q)
        if q is None:
            row[0, draft[kept]] = 0.0
        else:
            residual = (row - q[kept : kept + 1]).clamp_min_(0.0)
            if float(residual.sum()) > 0.0:  # else p <= q everywhere (p == q up to rounding): p itself
                row = residual
    return kept, _draw(row, g)


def _generator(req, generator: torch.Generator | None, device) -> torch.Generator | None:
    """A seeded request's own generator for this verdict (its seed and output length), else the scheduler's."""
    if req.sampling_params.sampling_seed is None:
        return generator
    g = torch.Generator(device=device)
    g.manual_seed(derive_seed(req.sampling_params.sampling_seed, len(req.output_ids)) ^ 0x5BD1E995)
    return g


def _draw(row: torch.Tensor, g: torch.Generator | None) -> int:
    """A token drawn from the (1, vocab) distribution `row` (exponential race)."""
    noise = torch.empty_like(row).exponential_(generator=g).clamp_min_(torch.finfo(torch.float32).tiny)
    return int(torch.argmax(row / noise, dim=-1))
