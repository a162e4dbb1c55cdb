"""Jump-forward decoding (the paper's compressed FSM): when the grammar admits exactly one continuation text,
take it without sampling it token by token.

- fast (the paper): the last sampled token and the forced text are retokenized together and appended as they
  are; the next forward pass prefills them at once. Outputs satisfy the grammar but may be tokenized
  differently from token-by-token decoding (what made SGLang drop the feature).
- exact (ours): the forced text's tokens are only a draft, verified by the next pass
  (radixlm.runtime.spec.verification) with each row's grammar mask: greedy output is the same as without
  jump-forward, and sampled output has the same distribution.

This module holds the grammar's side: the forced text's tokens and the draft rows' masks."""
from __future__ import annotations

from typing import Sequence

import torch

from radixlm.runtime.spec.verification import (DraftVerification, VerifyResult, build_verification, draft_layout,
                                                   settle)


def forced_tokens(tokenizer, last_token: int, forced: str) -> tuple[list[int], bool]:
    """Tokens for the forced text after `last_token`. The pair is retokenized as one text so the boundary is
    tokenized canonically; returns (tokens, replaces_last): when replaces_last, the tokens stand for
    last_token + forced (the retokenization merged across the boundary), else they follow last_token."""
    joined = tokenizer.encode(tokenizer.decode([last_token]) + forced, add_special_tokens=False)
    if joined and joined[0] == last_token:
        return joined[1:], False
    if tokenizer.decode(joined) == tokenizer.decode([last_token]) + forced:
        return joined, True
    return tokenizer.encode(forced, add_special_tokens=False), False


def fill_draft_masks(reqs, drafts, layout, bitmask, backend, also: Sequence[tuple[object, int]] = ()) -> list[int]:
    """Walk each grammar along its draft, filling the mask row of every position; returns how many draft tokens each
    grammar accepted (a request without a grammar: its whole draft, its rows left all allowed), and leaves the
    grammars as they were. Inside forced text a mask takes microseconds: those are filled one matcher at a time.
    Where a walk went through its whole draft the text is usually free again and the mask costly: those rows, with
    the (matcher, row) pairs in `also`, are filled in one batched call."""
    walked = [0 if r.grammar is not None else len(d) for r, d in zip(reqs, drafts)]
    active = [i for i, d in enumerate(drafts) if d and reqs[i].grammar is not None]
    level = 0
    while active:
        for i in active:
            reqs[i].grammar.fill_bitmask(bitmask, layout[i] + level)
        still = []
        for i in active:
            if reqs[i].grammar.accept_token(drafts[i][level]):
                walked[i] += 1
                if walked[i] < len(drafts[i]):
                    still.append(i)
        active, level = still, level + 1
    fills = [(r.grammar, layout[i] + walked[i]) for i, (r, d) in enumerate(zip(reqs, drafts))
             if r.grammar is not None and walked[i] == len(d)]
    fills += also
    if fills:
        backend.fill_bitmasks([m for m, _ in fills], bitmask, [row for _, row in fills])
    for r, w in zip(reqs, walked):
        if r.grammar is not None:
            r.grammar.rollback(w)
    return walked


def prepare_verification(reqs: list, drafts: list[list[int]], logits: torch.Tensor, backend) -> DraftVerification:
    """fill_draft_masks, then build_verification; the grammars are left as they were."""
    layout = draft_layout(drafts)
    bitmask = backend.allocate_bitmask(sum(len(d) + 1 for d in drafts))
    walked = fill_draft_masks(reqs, drafts, layout, bitmask, backend)
    return build_verification(reqs, drafts, walked, layout, bitmask, logits, backend.apply_bitmask)


def verify_draft(req, draft: list[int], logits: torch.Tensor, backend, generator: torch.Generator | None) -> VerifyResult:
    """One request's draft against its len(draft) + 1 logits rows."""
    return settle(prepare_verification([req], [draft], logits, backend), 0, generator)
