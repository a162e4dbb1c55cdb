"""Grammar masks on demand for greedy requests. A greedy request's token under a grammar is the argmax over the
allowed tokens; when the model's own argmax is allowed, that is the same token, and checking it costs one
accept_token (microseconds) where filling the mask costs up to milliseconds (free text inside a bounded string).
So a greedy row is decided by its raw argmax; when the grammar refuses it, by the model's next candidates (top-k,
in order), and its mask is filled only when none of them settles the choice.

NOTE invariant: the token chosen for each row equals the argmax of the row's logits with the grammar mask applied
(the eager path): if the raw argmax a is allowed, every token before a has a smaller logit (argmax takes the first
maximum), so the masked argmax is a as well. A candidate c from the top-k (ordered by logit, then token id) that is
the first allowed one is the masked argmax when its logit is above the k-th: then every token scoring at least as
high is a candidate. Exact jump-forward drafts are checked the same way, row by row: a draft token is kept while
the constrained choice equals it."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from radixlm.runtime.host_to_device import HostCopy, host_to_device
from radixlm.runtime.spec.verification import VerifyResult, draft_layout

# The model's top-k tried, in order, when the grammar refuses its argmax. 32, not 16: where SmolLM2 wants whitespace
# that a compact JSON schema refuses (after `{`), the allowed token ranks just below 16; masks filled per token went
# from 0.02 to 0.00 on the H100
# (benchmarks/results/grammar/json_decoding_gpu_json_schema_ab_{base_c4a0435,new_candidates32}.json).
CANDIDATES = 32


@dataclass
class OnDemandRows:
    """A pass's greedy rows whose masks wait for the verdict: per request its last token's row, then one row per
    draft token (no draft: a sampling row). Built at launch; resolved when the pass's results are processed."""

    reqs: list
    drafts: list[list[int]]  # [] for a sampling row
    starts: list[int]  # each request's first row in `logits`
    logits: torch.Tensor  # not the pass's logits buffer (the next pass reuses it): a copy, or rows of its own
    # On the host: the CANDIDATES largest logits per row (descending) and their token ids.
    choices: HostCopy

    def host_lists(self) -> tuple[list[list[float]], list[int], torch.Tensor, torch.Tensor]:
        """Per row its two largest logits and its argmax, as lists (most rows are decided by these); and the host
        tensors of all candidates, turned into lists only for the rows whose argmax the grammar refuses."""
        values, ids = self.choices.get()
        return values.narrow(1, 0, 2).tolist(), ids.select(1, 0).tolist(), values, ids


def launch_on_demand(reqs: list, drafts: list[list[int]], logits: torch.Tensor) -> OnDemandRows:
    """`logits`: len(draft) + 1 rows per request, in order, in a tensor that outlives the pass."""
    top = torch.topk(logits, min(CANDIDATES, logits.shape[-1]), dim=-1)
    return OnDemandRows(reqs, drafts, draft_layout(drafts), logits, HostCopy(top.values.float(), top.indices))


def resolve(rows: OnDemandRows, backend) -> tuple[list[VerifyResult], int]:
    """Each request's verdict, in the order of rows.reqs: the draft tokens kept, then the constrained choice
    after them (tokens == [] when nothing is allowed: violated). Walks all requests a row at a time, so that the
    masks a row needs are filled in one batched call and applied in one device step. Each grammar is left advanced
    over its verdict's tokens. Also returns how many masks were filled."""
    leads, argmaxes, top_values, top_ids = rows.host_lists()
    n = len(rows.reqs)
    grammars, starts, drafts = [r.grammar for r in rows.reqs], rows.starts, rows.drafts
    tokens: list[list[int]] = [[] for _ in range(n)]
    violated = [False] * n
    active, level, filled = list(range(n)), 0, 0
    while active:
        need, still = [], []
        for i in active:
            row, grammar = starts[i] + level, grammars[i]
            lead, token = leads[row], argmaxes[row]  # the argmax when no other token scores as high (the usual case)
            if not (lead[0] > lead[1] and grammar.accept_token(token)):
                token = _first_allowed_candidate(grammar, top_values[row].tolist(), top_ids[row].tolist())
                if token is None:
                    need.append(i)
                    continue
            tokens[i].append(token)
            if _continues(drafts[i], level, token):
                still.append(i)
        if need:
            filled += len(need)
            for i, token in zip(need, _masked_argmax(rows, need, level, backend)):
                if not rows.reqs[i].grammar.accept_token(token):
                    violated[i] = True  # every token is masked
                    continue
                tokens[i].append(token)
                if _continues(rows.drafts[i], level, token):
                    still.append(i)
        active, level = still, level + 1
    verdicts = [VerifyResult(t, len(t) if bad else len(t) - 1, violated=bad) for t, bad in zip(tokens, violated)]
    return verdicts, filled


def _first_allowed_candidate(grammar, values: list[float], ids: list[int]) -> int | None:
    """The masked argmax when the candidates decide it (see the module's invariant), accepted by `grammar`; None
    (grammar unchanged) when they do not."""
    floor = values[-1]
    for value, token in sorted(zip(values, ids), key=lambda c: (-c[0], c[1])):
        if value <= floor:
            return None  # tokens outside the candidates may score as high
        if grammar.accept_token(token):
            return token
    return None


def _continues(draft: list[int], level: int, token: int) -> bool:
    """The constrained choice at this row equals the draft token: the next row decides the next token."""
    return level < len(draft) and draft[level] == token


def _masked_argmax(rows: OnDemandRows, need: list[int], level: int, backend) -> list[int]:
    """On the host: the rows come over (the device is idle by now) and the mask is applied where it was filled.
    Fewer device operations than applying it there, each of which costs the host more than this copy (on the H100
    machine: ~690 us a call with the mask applied on the device, 160-210 us of it filling the mask;
    benchmarks/results/grammar/json_decoding_gpu_json_schema_phases_e7e1c14.json)."""
    bitmask = backend.allocate_bitmask(len(need))
    backend.fill_bitmasks([rows.reqs[i].grammar for i in need], bitmask, list(range(len(need))))
    index = host_to_device([rows.starts[i] + level for i in need], torch.int64, rows.logits.device)
    picked = rows.logits.index_select(0, index).to("cpu")
    backend.apply_bitmask(picked, bitmask, list(range(len(need))))
    return torch.argmax(picked, dim=-1).tolist()
