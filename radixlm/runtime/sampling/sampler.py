"""Next-token selection from the last-position logits of a batch."""
from __future__ import annotations

import torch

from radixlm.runtime.kernels.elementwise import argmax_rows
from radixlm.runtime.sampling.penalties import apply_penalties_and_bias
from radixlm.runtime.sampling.sampling_batch_info import SamplingBatchInfo


def top_k_top_p_min_p_filter(probs: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
    """Zero out the probabilities that top_k, then top_p (on the top_k-renormalized distribution), then
    min_p (relative to the row's max) filter away. The result is not renormalized. Row-independent."""
    if not (info.need_top_k or info.need_top_p or info.need_min_p):
        return probs
    removed = torch.zeros_like(probs, dtype=torch.bool)
    if info.need_top_k or info.need_top_p:
        # Stable sort: ties are broken by token id, so a row's result never depends on its batch.
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        ranks = torch.arange(probs.shape[-1], device=probs.device).unsqueeze(0)
        sorted_removed = ranks >= info.top_ks.unsqueeze(1)
        if info.need_top_p:
            kept = sorted_probs.masked_fill(sorted_removed, 0.0)
            cum = kept.cumsum(dim=-1)
            # Keep the smallest prefix whose mass reaches top_p of the top_k mass; the first token always stays.
            # Rows with top_p == 1 are exempt, so float error in the cumsum never drops a tail token.
            over = (cum - kept) >= info.top_ps.unsqueeze(1) * cum[:, -1:]
            sorted_removed |= over & (info.top_ps < 1.0).unsqueeze(1) & (ranks > 0)
        removed.scatter_(1, order, sorted_removed)
    if info.need_min_p:
        row_max = probs.max(dim=-1, keepdim=True).values
        removed |= probs < info.min_ps.unsqueeze(1) * row_max
    return probs.masked_fill(removed, 0.0)


def exponential_noise(
    shape: tuple[int, int], info: SamplingBatchInfo, device: torch.device, generator: torch.Generator | None
) -> torch.Tensor:
    """Exp(1) noise (bs, V). Seeded rows draw from their own generator seeded by (sampling_seed, step), so
    their noise does not depend on the rest of the batch; other rows share `generator` (or torch's default)."""
    bs, vocab = shape
    seeded = {row for row, _ in info.seeded_rows}
    if len(seeded) < bs:
        noise = torch.empty(shape, dtype=torch.float32, device=device).exponential_(generator=generator)
    else:
        noise = torch.empty(shape, dtype=torch.float32, device=device)
    for row, seed in info.seeded_rows:
        g = torch.Generator(device=device)
        g.manual_seed(seed)
        noise[row] = torch.empty(vocab, dtype=torch.float32, device=device).exponential_(generator=g)
    # exponential_ can return exactly 0; dividing by it would give inf/nan. p <= 1 so p / tiny stays finite.
    return noise.clamp_min_(torch.finfo(torch.float32).tiny)


class Sampler:
    def __call__(
        self, logits: torch.Tensor, info: SamplingBatchInfo, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """(bs, V) logits -> (bs,) int64 next token ids. `logits` is not modified."""
        if logits.dim() != 2 or logits.shape[0] != info.batch_size or logits.shape[1] != info.vocab_size:
            raise ValueError(
                f"logits shape {tuple(logits.shape)} does not match batch ({info.batch_size}, {info.vocab_size})"
            )
        if info.use_greedy_fast_path:
            return argmax_rows(logits)
        logits = apply_penalties_and_bias(logits, info)
        greedy_ids = argmax_rows(logits)
        if info.is_all_greedy:
            return greedy_ids
        probs = torch.softmax(logits.float() / info.temperatures, dim=-1)
        probs = top_k_top_p_min_p_filter(probs, info)
        # Exponential race: argmax(p / E) with E ~ Exp(1) i.i.d. picks token i with probability p_i / sum(p).
        noise = exponential_noise(tuple(probs.shape), info, probs.device, generator)
        sampled = torch.argmax(probs / noise, dim=-1)
        return torch.where(info.is_greedy, greedy_ids, sampled)
