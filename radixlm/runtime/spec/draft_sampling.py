"""A draft model's tokens for a sampled request: drawn from the draft model's own distribution q, shaped by the
request's temperature, top-k, top-p and min-p as the target's p is, and kept with the token so that verification
can apply speculative sampling's rule (accept with min(1, p/q), else draw from max(0, p - q); verification.py).
Any q keeps the target's distribution; the closer q is to p, the more tokens are kept. Penalties, logit bias and
min_new_tokens shape only p (verification processes its rows as the sampler would)."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from radixlm.runtime.host_to_device import host_to_device
from radixlm.runtime.sampling.sampler import top_k_top_p_min_p_filter
from radixlm.runtime.sampling.sampling_batch_info import SamplingBatchInfo, derive_seed
from radixlm.runtime.sampling.sampling_params import SamplingParams

# Mixed into a seeded request's draft noise: the draft's draws stay independent of the target's and of
# verification's (each has its own salt) at the same output position.
DRAFT_SEED_SALT = 0x2545F4914F6CDD1D


@dataclass
class _Row:
    """What SamplingBatchInfo.from_reqs reads (only the sampling parameters matter for q)."""

    sampling_params: SamplingParams
    origin_input_ids: list[int] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    eos_token_ids: frozenset[int] = frozenset()


@dataclass
class DraftSampling:
    """The drafting requests' sampling parameters (rows in their order); greedy rows take the argmax."""

    info: SamplingBatchInfo
    sampled: list[bool]  # each request's: not greedy
    seeds: list[int | None]  # each sampled request's sampling_seed
    num_out: list[int]  # each request's output tokens before its draft (counting one in flight)

    @classmethod
    def build(cls, params: list[SamplingParams], num_out: list[int], vocab_size: int,
              device: torch.device | str) -> "DraftSampling":
        info = SamplingBatchInfo.from_reqs([_Row(p) for p in params], vocab_size, device)
        return cls(info, [not p.is_greedy for p in params], [None if p.is_greedy else p.sampling_seed for p in params],
                   num_out)

    def sample(self, logits: torch.Tensor, rows: list[int], step: int, generator: torch.Generator | None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft step `step` of requests `rows` (their logits, in that order): (tokens, q), q the distribution
        each token was drawn from (a greedy row: one-hot at its argmax)."""
        info = self._rows(rows)
        probs = torch.softmax(logits.float() / info.temperatures, dim=-1)
        probs = top_k_top_p_min_p_filter(probs, info)
        probs = probs / probs.sum(dim=-1, keepdim=True)
        noise = torch.empty_like(probs).exponential_(generator=generator)
        for n, i in enumerate(rows):
            seed = self.seeds[i]
            if seed is not None:
                g = torch.Generator(device=probs.device)
                g.manual_seed(derive_seed(seed, self.num_out[i] + step) ^ DRAFT_SEED_SALT)
                noise[n] = torch.empty_like(noise[n]).exponential_(generator=g)
        # Exponential race: argmax(q / E), E ~ Exp(1), draws token t with probability q(t).
        sampled = torch.argmax(probs / noise.clamp_min_(torch.finfo(torch.float32).tiny), dim=-1)
        greedy = torch.argmax(logits, dim=-1)
        tokens = torch.where(info.is_greedy, greedy, sampled)
        one_hot = torch.zeros_like(probs).scatter_(1, greedy.unsqueeze(1), 1.0)
        return tokens, torch.where(info.is_greedy.unsqueeze(1), one_hot, probs)

    def _rows(self, rows: list[int]) -> SamplingBatchInfo:
        info = self.info
        if rows == list(range(info.batch_size)):
            return info
        idx = host_to_device(rows, torch.int64, info.device)
        return replace(info, temperatures=info.temperatures[idx], top_ps=info.top_ps[idx], top_ks=info.top_ks[idx],
                       min_ps=info.min_ps[idx], is_greedy=info.is_greedy[idx])
