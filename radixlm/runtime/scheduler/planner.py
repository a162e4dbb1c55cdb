"""Planner: the rows of the next forward pass, from the requests in it (vLLM v1's rule: each request's KV cursor
catches up with its tokens).

A request contributes the positions [kv.committed, end) -- all of them, or the chunk admission gave it -- as rows
(token id, position, its KV slot), and, when its rows reach kv.end(), the rows that yield logits: the last one
(a sampler) or the last 1 + len(draft) (a verifier). Prefill, chunked prefill, decode, a prefill mixed with the
running requests' decode rows and draft verification are all this; the executor chooses how the rows run."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from radixlm.runtime.cache.kv_pool import KVPool
from radixlm.runtime.cache.memory_pool import ReqToTokenPool, TokenToKVPoolAllocator
from radixlm.runtime.cache.radix_cache import RadixCache
from radixlm.runtime.cache.radix_node import draft_kv_prefix
from radixlm.runtime.executor.forward_batch import IN_FLIGHT, ModelWorkerBatch
from radixlm.runtime.executor.logits import LogitsPlan
from radixlm.runtime.executor.pooler import PoolSpan
from radixlm.runtime.spec.tree import TreeMask, depths, verify_mask
from radixlm.runtime.scheduler.req import Req
from radixlm.runtime.scheduler.shared_prefix import decode_groups

# Up to this many tokens, a pass's req_to_token entries are written with one scatter built on the host...
TABLE_SCATTER_MAX_TOKENS = 2048
# ...unless there are at most this many spans (a prefill's few prompts): a device copy per span costs less.
TABLE_SLICE_MAX_SPANS = 4


def pages_needed(prefix_len: int, seq_len: int, page_size: int) -> int:
    """Slots (whole pages) to allocate so positions [prefix_len, seq_len) have somewhere to go."""
    return (-(-seq_len // page_size) - (-(-prefix_len // page_size))) * page_size


@dataclass
class InputSpan:
    """Rows of a pass whose prompt logprobs a request asked for: plan.input_rows[start:end], the first at position
    `first_pos` + 1."""

    req: Req
    start: int
    end: int
    first_pos: int


@dataclass
class ScheduleBatch:
    """One pass as planned (set by Planner.plan); read when it is launched and when its results are processed. Its
    requests may be planned into the next pass while this one is in flight (overlap), so it keeps what it needs."""

    reqs: list[Req]
    new_reqs: list[Req]  # admitted to this pass (after the running requests, in a mixed pass)
    worker: ModelWorkerBatch
    samplers: list[Req]  # requests whose next token this pass yields
    verifiers: list[Req]  # requests whose draft this pass verifies (1 + len(draft) logits rows each)
    input_spans: list[InputSpan] = field(default_factory=list)
    # The request whose prompt this pass computes a chunk of, not the last (set by plan): the scheduler caches the
    # chunk in the tree at launch (later passes read its KV after this one, in stream order).
    chunk: Req | None = None
    # Tree drafts' (nodes, accepted path) by request id: set when the pass is processed, before the sources'
    # on_processed reads them (an EAGLE head pairs the accepted nodes' hidden states).
    accepted_paths: dict[str, tuple[int, list[int]]] = field(default_factory=dict)

    @property
    def is_prefill(self) -> bool:
        return bool(self.new_reqs)

    @property
    def num_rows(self) -> int:
        return self.worker.num_rows


class Planner:
    def __init__(self, req_to_token_pool: ReqToTokenPool, allocator: TokenToKVPoolAllocator, tree_cache: RadixCache,
                 page_size: int, shared_prefix_min_len: int = 0, media: bool = True,
                 replays: Callable[[int], bool] = lambda rows: False, kv_pool: KVPool | None = None):
        """kv_pool: the target's KV, where a tree draft's accepted nodes are moved (compact_tree)."""
        self.req_to_token_pool = req_to_token_pool
        self.allocator = allocator
        self.tree_cache = tree_cache
        self.page_size = page_size
        self.kv_pool = kv_pool
        self.shared_prefix_min_len = shared_prefix_min_len  # 0: decode passes carry no shared prefixes
        self.media = media  # False: no request carries media (a text-only model): passes have no media rows
        # Whether a pass of this many rows replays a CUDA graph (the executor's rule): graphs read no shared prefixes.
        self.replays = replays

    # ------------------------------------------------------------------ rows
    @staticmethod
    def row_end(req: Req) -> int:
        """End of the rows the next pass computes for `req`: its chunk's end, else all it knows (kv.end)."""
        kv = req.kv
        return kv.committed + req.extend_input_len if req.is_chunked else kv.end(len(req.origin_input_ids) + len(req.output_ids))

    def kv_needed(self, reqs: list[Req]) -> int:
        """Slots to allocate for the next pass's rows of `reqs`."""
        if self.page_size == 1:
            return sum(self.row_end(r) - r.kv.committed for r in reqs)
        return sum(pages_needed(r.kv.committed, self.row_end(r), self.page_size) for r in reqs)

    def fits(self, reqs: list[Req]) -> bool:
        """Whether the next pass's rows of `reqs` fit the pool, evicting cached prefixes to make room."""
        return self._make_room(self.kv_needed(reqs))

    def make_room(self, need: int) -> bool:
        """Evicts cached prefixes until `need` slots are free, if it can; whether they are (a decode server's
        requests take their prompt's slots before their KV arrives: scheduler/disagg_decode.py)."""
        return self._make_room(need)

    def _make_room(self, need: int) -> bool:
        """Evicts cached prefixes until `need` slots are free, if it can; whether they are."""
        free = self.allocator.available_size()
        if free < need:
            self.tree_cache.evict(need - free)
            free = self.allocator.available_size()
        return free >= need

    def plan(self, running: list[Req], new_reqs: list[Req], token_buf: torch.Tensor | None = None) -> ScheduleBatch:
        """Rows for the running requests, then the newly admitted ones. Allocates their KV slots and request rows
        and writes them into req_to_token; the cursors move when the pass is launched (launched)."""
        self._admit_rows(new_reqs)
        reqs = running + new_reqs if new_reqs else running
        starts = [r.kv.committed for r in reqs]
        ends = [self.row_end(r) for r in reqs]
        out = self._alloc_kv(reqs, starts, ends)
        self._write_table([(r.req_pool_idx, s, e) for r, s, e in zip(reqs, starts, ends)], out)
        lens = [e - s for s, e in zip(starts, ends)]
        batch = ScheduleBatch(reqs, new_reqs, ModelWorkerBatch(
            input_ids=[], positions=[], req_pool_indices=[r.req_pool_idx for r in reqs], prefix_lens=starts,
            extend_lens=lens, seq_lens=ends, out_cache_loc=out, logits=LogitsPlan(), token_buf=token_buf,
            layer_loads=self.tree_cache.take_layer_loads()),
            samplers=[], verifiers=[])
        if all(n == 1 for n in lens):
            self._one_row_each(batch)
            if self.shared_prefix_min_len:
                batch.worker.shared_prefixes = decode_groups(reqs, self.shared_prefix_min_len, self.replays(len(reqs)))
        else:
            self._rows(batch)
        if self.media:
            self._media_rows(batch)
        if any(r.token_type_ids is not None for r in reqs):
            batch.worker.token_type_ids = [
                (r.token_type_ids[p] if r.token_type_ids is not None and p < len(r.token_type_ids) else 0)
                for r, s, e in zip(reqs, starts, ends) for p in range(s, e)]
        return batch

    @staticmethod
    def _media_rows(batch: ScheduleBatch) -> None:
        """The rows whose embeddings come from an encoder: the planned positions that media items fill; and with
        multimodal rotary positions (Qwen2-VL), every row's three positions, or where all rows are past their prompts,
        each row's offset to its position."""
        wb, row = batch.worker, 0
        mrope = False
        for r, start, n in zip(batch.reqs, wb.prefix_lens, wb.extend_lens):
            if r.mm_inputs is not None:
                wb.mm_spans.extend(r.mm_inputs.spans(row, start, start + n))
                mrope = mrope or r.mm_inputs.mrope is not None
            row += n
        if mrope and all(r.mm_inputs is None or r.mm_inputs.mrope is None or start >= len(r.mm_inputs.mrope.rows[0])
                         for r, start in zip(batch.reqs, wb.prefix_lens)):
            # Every row is past its prompt (decode): one position each, offset by its request's delta.
            wb.rope_offsets = [r.mm_inputs.mrope.delta if r.mm_inputs is not None and r.mm_inputs.mrope is not None
                               else 0 for r, n in zip(batch.reqs, wb.extend_lens) for _ in range(n)]
        elif mrope:
            axes: list[list[int]] = [[], [], []]
            for r, start, n in zip(batch.reqs, wb.prefix_lens, wb.extend_lens):
                m = r.mm_inputs.mrope if r.mm_inputs is not None else None
                for a in range(3):
                    axes[a] += m.axis(a, start, start + n) if m is not None else range(start, start + n)
            wb.mrope_positions = axes

    def _one_row_each(self, batch: ScheduleBatch) -> None:
        """The usual decode pass: one row per request, each yielding its next token."""
        wb = batch.worker
        ids = []
        for r, pos in zip(batch.reqs, wb.prefix_lens):
            out = r.output_ids
            if r.kv.in_flight:
                ids.append(IN_FLIGHT)
                wb.has_in_flight = True
            elif out and pos == len(r.origin_input_ids) + len(out) - 1:
                ids.append(out[-1])
            else:
                ids.append(r.token_at(pos))
        wb.input_ids, wb.positions = ids, list(wb.prefix_lens)
        self._logits_rows(batch)

    def _rows(self, batch: ScheduleBatch) -> None:
        wb = batch.worker
        for i, (r, start, end) in enumerate(zip(batch.reqs, wb.prefix_lens, wb.seq_lens)):
            wb.input_ids.extend(self._tokens(r, start, end))
            draft = r.kv.draft
            if draft is None or draft.parents is None or r.is_chunked:
                wb.positions.extend(range(start, end))
                continue
            # A tree draft's nodes: a row each at table index first + i, at position (the root's) + depth.
            first = end - len(draft.tokens)
            wb.positions.extend(range(start, first))
            wb.positions.extend(first - 1 + d for d in depths(draft.parents))
            if wb.tree_masks is None:
                wb.tree_masks = [None] * len(batch.reqs)
            wb.tree_masks[i] = TreeMask(start, verify_mask(draft.parents, first - start))
        wb.has_in_flight = IN_FLIGHT in wb.input_ids
        self._logits_rows(batch)

    @staticmethod
    def _tokens(req: Req, start: int, end: int) -> list[int]:
        """Row tokens for positions [start, end): on the host, IN_FLIGHT, then the draft's."""
        origin, output = req.origin_input_ids, req.output_ids
        n_in, known = len(origin), len(origin) + len(output)
        host_end = min(end, known)
        if start >= n_in:
            ids = output[start - n_in : host_end - n_in]
        elif host_end <= n_in:
            ids = origin[start:host_end]
        else:
            ids = origin[start:] + output[: host_end - n_in]
        if end > known:
            ids = list(ids)
            flight_end = known + req.kv.in_flight
            ids += [IN_FLIGHT] * (min(end, flight_end) - max(start, known))
            if end > flight_end:
                ids += req.kv.draft.tokens[max(start, flight_end) - flight_end : end - flight_end]
        return ids

    def _logits_rows(self, batch: ScheduleBatch) -> None:
        """Which rows yield logits: each request's last row (its next token), or its last 1 + len(draft) rows
        (verification); and the rows whose prompt logprobs were asked for."""
        plan, wb = batch.worker.logits, batch.worker
        row = 0
        for req, start, n in zip(batch.reqs, wb.prefix_lens, wb.extend_lens):
            if req.wants_input_logprobs() and start < len(req.origin_input_ids):
                self._input_rows(batch, req, row, start, n)
            if req.is_chunked:
                batch.chunk = req
            elif req.kv.draft is not None:
                plan.verify_rows.extend(range(row + n - 1 - len(req.kv.draft.tokens), row + n))
                batch.verifiers.append(req)
            else:
                plan.sample_rows.append(row + n - 1)
                batch.samplers.append(req)
                if req.embed:
                    plan.pool_spans.append(PoolSpan(row, row + n - 1, req.dimensions))
            row += n

    @staticmethod
    def _input_rows(batch: ScheduleBatch, req: Req, row: int, start: int, n: int) -> None:
        plan = batch.worker.logits
        n_prompt = len(req.origin_input_ids)
        first = len(plan.input_rows)
        for pos in range(start, start + n):
            if req.logprob_start_len <= pos + 1 < n_prompt:
                plan.input_rows.append(row + pos - start)
                plan.input_targets.append(req.origin_input_ids[pos + 1])
        plan.input_top_k = max(plan.input_top_k, req.top_logprobs_num)
        batch.input_spans.append(InputSpan(req, first, len(plan.input_rows), start))

    # ------------------------------------------------------------------ KV slots and request rows
    def _admit_rows(self, new_reqs: list[Req]) -> None:
        """A request row for each new request, its matched prefix's slots written first (with pages, the
        allocation reads each request's last cached slot from the table)."""
        cached = []
        for req in new_reqs:
            if req.req_pool_idx is None:
                idx = self.req_to_token_pool.alloc()
                if idx is None:
                    raise RuntimeError("req_to_token pool exhausted; max_running_requests is too large for it")
                req.req_pool_idx = idx
                if req.prefix_len:
                    cached.append(req)
                    if self.tree_cache.track_draft_kv:
                        req.kv.draft_kv_len = draft_kv_prefix(req.cache_lock.node)
        if cached:
            self._write_table([(r.req_pool_idx, 0, r.prefix_len) for r in cached],
                              torch.cat([r.prefix_indices for r in cached]))

    def _alloc_kv(self, reqs: list[Req], starts: list[int], ends: list[int]) -> torch.Tensor:
        alloc = self.allocator
        if self.page_size == 1:
            need = sum(ends) - sum(starts)
        else:
            need = sum(pages_needed(p, s, self.page_size) for p, s in zip(starts, ends))
        self._make_room(need)
        last_locs = [-1] * len(reqs)
        if self.page_size > 1:  # the slot of each request's last written position (one device read)
            rows = [(r.req_pool_idx, p - 1) for r, p in zip(reqs, starts) if p > 0]
            if rows:
                table = self.req_to_token_pool.req_to_token
                idx = torch.tensor(rows, dtype=torch.int64).to(table.device)
                found = iter(table[idx[:, 0], idx[:, 1]].tolist())
                last_locs = [next(found) if p > 0 else -1 for p in starts]
        out = alloc.alloc_extend(starts, ends, last_locs)
        if out is None:
            # Admission and retraction keep demand within free + evictable, so this is a bug, not load.
            raise RuntimeError(f"KV pool exhausted: need {need} slots, {alloc.available_size()} free after eviction")
        return out

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


    def release(self, req: Req, insert: bool = True) -> None:
        """Hands everything the request holds to the tree (insert: its tokens become a cached prefix) or back to the
        allocator, and frees its request row."""
        known = req.seqlen
        if req.kv.committed > known:  # a draft's KV whose verdict never came (its request failed): no token's
            first = -(-known // self.page_size) * self.page_size
            if req.kv.committed > first:
                row = self.req_to_token_pool.req_to_token[req.req_pool_idx]
                self.allocator.free(row[first : req.kv.committed].clone())
            req.kv.committed = known
        self.tree_cache.cache_finished(req.cache_lock, req.req_pool_idx, req.committed_key(), insert=insert,
                                       draft_kv_len=min(req.kv.draft_kv_len, req.kv.committed))

    # ------------------------------------------------------------------ rollback of rejected draft tokens
    def compact_tree(self, req: Req, path: list[int]) -> int:
        """A tree draft's accepted nodes take the positions after the newest token: the KV the pass wrote at each
        node's table index is copied to the index of its depth, before the indices past the path are freed.
        Returns the moves made."""
        first = req.seqlen  # node i was the row at table index first + i
        moves = [(first + node, first + j) for j, node in enumerate(path) if node != j]
        if not moves:
            return 0
        table = self.req_to_token_pool.req_to_token[req.req_pool_idx]
        at = torch.tensor(moves, dtype=torch.int64, device=table.device)
        self.kv_pool.move_slots(table[at[:, 0]], table[at[:, 1]])
        return len(moves)

    def rejected_slots(self, req: Req, drafted_end: int) -> tuple[int, int, int] | None:
        """Once a verdict was taken (the cursor rolled back over the rejected tokens): the (req_to_token row, first
        position, end) of the slots the pass wrote up to `drafted_end` that hold no valid KV now. A page keeps its
        slots while it still holds a position below kv.committed."""
        first = -(-req.kv.committed // self.page_size) * self.page_size
        return (req.req_pool_idx, first, drafted_end) if drafted_end > first else None

    def free_rejected(self, spans: list[tuple[int, int, int]]) -> None:
        """The rejected_slots of a pass's verdicts back to the allocator, in one gather. The rows are read before
        any later pass rewrites them (stream order), even where a finished request's row was released since."""
        if spans:
            pool = self.req_to_token_pool
            self.allocator.free(pool.req_to_token.view(-1).index_select(0, pool.flat_index(spans)))

    def cache_chunk(self, req: Req) -> None:
        """After a prompt's chunk: its tokens so far become shareable."""
        tree = self.tree_cache
        req.cache_lock = lock = tree.cache_unfinished(req.cache_lock, req.req_pool_idx, req.committed_key(),
                                                      draft_kv_len=req.kv.draft_kv_len)
        if tree.track_draft_kv:
            # The row may now point at the tree's slots of a prefix another request cached meanwhile: their
            # draft KV is the tree's.
            valid = draft_kv_prefix(lock.node)
            if valid < lock.protected_len:
                req.kv.draft_kv_len = min(req.kv.draft_kv_len, valid)


def launched(batch: ScheduleBatch) -> None:
    """The pass was launched: every request's KV is committed to the end of its rows, and the requests whose
    next token it yields have one more in flight."""
    for req, end in zip(batch.reqs, batch.worker.seq_lens):
        req.kv.launched(end, samples=not req.is_chunked)
