"""A ModelRunner's scheduler-facing surface for scheduling studies without a model (benchmarks/scheduler/
scheduler_sim.py --kind host-queue and --kind retraction): the real request table and KV allocator, a pass that costs
only a logits tensor whose argmax is one constant token, no KV read or written."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from radixlm.runtime.cache.memory_pool import ReqToTokenPool, TokenToKVPoolAllocator
from radixlm.runtime.distributed.parallel import SINGLE
from radixlm.runtime.executor.forward_batch import ModelWorkerBatch
from radixlm.runtime.executor.logits import LogitsOutput
from radixlm.runtime.executor.model_runner import CUDA_GRAPH_DEFAULT_MAX_BS, ModelRunner

GRAPH_ROWS = CUDA_GRAPH_DEFAULT_MAX_BS


class NullRunner:
    parallel = SINGLE
    takes_shared_prefixes = False
    is_causal = True
    pooler = None  # generation
    choose_mode = ModelRunner.choose_mode
    can_replay = ModelRunner.can_replay  # the executor's own rule, over graph_runner.max_bs below

    def __init__(self, size: int, page_size: int, max_running: int, context_len: int, vocab: int = 256,
                 token: int = 0, graph_rows: int = GRAPH_ROWS):
        self.device, self.is_cuda, self.page_size = "cpu", False, page_size
        self.graph_runner = SimpleNamespace(max_bs=graph_rows) if graph_rows else None
        self.model_config = SimpleNamespace(vocab_size=vocab, context_len=context_len)
        self.max_running_requests, self.max_total_num_tokens = max_running, size
        self.req_to_token_pool = ReqToTokenPool(max_running + 1, context_len + 4, "cpu")
        self.token_to_kv_pool_allocator = TokenToKVPoolAllocator(size, page_size, "cpu", debug=False)
        self.token_to_kv_pool = None
        self.vocab, self.token = vocab, token
        self.passes = 0

    def _logits(self, n: int) -> torch.Tensor:
        x = torch.zeros(n, self.vocab)
        x[:, self.token] = 1.0
        return x

    def forward(self, wb: ModelWorkerBatch) -> LogitsOutput:
        self.passes += 1
        n, v = len(wb.logits.sample_rows), len(wb.logits.verify_rows)
        return LogitsOutput(self._logits(n), [], [], self._logits(v) if v else None,
                            forward_mode=self.choose_mode(wb),
                            req_pool_indices=torch.tensor(wb.req_pool_indices, dtype=torch.int64))
