"""Launching a planned pass (the step's fourth part): the forward pass, the grammar masks and draft verification it
needs, and sampling, all enqueued: nothing here waits for the device. Under overlap the sampled tokens also go to the
device buffer from which the next pass reads the tokens still in flight."""
from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import torch

from radixlm.runtime.executor.logits import LogitsOutput
from radixlm.runtime.host_to_device import HostCopy, host_to_device
from radixlm.runtime.sampling.sampler import Sampler
from radixlm.runtime.sampling.sampling_batch_info import SamplingBatchInfo
from radixlm.runtime.scheduler.output_processor import BatchResult
from radixlm.runtime.scheduler.pass_masks import MaskPlanner
from radixlm.runtime.scheduler.planner import Planner, ScheduleBatch, launched

if TYPE_CHECKING:
    from radixlm.runtime.spec.path import DraftPath


class PassLauncher:
    def __init__(self, runner, planner: Planner, masks: MaskPlanner, drafts: "DraftPath", stats: Counter,
                 generator: torch.Generator, overlap: bool):
        """runner: the ModelRunner (forward, its request table's size); stats: the scheduler's counters."""
        self.runner = runner
        self.planner = planner
        self.masks = masks
        self.drafts = drafts
        self.stats = stats
        self.generator = generator
        self.overlap = overlap
        self.device = runner.device
        # Set by a prefill server's disaggregation side (scheduler/disagg.py): each pass records BatchResult.done on
        # CUDA, for the copies that read its KV on another stream.
        self.record_pass_done = False
        self.sampler = Sampler()
        # Overlap: the last token sampled for each req_to_token row, read by the next pass on the device.
        self.next_token_buf = torch.zeros(runner.req_to_token_pool.size, dtype=torch.int64, device=self.device)

    def launch(self, batch: ScheduleBatch) -> BatchResult:
        """Enqueue the forward pass and sampling; nothing here waits for the device."""
        out: LogitsOutput = self.runner.forward(batch.worker)
        self.stats["passes_launched"] += 1
        self.drafts.on_launch(batch)
        self._count_layout(batch, out)
        samplers = batch.samplers
        # Rows whose grammar decides their token on demand need no sampler (nor its parameters on the device).
        lazy = self.masks.on_demand_rows(samplers)
        sample = bool(samplers) and not all(lazy) and out.pooled is None
        info = None
        if sample:
            info = SamplingBatchInfo.from_reqs(samplers, out.next_token_logits.shape[-1], self.device,
                                               [r.num_output_tokens() for r in samplers])
        logprobs = any(r.return_logprob for r in samplers)
        if not (sample and info.use_greedy_fast_path and not batch.verifiers and not logprobs
                and all(r.grammar is None for r in samplers)):
            out = out.as_float()  # more than an argmax reads these logits
        result = BatchResult(batch, out)
        logits = out.next_token_logits  # with CUDA graphs a static buffer: everything reading it is enqueued now
        result.masks = self.masks.prepare(samplers, lazy, logits, info, batch.verifiers, out.verify_logits, out.rows)
        if logprobs:
            result.logprobs = torch.log_softmax(logits, dim=-1)
        launched(batch)
        if batch.chunk is not None:
            # Shareable at once, and the next chunk can be planned while this one is in flight: whatever reads
            # these slots runs after this pass on the stream.
            self.planner.cache_chunk(batch.chunk)
        if sample:
            next_ids = self.sampler(logits, info, self.generator)
            if self.overlap:
                rows = out.req_pool_indices if len(samplers) == out.req_pool_indices.shape[0] else host_to_device(
                    [r.req_pool_idx for r in samplers], torch.int64, self.device)
                self.next_token_buf[rows] = next_ids
            result.next_ids = HostCopy(next_ids)
        if self.record_pass_done:
            result.done = torch.cuda.Event()
            result.done.record()
        return result

    def _count_layout(self, batch: ScheduleBatch, out: LogitsOutput) -> None:
        token_rows = out.forward_mode.is_token_rows()
        if batch.is_prefill:
            self.stats["prefill_row_batches"] += token_rows
        elif batch.num_rows > len(batch.reqs):
            self.stats["jump_row_batches"] += token_rows  # as TOKEN_ROWS, a row per token
