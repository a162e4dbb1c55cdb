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
    draft tokens appended (penalties, min_new_tokens, grammar mask, temperature, top-k/p, min-p); all rows are
    processed at once, then settled in order."""
    grammar = req.grammar
    bitmask = backend.allocate_bitmask(len(draft) + 1)
    walked = 0  # draft tokens the matcher accepted while filling the rows' masks
    for j in range(len(draft) + 1):
        grammar.fill_bitmask(bitmask, j)
        if j == len(draft) or not grammar.accept_token(draft[j]):
            break
        walked += 1
    draft = draft[:walked]  # a token the grammar refuses could never be chosen: the draft ends before it
    rows = len(draft) + 1
    virtuals = [_Virtual(req.sampling_params, req.origin_input_ids, req.output_ids + draft[:j], req.eos_token_ids)
                for j in range(rows)]
    info = SamplingBatchInfo.from_reqs(virtuals, logits.shape[-1], logits.device)
    info.vocab_mask, info.vocab_mask_rows, info.apply_vocab_mask = bitmask, list(range(rows)), backend.apply_bitmask
    processed = apply_penalties_and_bias(logits[:rows], info)
    kept, token = _settle(processed, info, draft, req, generator)
    grammar.rollback(walked - kept)
    if not grammar.accept_token(token):
        return VerifyResult(draft[:kept], kept, violated=True)  # every token was masked
    return VerifyResult(draft[:kept] + [token], kept)


def _settle(processed: torch.Tensor, info: SamplingBatchInfo, draft: list[int], req, generator) -> tuple[int, int]:
    """How many draft tokens are kept, and the token after them (the model's own choice)."""
    if info.is_all_greedy:
        choices = torch.argmax(processed, dim=-1).tolist()
        kept = 0
        while kept < len(draft) and choices[kept] == draft[kept]:
            kept += 1
        return kept, choices[kept]
    probs = torch.softmax(processed.float() / info.temperatures, dim=-1)
    probs = top_k_top_p_min_p_filter(probs, info)
    probs = probs / probs.sum(dim=-1, keepdim=True)
    g = generator
    if req.sampling_params.sampling_seed is not None:
        g = torch.Generator(device=probs.device)
        g.manual_seed(derive_seed(req.sampling_params.sampling_seed, len(req.output_ids)) ^ 0x5BD1E995)
    uniforms = torch.rand(len(draft), generator=g, device=probs.device).tolist()
    dev = probs.device
    p_draft = probs[torch.arange(len(draft), device=dev), torch.tensor(draft, dtype=torch.long, device=dev)].tolist()
    kept = 0
    while kept < len(draft) and uniforms[kept] < p_draft[kept]:
        kept += 1
    row = probs[kept : kept + 1].clone()
    if kept < len(draft):
        row[0, draft[kept]] = 0.0  # rejected: draw from p without the draft token
    noise = torch.empty_like(row).exponential_(generator=g).clamp_min_(torch.finfo(torch.float32).tiny)
    return kept, int(torch.argmax(row / noise, dim=-1))
