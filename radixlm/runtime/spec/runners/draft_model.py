"""The draft model of --speculative-algorithm STANDALONE: a second, small model on the target's device, with its own
KV pool over the target's slot indices (SGLang's layout): the target's request table and allocator address both
pools, so a slot the target writes, caches, shares through the radix tree or frees is the same slot of the draft
pool.

NOTE invariant: at every slot of a request's positions [0, kv.draft_kv_len), and of a radix-tree node's first
draft_kv_len tokens, the draft pool holds the draft model's KV of the token the target pool holds there. write_kv
runs a target pass's rows through the draft model (prefill, chunks, decode, verification rows) while a request of
the pass may draft soon; while none may (the batch rule turned drafts off) the draft model skips them, and
extend_kv catches a request up over the positions it missed before it drafts (spec/sources/model.py). Freeing a
slot (rejected draft tokens, retraction, abort, eviction) frees it in both pools at once. The draft model's own
guesses go to scratch slots past the shared range, which the allocator never hands out: the verification pass that
follows writes their positions' real slots.
(An EAGLE head, eagle.py, shares the pool and scratch layout but writes its KV after each pass.)
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterator

import torch

from radixlm.runtime.args import ServerArgs
from radixlm.runtime.executor.cuda_graph_runner import CudaGraphRunner
from radixlm.runtime.executor.forward_batch import IN_FLIGHT, ForwardBatch, ForwardMode, ModelWorkerBatch
from radixlm.runtime.executor.logits import LogitsPlan, LogitsProcessor
from radixlm.runtime.executor.model_runner import ModelRunner, SharedSlots
from radixlm.runtime.cache.memory_pool import ReqToTokenPool, TokenToKVPool
from radixlm.runtime.host_to_device import HostCopy, host_to_device
from radixlm.runtime.model_loader.config import ModelConfig
from radixlm.runtime.spec.draft_sampling import DRAFT_SEED_SALT, DraftSampling

logger = logging.getLogger(__name__)

# Rows of one catch-up pass (extend_kv): a long catch-up runs as several, as a long prompt runs as chunks.
CATCH_UP_MAX_TOKENS = 8192


@dataclass
class KVSpan:
    """A request row's positions [start, start + len(tokens)) whose draft KV is missing, and their tokens."""

    row: int
    start: int
    tokens: list[int]

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


def split_spans(spans: list[KVSpan], limit: int) -> Iterator[list[KVSpan]]:
    """The spans in passes of at most `limit` rows (a span cut across passes continues in the next one)."""
    part: list[KVSpan] = []
    rows = 0
    for span in spans:
        at = 0
        while at < len(span.tokens):
            k = min(len(span.tokens) - at, limit - rows)
            part.append(KVSpan(span.row, span.start + at, span.tokens[at : at + k]))
            at, rows = at + k, rows + k
            if rows == limit:
                yield part
                part, rows = [], 0
    if part:
        yield part


class DraftModelRunner:
    """A ModelRunner (composed: self.model_runner) over the draft model, the target's request table and a pool of the
    target's size plus `max_steps` scratch slots per request row; its draft passes. CUDA graphs where the target
    has them."""

    def __init__(self, server_args: ServerArgs, target: ModelRunner, max_steps: int):
        path = server_args.speculative_draft_model_path
        if target.parallel.tp_size > 1:
            raise ValueError("a draft model (STANDALONE, EAGLE) runs with tp_size 1 only")
        if target.mm_embedder is not None:
            raise ValueError("a draft model needs a text-only target (its passes take media embeddings)")
        self.server_args = server_args
        self.target = target
        self.max_steps = max_steps
        page = target.page_size
        rows = target.req_to_token_pool.size
        scratch = -(-rows * max_steps // page) * page
        # Scratch slot of (request row r, draft step i): scratch_base + r * max_steps + i.
        self.scratch_base = target.max_total_num_tokens + page
        config, model, logits = self._load(server_args, target)
        self.model_runner = ModelRunner(server_args, config, target.device, target.parallel,
                                        SharedSlots(target, scratch, model, logits))
        # The draft may pad its vocabulary past the target's: tokens the target cannot take are never proposed.
        self.vocab_size = min(config.vocab_size, target.model_config.vocab_size)
        if self.is_cuda:
            self._warm_up()
        if target.graph_runner is not None:  # the target's decode and verification passes, and every draft pass
            self._capture_graphs(target.graph_runner.max_bs)
        # The token each request row's last draft pass chose, read by its next pass on the device.
        self._token_buf = torch.zeros(rows, dtype=torch.int64, device=self.device)
        self._generator = torch.Generator(device=self.device)  # sampled drafts of requests without a seed
        self._generator.manual_seed((server_args.random_seed or 0) ^ DRAFT_SEED_SALT)
        logger.info("draft model %s: KV pool %.1f MiB (%d scratch slots)", path or "(the target's MTP layer)",
                    self.token_to_kv_pool.mem_bytes() / 2**20, scratch)

    # What CudaGraphRunner and the draft sources read: the composed runner's.
    @property
    def device(self) -> str:
        return self.model_runner.device

    @property
    def is_cuda(self) -> bool:
        return self.model_runner.is_cuda

    @property
    def model(self) -> torch.nn.Module:
        return self.model_runner.model

    @property
    def model_config(self) -> ModelConfig:
        return self.model_runner.model_config

    @property
    def logits_processor(self) -> LogitsProcessor:
        return self.model_runner.logits_processor

    @property
    def attn_backend(self):
        return self.model_runner.attn_backend

    @property
    def req_to_token_pool(self) -> ReqToTokenPool:
        return self.model_runner.req_to_token_pool

    @property
    def token_to_kv_pool(self) -> TokenToKVPool:
        return self.model_runner.token_to_kv_pool

    @property
    def graph_runner(self) -> CudaGraphRunner | None:
        return self.model_runner.graph_runner

    @graph_runner.setter
    def graph_runner(self, graphs: CudaGraphRunner | None) -> None:
        self.model_runner.graph_runner = graphs

    def kv_bytes_per_token(self) -> int:
        return self.model_runner.kv_bytes_per_token()

    def _capture_graphs(self, max_bs: int) -> None:
        self.graph_runner = CudaGraphRunner(self.model_runner, max_bs)

    def _warm_up(self) -> None:
        self.model_runner.warm_up_extend()  # the extend kernels built now, not in the middle of a request

    def _load(self, server_args: ServerArgs, target: ModelRunner
              ) -> tuple[ModelConfig, torch.nn.Module | None, LogitsProcessor | None]:
        """The draft model's config, and its model and logits processor where they are not the ModelRunner's own
        (None: loaded by it)."""
        config = ModelConfig.from_path(
            server_args.speculative_draft_model_path, dtype=target.model_config.dtype, device=target.device,
            context_length=target.model_config.context_len, load_format=server_args.load_format)
        return config, None, None

    def scratch_slot(self, row: int, step: int) -> int:
        return self.scratch_base + row * self.max_steps + step

    def point_at_scratch(self, rows: list[int], positions: list[int], steps: list[int]) -> None:
        """Positions [p, p + steps) of each request row point at its scratch slots until the planner writes the
        verification pass's real ones: nothing reads a request's table past its committed KV meanwhile."""
        spans = [(r, p, p + k) for r, p, k in zip(rows, positions, steps)]
        scratch = [self.scratch_slot(r, i) for r, k in zip(rows, steps) for i in range(k)]
        if scratch:
            table = self.req_to_token_pool.req_to_token
            table.view(-1).index_copy_(0, self.req_to_token_pool.flat_index(spans),
                                       host_to_device(scratch, torch.int64, self.device))

    @torch.inference_mode()
    def write_kv(self, wb: ModelWorkerBatch) -> None:
        """The draft model's KV for a target pass's rows (launched right after the target's, before its sampler
        updates wb.token_buf: IN_FLIGHT rows read the same tokens the target's did)."""
        if not wb.num_rows:
            return
        fb = ForwardBatch.build(wb, self.model_runner.choose_mode(wb), self.req_to_token_pool, self.token_to_kv_pool,
                                self.attn_backend, self.device)
        if self.graph_runner is not None and self.graph_runner.can_run(fb):
            self.graph_runner.replay(fb)
            return
        self.attn_backend.init_forward_metadata(fb)
        self.model(fb.input_ids, fb.positions, fb)

    def extend_kv(self, spans: list[KVSpan]) -> None:
        """The draft model's KV of each span's positions, at the slots the request table holds for them, over the
        draft KV below its start (valid: the catch-up starts where it stops being so)."""
        pool = self.req_to_token_pool
        for part in split_spans(spans, CATCH_UP_MAX_TOKENS):
            at = [(s.row, s.start, s.end) for s in part]
            self.write_kv(ModelWorkerBatch(
                input_ids=[t for s in part for t in s.tokens],
                positions=[p for s in part for p in range(s.start, s.end)], req_pool_indices=[s.row for s in part], prefix_lens=[s.start for s in part],
                extend_lens=[len(s.tokens) for s in part], seq_lens=[s.end for s in part],
                out_cache_loc=pool.req_to_token.view(-1)[pool.flat_index(at)], logits=LogitsPlan()))

    @torch.inference_mode()
    def propose(self, rows: list[int], last_tokens: list[int], positions: list[int], steps: list[int],
                written: list[bool] | None = None, sampling: DraftSampling | None = None
                ) -> tuple[list[list[int]], list[torch.Tensor | None]]:
        """Chains: for request row rows[i], whose KV is written below positions[i] (the position of its last
        token, last_tokens[i]), up to steps[i] tokens, one draft pass per step over the requests still drafting;
        greedy, or drawn as `sampling` says (then with each chain's (steps[i], vocab) distributions q, else None).
        written[i]: the KV at positions[i] is written too (by a target pass in flight, enqueued before): the first
        step reads it through the table and writes its own copy of it over it (the same token at the same
        position), so the chain's scratch starts a position later. The passes are enqueued back to back (each
        reads the previous one's tokens on the device); the host reads the chains once."""
        n_steps = max(steps, default=0)
        written = written or [False] * len(rows)
        self.point_at_scratch(rows, [p + w for p, w in zip(positions, written)],
                              [k - w for k, w in zip(steps, written)])
        table = self.req_to_token_pool.req_to_token
        chosen = []
        active = list(range(len(rows)))
        for step in range(n_steps):
            active = [i for i in active if steps[i] > step]
            ids = [last_tokens[i] if step == 0 else IN_FLIGHT for i in active]
            pos = [positions[i] + step for i in active]
            locs = host_to_device([self.scratch_slot(rows[i], max(step - written[i], 0)) for i in active], torch.int64,
                                  self.device)
            if step == 0 and any(written):
                own = [n for n, i in enumerate(active) if written[i]]
                at = host_to_device([(rows[active[n]], pos[n]) for n in own], torch.int64, self.device)
                locs[host_to_device(own, torch.int64, self.device)] = table[at[:, 0], at[:, 1]]
            wb = ModelWorkerBatch(
                input_ids=ids, positions=pos, req_pool_indices=[rows[i] for i in active], prefix_lens=pos,
                extend_lens=[1] * len(active), seq_lens=[p + 1 for p in pos],
                out_cache_loc=locs,
                logits=LogitsPlan(sample_rows=list(range(len(active)))), has_in_flight=step > 0,
                token_buf=self._token_buf)
            fb = ForwardBatch.build(wb, ForwardMode.TOKEN_ROWS, self.req_to_token_pool, self.token_to_kv_pool,
                                    self.attn_backend, self.device)
            out = self.model_runner._run(fb, wb.logits)
            logits = out.next_token_logits[:, : self.vocab_size]
            if sampling is None:
                tokens, q = torch.argmax(logits, dim=-1), None
            else:
                tokens, q = sampling.sample(logits, active, step, self._generator)
            self._token_buf[fb.req_pool_indices] = tokens
            chosen.append((active, tokens, q))
        if not chosen:
            return [[] for _ in rows], [None] * len(rows)
        # One host read: every step's tokens, padded to the batch.
        flat = torch.full((n_steps, len(rows)), -1, dtype=torch.int64, device=self.device)
        for step, (active, tokens, _) in enumerate(chosen):
            flat[step, host_to_device(active, torch.int64, self.device)] = tokens
        got = HostCopy(flat).get()[0].tolist()
        chains = [[got[s][i] for s in range(steps[i])] for i in range(len(rows))]
        return chains, self._chain_probs(chosen, steps, sampling)

    @staticmethod
    def _chain_probs(chosen: list, steps: list[int], sampling: DraftSampling | None) -> list[torch.Tensor | None]:
        """Each sampled request's (steps[i], vocab) q rows; None for greedy requests (their drafts are point
        masses at the argmax)."""
        if sampling is None:
            return [None] * len(steps)
        sampled = sampling.sampled
        per_req: list[list[torch.Tensor]] = [[] for _ in steps]
        for active, _, q in chosen:
            for n, i in enumerate(active):
                if sampled[i]:
                    per_req[i].append(q[n])
        return [torch.stack(rows) if rows else None for rows in per_req]
