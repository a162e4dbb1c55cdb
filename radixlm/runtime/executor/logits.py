"""Logits only where they are needed: the last row of each request that samples, plus the rows whose
prompt logprobs were asked for. Logprobs are those of the model's raw distribution (log_softmax of the
logits before penalties, temperature and filtering), as OpenAI and vLLM report them."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from radixlm.runtime.distributed.parallel import SINGLE, Parallel
from radixlm.runtime.executor.forward_batch import ForwardMode
from radixlm.runtime.executor.pooler import PoolSpan
from radixlm.runtime.host_to_device import host_to_device
from radixlm.runtime.kernels import gemm


INPUT_LOGPROB_CHUNK_ROWS = 1024


@dataclass
class LogitsPlan:
    """Built by the scheduler's planner for one forward pass (row = index into the pass's rows)."""

    sample_rows: list[int] = field(default_factory=list)
    input_rows: list[int] = field(default_factory=list)
    input_targets: list[int] = field(default_factory=list)
    input_top_k: int = 0  # the largest top_logprobs_num among requests asking for prompt logprobs
    verify_rows: list[int] = field(default_factory=list)  # jump-forward drafts: the last token and each draft token
    # --is-embedding: one per sample row, the rows its pooled output reads (the pass yields no logits then).
    pool_spans: list[PoolSpan] = field(default_factory=list)


@dataclass
class LogitsOutput:
    next_token_logits: torch.Tensor  # (len(sample_rows), vocab) in the model's dtype (as_float for arithmetic)
    input_logprobs: list[float]  # one per input row
    input_top: list[list[tuple[float, int]]]  # one per input row when input_top_k > 0
    verify_logits: torch.Tensor | None = None  # (len(verify_rows), vocab), next_token_logits' dtype
    # Both at once, sample rows first, when they are views of one tensor of this pass's own (not a buffer that the
    # next pass overwrites): readers after the pass may keep it without a copy.
    rows: torch.Tensor | None = None
    forward_mode: ForwardMode = ForwardMode.IDLE  # the layout the pass ran in (set by the ModelRunner)
    req_pool_indices: torch.Tensor | None = None  # the pass's ForwardBatch.req_pool_indices (set by the ModelRunner)
    pooled: list[torch.Tensor] | None = None  # --is-embedding: one vector per sample row (then no logits)

    def as_float(self) -> LogitsOutput:
        """The logits in float32, for whatever computes with them (penalties, temperature, logprobs, masks, draft
        verification). A plain argmax reads the model's dtype as it is: the cast is exact, so it picks the same
        token, and a batch of 256 rows skips writing and re-reading 131 MB of float32."""
        if self.next_token_logits.dtype == torch.float32:
            return self
        if self.rows is not None:
            rows = self.rows.float()
            n = self.next_token_logits.shape[0]
            return replace(self, next_token_logits=rows[:n], rows=rows,
                           verify_logits=rows[n:] if self.verify_logits is not None else None)
        return replace(self, next_token_logits=self.next_token_logits.float(),
                       verify_logits=None if self.verify_logits is None else self.verify_logits.float())


def split_rows(rows: torch.Tensor, plan: LogitsPlan, input_lp: list[float], input_top: list,
               mode: ForwardMode) -> LogitsOutput:
    """The LogitsOutput of logits computed for plan.sample_rows + plan.verify_rows, in that order."""
    n = len(plan.sample_rows)
    return LogitsOutput(rows[:n], input_lp, input_top, rows[n:] if plan.verify_rows else None, rows, mode)


def top_logprobs(logprobs: torch.Tensor, k: int) -> list[list[tuple[float, int]]]:
    if k <= 0 or logprobs.shape[0] == 0:
        return [[] for _ in range(logprobs.shape[0])]
    vals, ids = logprobs.topk(k, dim=-1)
    return [list(zip(v, i)) for v, i in zip(vals.tolist(), ids.tolist())]


class LogitsProcessor:
    def __init__(self, lm_head: torch.nn.Module, vocab_size: int, parallel: Parallel = SINGLE):
        self.lm_head = lm_head
        self.parallel = parallel
        self.vocab_size = vocab_size
        self.packed_weight: torch.Tensor | None = None
        self.pack_for_cpu()
        self.gemm_choices: dict[int, object] = {}  # as Linear's

    def pack_for_cpu(self) -> None:
        """Packs the head's weight for oneDNN (on the CPU; at load, and after ModelRunner.unpack_weights dropped it).
        Packed already: nothing to do."""
        if self.packed_weight is None:
            self.packed_weight = gemm.pack_weight(self.lm_head.weight)

    @property
    def weight(self) -> torch.Tensor:  # the GEMM's weight, as a Linear holder's (kernels/gemm/tuned_gemm.py)
        return self.lm_head.weight

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        out = gemm.linear(hidden, self.lm_head.weight, None, self.packed_weight, self.gemm_choices)
        # Tensor parallel: each rank holds a slice of the vocabulary; every rank gets all of it (and samples alike).
        return self.parallel.all_gather(out)[:, : self.vocab_size]

    def __call__(self, hidden: torch.Tensor, plan: LogitsPlan, mode: ForwardMode) -> LogitsOutput:
        dev = hidden.device
        picked = self.logits(hidden[host_to_device(plan.sample_rows + plan.verify_rows, torch.long, dev)])
        input_lp: list[float] = []
        input_top: list[list[tuple[float, int]]] = []
        # Prompt logprobs a slice of rows at a time: a long prompt's full (rows, vocab) float32 matrix, and its
        # log_softmax, could exceed the memory left beside the KV pool.
        for i in range(0, len(plan.input_rows), INPUT_LOGPROB_CHUNK_ROWS):
            rows = plan.input_rows[i : i + INPUT_LOGPROB_CHUNK_ROWS]
            lp = torch.log_softmax(self.logits(hidden[host_to_device(rows, torch.long, dev)]).float(), dim=-1)
            targets = host_to_device(plan.input_targets[i : i + len(rows)], torch.long, dev)
            input_lp += lp.gather(1, targets[:, None]).squeeze(1).tolist()
            if plan.input_top_k:
                input_top += top_logprobs(lp, plan.input_top_k)
        return split_rows(picked, plan, input_lp, input_top, mode)
