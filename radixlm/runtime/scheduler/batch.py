"""ScheduleBatch: the requests of one forward pass and the KV bookkeeping that prepares it."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from radixlm.runtime.executor.forward_batch import ForwardBatch, ForwardMode
from radixlm.runtime.host_to_device import rows_to_device
from radixlm.runtime.scheduler.req import Req

# Decode growth is estimated with at most this many future tokens per request (SGLang's clip).
CLIP_MAX_NEW_TOKENS = 4096
RETRACT_DECODE_STEPS = 20
# Up to this many tokens, a batch's req_to_token entries are written with one scatter built on the host...
TABLE_SCATTER_MAX_TOKENS = 2048
# ...unless there are at most this many spans (a prefill's few prompts): a device copy per span costs less.
TABLE_SLICE_MAX_SPANS = 4


def pages_needed(prefix_len: int, seq_len: int, page_size: int) -> int:
    """Slots (whole pages) to allocate so positions [prefix_len, seq_len) have somewhere to go."""
    return (-(-seq_len // page_size) - (-(-prefix_len // page_size))) * page_size


@dataclass
class ScheduleBatch:
    reqs: list[Req]
    forward_mode: ForwardMode
    req_to_token_pool: object
    token_to_kv_pool_allocator: object
    tree_cache: object
    page_size: int
    device: str = "cpu"
    num_running: int = 0  # a mixed batch: its first num_running requests are the running batch's (set by mix_in_decode)

    # Set by prepare_for_extend / prepare_for_decode.
    input_ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    prefix_lens: list[int] = field(default_factory=list)
    extend_lens: list[int] = field(default_factory=list)
    seq_lens: list[int] = field(default_factory=list)
    out_cache_loc: torch.Tensor | None = None

    def is_empty(self) -> bool:
        return not self.reqs

    def batch_size(self) -> int:
        return len(self.reqs)

    # ------------------------------------------------------------------ allocation
    def _alloc_kv(self, prefix_lens: list[int], seq_lens: list[int]) -> torch.Tensor:
        alloc = self.token_to_kv_pool_allocator
        need = sum(pages_needed(p, s, self.page_size) for p, s in zip(prefix_lens, seq_lens))
        if alloc.available_size() < need:
            self.tree_cache.evict(need - alloc.available_size())
        last_locs = [-1] * len(self.reqs)
        if self.page_size > 1:  # the slot of each request's last written position (one device read)
            rows = [(r.req_pool_idx, p - 1) for r, p in zip(self.reqs, prefix_lens) if p > 0]
            if rows:
                table = self.req_to_token_pool.req_to_token
                idx = torch.tensor(rows, dtype=torch.int64).to(table.device)
                found = iter(table[idx[:, 0], idx[:, 1]].tolist())
                last_locs = [next(found) if p > 0 else -1 for p in prefix_lens]
        out = alloc.alloc_extend(prefix_lens, seq_lens, last_locs)
        if out is None:
            # Admission and retraction keep demand within free + evictable, so this is a bug, not load.
            raise RuntimeError(f"KV pool exhausted: need {need} slots, {alloc.available_size()} free after eviction")
        return out

    def prepare_for_extend(self, max_decode_rows: int = 0) -> None:
        """The new tokens of each request. A small prefill (at most `max_decode_rows` tokens, the largest CUDA graph,
        and no prompt logprobs asked for) runs in DECODE mode with one row per token, as a jump-forward pass does
        (prepare_for_decode): a graph replay instead of an eager pass, whose kernel launches cost more than the
        work of a few hundred tokens."""
        self.forward_mode = ForwardMode.EXTEND
        for req in self.reqs:
            if req.req_pool_idx is None:
                idx = self.req_to_token_pool.alloc()
                if idx is None:
                    raise RuntimeError("req_to_token pool exhausted; max_running_requests is too large for it")
                req.req_pool_idx = idx
        self.prefix_lens = [r.prefix_len for r in self.reqs]
        # A new request's exact jump-forward draft (Scheduler._plan_first_jumps) follows its prompt.
        self.extend_lens = [r.extend_input_len + len(r.jump_draft) for r in self.reqs]
        self.seq_lens = [p + e for p, e in zip(self.prefix_lens, self.extend_lens)]
        cached = [r for r in self.reqs if r.prefix_len]
        if cached:  # first: with pages, _alloc_kv reads each request's last cached slot from the table
            self._write_table([(r.req_pool_idx, 0, r.prefix_len) for r in cached],
                              torch.cat([r.prefix_indices for r in cached]))
        out = self._alloc_kv(self.prefix_lens, self.seq_lens)
        self.out_cache_loc = out
        self._write_table(self._new_spans(), out)
        self.input_ids, self.positions = [], []
        for req, p, s in zip(self.reqs, self.prefix_lens, self.seq_lens):
            self.input_ids.extend((req.fill_ids + req.jump_draft)[p:s] if req.jump_draft else req.fill_ids[p:s])
            self.positions.extend(range(p, s))
        if len(self.input_ids) <= max_decode_rows and not any(r.wants_input_logprobs() for r in self.reqs):
            self.forward_mode = ForwardMode.DECODE

    def new_decode_tokens_needed(self) -> int:
        if self.page_size == 1:
            return sum(r.decode_end() - r.kv_committed_len for r in self.reqs)
        return sum(pages_needed(r.kv_committed_len, r.decode_end(), self.page_size) for r in self.reqs)

    def prepare_for_decode(self, max_decode_rows: int = 0) -> None:
        """One token per request (its last output token, whose KV is not written yet), except requests that
        jump forward: they also carry their forced tokens or their draft, so a jump costs no forward pass of its
        own. Such a pass runs in EXTEND mode, or, when it has at most `max_decode_rows` tokens (the largest CUDA
        graph), in DECODE mode with one row per token: a row attends to its request's KV up to its own position,
        and every row's KV is stored before attention, so rows of one request see each other causally."""
        self.prefix_lens = [r.kv_committed_len for r in self.reqs]
        self.seq_lens = [r.decode_end() for r in self.reqs]
        self.extend_lens = [s - p for p, s in zip(self.prefix_lens, self.seq_lens)]
        out = self._alloc_kv(self.prefix_lens, self.seq_lens)
        self.out_cache_loc = out
        self._write_table(self._new_spans(), out)
        if all(e == 1 for e in self.extend_lens):
            self.forward_mode = ForwardMode.DECODE
            # -1: the token was sampled by a pass still in flight (overlap); get_forward_batch reads it on the device.
            self.input_ids = [-1 if r.num_pending else r.output_ids[-1] for r in self.reqs]
            self.positions = list(self.prefix_lens)
            return
        assert not any(r.num_pending for r in self.reqs), "a jump-forward pass needs every token on the host"
        rows = sum(self.extend_lens)
        self.forward_mode = ForwardMode.DECODE if rows <= max_decode_rows else ForwardMode.EXTEND
        self.input_ids, self.positions = [], []
        for req, p, s in zip(self.reqs, self.prefix_lens, self.seq_lens):
            n_in = len(req.origin_input_ids)
            if p >= n_in:  # the usual case: only output tokens and the draft (no copy of the whole sequence)
                self.input_ids.extend((req.output_ids[p - n_in :] + req.jump_draft)[: s - p])
            else:
                self.input_ids.extend((req.origin_input_ids + req.output_ids + req.jump_draft)[p:s])
            self.positions.extend(range(p, s))

    def _new_spans(self) -> list[tuple[int, int, int]]:
        return [(r.req_pool_idx, p, s) for r, p, s in zip(self.reqs, self.prefix_lens, self.seq_lens)]

    def _write_table(self, spans: list[tuple[int, int, int]], slots: torch.Tensor) -> None:
        """req_to_token[row, start:end] = the next end - start slots, for each (row, start, end) in order: one
        device write for a few tokens per request (decode, drafts), else one per request (a few prompts, or long
        ones: no per-token work on the host)."""
        table = self.req_to_token_pool.req_to_token
        slots = slots.to(table.device)
        total = sum(end - start for _, start, end in spans)
        if total > TABLE_SCATTER_MAX_TOKENS or len(spans) <= TABLE_SLICE_MAX_SPANS:
            offset = 0
            for row, start, end in spans:
                table[row, start:end] = slots[offset : offset + end - start]
                offset += end - start
        elif total:
            table.view(-1).index_copy_(0, self.req_to_token_pool.flat_index(spans), slots)

    def get_forward_batch(self, token_to_kv_pool, attn_backend, next_token_buf: torch.Tensor | None = None) -> ForwardBatch:
        """next_token_buf: the last sampled token of each req_to_token row, on the device (overlap scheduling)."""
        dev = self.device
        pool_rows, seq_rows = [r.req_pool_idx for r in self.reqs], self.seq_lens
        if len(self.input_ids) > len(self.reqs) and self.forward_mode.is_decode():  # one row per token
            pool_rows = [i for i, e in zip(pool_rows, self.extend_lens) for _ in range(e)]
            seq_rows = [pos + 1 for pos in self.positions]
        decode_rows = extend_start_loc = None
        if self.forward_mode.is_decode():  # a row per token: the four vectors in one copy (and one graph input copy)
            decode_rows = rows_to_device([self.input_ids, self.positions, pool_rows, seq_rows], dev)
            input_ids, positions, req_pool_indices, seq_lens = decode_rows
        else:
            extend_start = [0]
            for e in self.extend_lens[:-1]:
                extend_start.append(extend_start[-1] + e)
            one_per_req = len(pool_rows) == len(self.reqs)
            per_row = rows_to_device([pool_rows, seq_rows] + ([extend_start] if one_per_req else []), dev)
            per_token = rows_to_device([self.input_ids, self.positions], dev)
            input_ids, positions, req_pool_indices, seq_lens = per_token[0], per_token[1], per_row[0], per_row[1]
            extend_start_loc = per_row[2] if one_per_req else None
        if next_token_buf is not None and any(t < 0 for t in self.input_ids):
            # In place: input_ids stays a row of decode_rows.
            torch.where(input_ids >= 0, input_ids, next_token_buf[req_pool_indices], out=input_ids)
        return ForwardBatch(
            forward_mode=self.forward_mode,
            batch_size=len(pool_rows),
            input_ids=input_ids,
            positions=positions,
            req_pool_indices=req_pool_indices,
            seq_lens=seq_lens,
            seq_lens_cpu=list(seq_rows),
            out_cache_loc=self.out_cache_loc.to(dev),
            req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool=token_to_kv_pool,
            attn_backend=attn_backend,
            extend_prefix_lens_cpu=list(self.prefix_lens),
            extend_seq_lens_cpu=list(self.extend_lens),
            extend_start_loc=extend_start_loc,
            decode_rows=decode_rows,
        )

    # ------------------------------------------------------------------ membership
    def filter_batch(self, keep: list[Req] | None = None) -> None:
        self.reqs = [r for r in (self.reqs if keep is None else keep) if not r.finished()]

    def merge_batch(self, reqs: list[Req]) -> None:
        self.reqs.extend(reqs)

    def mix_in_decode(self, running: "ScheduleBatch") -> None:
        """Put the running batch's decode rows (after its prepare_for_decode) in front of this small prefill's rows
        (a DECODE-mode prefill, see prepare_for_extend): one pass for both."""
        self.num_running = len(running.reqs)
        self.reqs = running.reqs + self.reqs
        self.input_ids = running.input_ids + self.input_ids
        self.positions = running.positions + self.positions
        self.prefix_lens = running.prefix_lens + self.prefix_lens
        self.seq_lens = running.seq_lens + self.seq_lens
        self.extend_lens = running.extend_lens + self.extend_lens
        self.out_cache_loc = torch.cat([running.out_cache_loc, self.out_cache_loc])

    # ------------------------------------------------------------------ retraction
    def check_decode_mem(self) -> bool:
        need = self.new_decode_tokens_needed()
        alloc = self.token_to_kv_pool_allocator
        if alloc.available_size() >= need:
            return True
        self.tree_cache.evict(need - alloc.available_size())
        return alloc.available_size() >= need

    def retract_decode(self) -> tuple[list[Req], float]:
        """Free requests until the next decode step fits; fewest output tokens go first (ties: longest
        input). Their KV goes to the radix tree as evictable cache (most recently used, so evicted last): the
        memory check evicts what the next step needs, and what survives is a prefix hit when the request, which
        keeps its output, is admitted again. Returns the retracted requests and the new_token_ratio to use."""
        order = sorted(self.reqs, key=lambda r: (len(r.output_ids), -len(r.origin_input_ids)), reverse=True)
        retracted: list[Req] = []
        while not self.check_decode_mem():
            if len(order) == 1:
                break  # the caller aborts the last one
            req = order.pop()
            retracted.append(req)
            self.reqs.remove(req)
            self.tree_cache.cache_finished_req(req)
            req.reset_kv_state()
            req.jump_draft = []  # never accepted by its grammar: decoding resumes from the last output token
            req.num_retractions += 1
        total_decoded = sum(len(r.output_ids) for r in self.reqs)
        total_max_new = sum(r.sampling_params.max_new_tokens for r in self.reqs)
        ratio = (total_decoded + RETRACT_DECODE_STEPS * len(self.reqs)) / (total_max_new + 1)
        return retracted, min(1.0, ratio)
