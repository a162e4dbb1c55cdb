"""The host's part in choosing a pass's tokens: grammar masks and draft verification, per pass, keyed by row.

At launch (while the device runs the pass): a greedy row under a grammar keeps its logits for a verdict on demand
(radixlm.runtime.grammar.on_demand); other grammar rows get their masks filled now (a sampling row's mask goes to
the sampler), and drafts that are not decided on demand get their verification built
(radixlm.runtime.spec.verification). When the pass is processed: the on-demand rows are resolved, then each
request's verdict is read by its index among the pass's samplers or verifiers."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import torch

from radixlm.runtime.grammar.backend import GrammarBackend
from radixlm.runtime.grammar.jump_forward import fill_draft_masks
from radixlm.runtime.grammar.on_demand import OnDemandRows, launch_on_demand, resolve
from radixlm.runtime.host_to_device import host_to_device
from radixlm.runtime.sampling.sampling_batch_info import SamplingBatchInfo
from radixlm.runtime.spec.verification import (DraftVerification, VerifyResult, build_verification, draft_layout,
                                                   plain_greedy, settle)
from radixlm.runtime.scheduler.req import Req


@dataclass
class PassMasks:
    """A pass's masks and verdicts, set by MaskPlanner.prepare at launch and read when the pass is processed. Slots
    map a sampler's or verifier's index in the pass to its entry in `on_demand` (a verdict) or `verification`."""

    sampler_verdict: dict[int, int] = field(default_factory=dict)  # sampler index -> index in verdicts
    verifier_verdict: dict[int, int] = field(default_factory=dict)  # verifier index -> index in verdicts
    verifier_eager: dict[int, int] = field(default_factory=dict)  # verifier index -> index in verification
    on_demand: OnDemandRows | None = None  # greedy grammar rows: masks filled only where the grammar refuses the argmax
    verification: DraftVerification | None = None  # drafts whose masks were filled at launch
    verdicts: list[VerifyResult] = field(default_factory=list)  # the on-demand rows' verdicts, set by resolve


class MaskPlanner:
    def __init__(self, backend: Callable[[], GrammarBackend], mask_on_demand: bool, stats: Counter):
        """backend: returns the grammar backend (built at the first compilation)."""
        self._backend = backend
        self.mask_on_demand = mask_on_demand
        self.stats = stats

    @property
    def backend(self) -> GrammarBackend:
        return self._backend()

    def on_demand(self, req: Req) -> bool:
        return self.mask_on_demand and req.grammar is not None and plain_greedy(req)

    def on_demand_rows(self, samplers: list[Req]) -> list[bool]:
        """Per sampling row: its token will be decided by a verdict (its grammar's mask on demand). When all are, the
        pass needs no sampler."""
        if not self.mask_on_demand:
            return [False] * len(samplers)
        return [self.on_demand(r) for r in samplers]

    def prepare(self, samplers: list[Req], lazy: list[bool], logits: torch.Tensor | None,
                info: SamplingBatchInfo | None, verifiers: list[Req], verify_logits: torch.Tensor | None,
                both: torch.Tensor | None = None) -> PassMasks | None:
        """lazy: on_demand_rows(samplers). both: `logits` then `verify_logits` in one tensor of the pass's own
        (LogitsOutput.rows), if there is one."""
        sampled = [i for i, r in enumerate(samplers) if r.grammar is not None]
        if not sampled and not verifiers:
            return None
        drafts = [r.kv.draft.tokens for r in verifiers]
        verify_rows = [list(range(o, o + len(d) + 1)) for o, d in zip(draft_layout(drafts), drafts)]
        lazy_s, eager_s = _split(sampled, [lazy[i] for i in sampled])
        lazy_v, eager_v = _split(range(len(verifiers)), [self.on_demand(r) for r in verifiers])
        pm = PassMasks()
        if lazy_s or lazy_v:
            if both is not None and len(lazy_s) == len(samplers) and len(lazy_v) == len(verifiers):
                kept = both  # every row is on demand, and the tensor outlives the pass: no copy
            else:
                # torch.cat copies: the pass's logits buffer is reused by the next pass.
                parts = [logits if len(lazy_s) == len(samplers) else _rows(logits, lazy_s)] if lazy_s else []
                if lazy_v:
                    parts.append(verify_logits if len(lazy_v) == len(verifiers)
                                 else _rows(verify_logits, [j for k in lazy_v for j in verify_rows[k]]))
                kept = torch.cat(parts)
            pm.on_demand = launch_on_demand([samplers[i] for i in lazy_s] + [verifiers[k] for k in lazy_v],
                                            [[] for _ in lazy_s] + [drafts[k] for k in lazy_v], kept)
            pm.sampler_verdict = {i: n for n, i in enumerate(lazy_s)}
            pm.verifier_verdict = {k: len(lazy_s) + n for n, k in enumerate(lazy_v)}
        if eager_s or eager_v:
            self._prepare_eager(pm, samplers, eager_s, info, [verifiers[k] for k in eager_v],
                                [drafts[k] for k in eager_v], verify_logits, verify_rows, eager_v, len(verifiers))
        return pm

    def _prepare_eager(self, pm: PassMasks, samplers: list[Req], eager_s: list[int], info: SamplingBatchInfo | None,
                       reqs: list[Req], drafts: list[list[int]], verify_logits: torch.Tensor | None,
                       verify_rows: list[list[int]], eager_v: list[int], num_verifiers: int) -> None:
        """Masks filled now: the sampling rows' go to the sampler; the drafts' into their verification."""
        masked = eager_s or any(r.grammar is not None for r in reqs)
        backend = self.backend if masked else None
        layout = draft_layout(drafts, first_row=len(samplers))
        bitmask = None
        if backend is not None:
            bitmask = backend.allocate_bitmask(len(samplers) + sum(len(d) + 1 for d in drafts))
            walked = fill_draft_masks(reqs, drafts, layout, bitmask, backend,
                                      also=[(samplers[i].grammar, i) for i in eager_s])
            self.stats["masks_filled"] += sum(w + 1 for r, w in zip(reqs, walked) if r.grammar is not None)
            self.stats["masks_filled"] += len(eager_s)
        else:
            walked = [len(d) for d in drafts]
        if eager_s:
            info.vocab_mask, info.vocab_mask_rows = bitmask[: len(samplers)], eager_s
            info.apply_vocab_mask = backend.apply_bitmask
        if reqs:
            if len(reqs) < num_verifiers:
                verify_logits = _rows(verify_logits, [j for k in eager_v for j in verify_rows[k]])
            pm.verification = build_verification(reqs, drafts, walked, layout, bitmask, verify_logits,
                                                 backend.apply_bitmask if backend is not None else None,
                                                 [r.kv.draft.guess for r in reqs], [r.kv.draft.q for r in reqs],
                                                 [r.kv.draft.parents for r in reqs])
            pm.verifier_eager = {k: n for n, k in enumerate(eager_v)}

    def resolve(self, pm: PassMasks | None) -> None:
        """When the pass's results are processed, before its tokens are taken: decide the on-demand rows (their
        grammars are advanced over the tokens decided)."""
        if pm is not None and pm.on_demand is not None:
            pm.verdicts, filled = resolve(pm.on_demand, self.backend)
            self.stats["masks_filled"] += filled

    @staticmethod
    def sampler_verdicts(pm: PassMasks | None, num_samplers: int) -> list[VerifyResult | None]:
        """Each sampler's on-demand verdict (its grammar already advanced over it), where its row had one."""
        out: list[VerifyResult | None] = [None] * num_samplers
        if pm is not None:
            for i, n in pm.sampler_verdict.items():
                out[i] = pm.verdicts[n]
        return out

    def verifier_verdict(self, pm: PassMasks, k: int, generator: torch.Generator | None) -> VerifyResult:
        """Verifier k's draft tokens kept and its next token; its grammar (if any) is advanced over them."""
        n = pm.verifier_verdict.get(k)
        if n is not None:
            return pm.verdicts[n]
        return settle(pm.verification, pm.verifier_eager[k], generator)


def _split(items, flags: list[bool]) -> tuple[list, list]:
    """(items whose flag is set, the others)."""
    yes, no = [], []
    for item, flag in zip(items, flags):
        (yes if flag else no).append(item)
    return yes, no


def _rows(logits: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """A copy of some rows."""
    return logits.index_select(0, host_to_device(rows, torch.int64, logits.device))
