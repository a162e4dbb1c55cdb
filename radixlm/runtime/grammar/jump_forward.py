"""Jump-forward decoding (the paper's compressed FSM): when the grammar admits exactly one continuation text,
take it without sampling it token by token.

- fast (the paper): the last sampled token and the forced text are retokenized together and appended as they
  are; the next forward pass prefills them at once. Outputs satisfy the grammar but may be tokenized
  differently from token-by-token decoding (what made SGLang drop the feature).
- exact (ours): the forced text's tokens are only a draft. The next forward pass computes logits at the last
  token and at every draft token; a draft token is kept while the model's own constrained choice agrees: equal
  to the constrained argmax (greedy) or accepted with probability p(token) (sampling; the draft is a point
  mass, so this is speculative sampling's rule, and on rejection the token is drawn from p without the draft
  token). Output is the same as without jump-forward under greedy decoding and has the same distribution
  under sampling."""
from __future__ import annotations

from dataclasses import dataclass, field
import torch

from radixlm.runtime.sampling.penalties import apply_penalties_and_bias
from radixlm.runtime.sampling.sampler import top_k_top_p_min_p_filter
from radixlm.runtime.sampling.sampling_batch_info import SamplingBatchInfo, derive_seed



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


@dataclass
class _Virtual:
    """The request as it would be after `accepted` more tokens: what SamplingBatchInfo reads."""

    sampling_params: object
    origin_input_ids: list[int]
    output_ids: list[int]
    eos_token_ids: frozenset[int] = field(default_factory=frozenset)


@dataclass
class VerifyResult:
    tokens: list[int]  # accepted draft tokens, then the model's own token
    accepted: int  # how many of `tokens` came from the draft
    violated: bool = False  # no allowed token at the end (conflicting constraints): the request must abort


def verify_draft(req, draft: list[int], logits: torch.Tensor, backend, generator: torch.Generator | None) -> VerifyResult:
    """`logits` (len(draft) + 1, V): rows at the last token and at each draft token. Advances req.grammar over
    the returned tokens. Row j is processed as the sampler would process it for the request with the first j
    draft tokens appended (penalties, min_new_tokens, grammar mask, temperature, top-k/p, min-p)."""
    sp = req.sampling_params
    out: list[int] = []
    for j in range(len(draft) + 1):
        virtual = _Virtual(sp, req.origin_input_ids, req.output_ids + out, req.eos_token_ids)
        info = SamplingBatchInfo.from_reqs([virtual], logits.shape[-1], logits.device)
        bitmask = backend.allocate_bitmask(1)
        req.grammar.fill_bitmask(bitmask, 0)
        info.vocab_mask, info.vocab_mask_rows, info.apply_vocab_mask = bitmask, [0], backend.apply_bitmask
        row = apply_penalties_and_bias(logits[j : j + 1], info)
        proposal = draft[j] if j < len(draft) else None
        token = _choose(row, info, proposal, req, generator, step=len(req.output_ids) + j)
        if not req.grammar.accept_token(token):
            return VerifyResult(out, j, violated=True)  # every token was masked
        out.append(token)
        if token != proposal:
            return VerifyResult(out, j)
    return VerifyResult(out, len(draft))


def _choose(row: torch.Tensor, info: SamplingBatchInfo, proposal: int | None, req, generator, step: int) -> int:
    if info.is_all_greedy:
        return int(torch.argmax(row, dim=-1))
    probs = torch.softmax(row.float() / info.temperatures, dim=-1)
    probs = top_k_top_p_min_p_filter(probs, info)
    probs = probs / probs.sum(dim=-1, keepdim=True)
    seed = req.sampling_params.sampling_seed
    g = generator
    if seed is not None:
        g = torch.Generator(device=row.device)
        g.manual_seed(derive_seed(seed, step) ^ 0x5BD1E995)
    if proposal is not None:
        if float(torch.rand(1, generator=g, device=row.device)) < float(probs[0, proposal]):
            return proposal
        probs = probs.clone()
        probs[0, proposal] = 0.0
    noise = torch.empty_like(probs).exponential_(generator=g).clamp_min_(torch.finfo(torch.float32).tiny)
    return int(torch.argmax(probs / noise, dim=-1))
