"""Logit processing that runs before greedy argmax / temperature: logit_bias, penalties, min_new_tokens, grammar,
forced tokens."""
from __future__ import annotations

import torch

from radixlm.runtime.sampling.sampling_batch_info import SamplingBatchInfo


def apply_penalties_and_bias(logits: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
    """Return processed float32 logits (bs, V); `logits` itself is never modified (it is returned as-is when
    there is nothing to apply). Order: logit_bias -> repetition penalty (HF: over prompt + output tokens,
    positive logits divided, negative multiplied) -> frequency/presence (OpenAI: over output tokens,
    `logit -= freq * count + presence * (count > 0)`) -> min_new_tokens mask (-inf) -> grammar mask (-inf) -> forced
    tokens (a row keeps one token: a thinking budget's)."""
    if not info.need_logits_processing:
        return logits
    out = logits.to(torch.float32, copy=True)
    if info.logit_bias_rows is not None:
        out.index_put_((info.logit_bias_rows, info.logit_bias_cols), info.logit_bias_values, accumulate=True)
    if info.repetition_penalties is not None:
        pen = info.repetition_penalties
        penalized = torch.where(out > 0, out / pen, out * pen)
        out = torch.where(info.seen_mask, penalized, out)
    if info.output_counts is not None:
        counts = info.output_counts
        out = out - info.frequency_penalties * counts - info.presence_penalties * (counts > 0).to(out.dtype)
    if info.min_tokens_rows is not None:
        # A device scalar: assigning a Python float through advanced indexing waits for the device on CUDA.
        out.index_put_((info.min_tokens_rows, info.min_tokens_cols), out.new_full((), float("-inf")))
    if info.vocab_mask is not None:
        info.apply_vocab_mask(out, info.vocab_mask, info.vocab_mask_rows)
    if info.forced_rows is not None:
        # Last, so the forced token wins over every other rule (a grammar that refuses it then fails the request).
        out.index_fill_(0, info.forced_rows, float("-inf"))
        out.index_put_((info.forced_rows, info.forced_cols), out.new_zeros(()))
    return out
