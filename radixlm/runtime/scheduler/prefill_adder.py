"""PrefillAdder: admits waiting requests into one prefill batch within the token budgets.

Budgets: `rem_total_tokens` (free + evictable KV, minus what running requests are expected to still
decode: min(max_new - generated, 4096) * new_token_ratio each), `rem_input_tokens` (max_prefill_tokens per
batch; the first request is always admitted) and `rem_chunk_tokens` (chunked_prefill_size; a prompt
that does not fit is cut to a page-aligned chunk and continues in the next rounds). With mixed_rows decode rows
riding along, both of the last two are that much smaller (a chunk keeps at least a page)."""
from __future__ import annotations

import enum

from radixlm.runtime.cache.memory_pool import TokenToKVPoolAllocator
from radixlm.runtime.cache.radix_cache import RadixCache
from radixlm.runtime.scheduler.req import Req

# Decode growth is estimated with at most this many future tokens per request (SGLang's clip).
CLIP_MAX_NEW_TOKENS = 4096


class AddReqResult(enum.Enum):
    CONTINUE = 0  # admitted; try the next request
    NO_TOKEN = 1  # the KV budget is exhausted
    OTHER = 2  # another budget (input tokens, chunk, request count) is exhausted


def reserved_decode(req: Req) -> int:
    """Future tokens of a running request that admission keeps room for (before new_token_ratio)."""
    return min(req.tokens_left(), CLIP_MAX_NEW_TOKENS)


class PrefillAdder:
    def __init__(
        self,
        page_size: int,
        tree_cache: RadixCache,
        allocator: TokenToKVPoolAllocator,
        running_reqs: list[Req],
        new_token_ratio: float,
        max_prefill_tokens: int,
        chunked_prefill_size: int | None,
        max_new_reqs: int,
        mixed_rows: int = 0,
    ):
        self.page_size = page_size
        self.tree_cache = tree_cache
        self.running_reqs = running_reqs
        self.rem_total_tokens = allocator.available_size() + tree_cache.evictable_size() - sum(
            int(max(reserved_decode(r), 0) * new_token_ratio) for r in running_reqs
        )
        # The running requests' decode rows that will ride along (--mixed-chunk on) take their share of the pass.
        self.rem_input_tokens = max_prefill_tokens - mixed_rows
        self.rem_chunk_tokens = (max(chunked_prefill_size - mixed_rows, page_size)
                                 if chunked_prefill_size and chunked_prefill_size > 0 else None)
        self.max_new_reqs = max_new_reqs
        self.can_run_list: list[Req] = []
        self.new_chunked_req: Req | None = None

    def _chunk_len(self, extend_len: int) -> int:
        """How many of extend_len new tokens this batch takes (page-aligned when cut)."""
        if self.rem_chunk_tokens is None or extend_len <= self.rem_chunk_tokens:
            return extend_len
        return self.rem_chunk_tokens // self.page_size * self.page_size

    def _take(self, req: Req, take: int, reserve_decode: bool) -> None:
        req.is_chunked = take < req.extend_input_len
        req.extend_input_len = take
        if req.is_chunked:
            self.new_chunked_req = req
        self.can_run_list.append(req)
        self.rem_total_tokens -= take + self.page_size + (reserved_decode(req) if reserve_decode and not req.is_chunked else 0)
        self.rem_input_tokens -= take
        if self.rem_chunk_tokens is not None:
            self.rem_chunk_tokens -= take

    def add_chunked_req(self, req: Req) -> bool:
        """The request being prefilled in chunks continues first; it already holds its lock and KV.
        Returns False when not even one page of it fits now (running requests hold the pool)."""
        req.extend_input_len = req.seqlen - req.kv.committed
        take = max(self._chunk_len(req.extend_input_len), min(self.page_size, req.extend_input_len))
        room = (self.rem_total_tokens - self.page_size) // self.page_size * self.page_size
        take = min(take, room)
        if take <= 0:
            return False
        self._take(req, take, reserve_decode=True)
        return True

    def add_one_req(self, req: Req) -> AddReqResult:
        if len(self.can_run_list) >= self.max_new_reqs:
            return AddReqResult.OTHER
        if self.can_run_list and (self.rem_input_tokens <= 0 or self.rem_chunk_tokens == 0):
            return AddReqResult.OTHER
        alone = not self.can_run_list and not self.running_reqs
        if req.host_hit_length or req.storage_hit or not self.tree_cache.match_valid(req.last_node):
            # A hierarchical cache: load the host (or storage) tier's hit back (the KV it takes is what computing
            # it would), or match again where loading another request's hit evicted this one's match.
            req.rematch(self.tree_cache, load=True)
        lock, delta = self.tree_cache.lock(req.last_node, req.prefix_len)
        self.rem_total_tokens += delta  # the matched prefix is no longer evictable
        take = self._chunk_len(req.extend_input_len)
        # Nothing else running: the prompt alone must fit; decode growth is handled by retraction.
        need = take + self.page_size + (0 if alone or take < req.extend_input_len else reserved_decode(req))
        if take <= 0 or need > self.rem_total_tokens:
            self.rem_total_tokens += self.tree_cache.unlock(lock)
            return AddReqResult.NO_TOKEN if take > 0 else AddReqResult.OTHER
        req.cache_lock = lock
        req.kv.committed = req.prefix_len
        if not req.started:
            req.started = True
            req.cached_tokens = req.prefix_len
        self._take(req, take, reserve_decode=not alone)
        return AddReqResult.CONTINUE
