"""Cache feedback: correcting the approximate tree from what workers report about their real radix caches.

Two sources, both optional per worker:
- `GET /cache_state` polled on a timer: a new `instance_id` (restart) or an unexplained `flush_count` change
  (a flush behind the router's back) empties the worker's entries; growth of `evicted_tokens_total` shrinks
  them, least recently used first, to the characters its `cached_tokens` amount to;
- every proxied response's cached vs prompt tokens: when the tree credited the chosen worker with far more
  than it reported having, the credited prefix beyond what it had is phantom and is dropped.

NOTE the reported hit-rate statistics are kept whether or not corrections are enabled, so that the router's
estimate can be compared with the workers' ground truth in both modes."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from radixlm.router.metrics import RouterMetrics
from radixlm.router.tree import ApproxRadixTree
from radixlm.router.usage import Usage


@dataclass(frozen=True)
class CacheState:
    instance_id: str
    flush_count: int
    evicted_tokens_total: int
    cached_tokens: int
    max_total_num_tokens: int

    @classmethod
    def parse(cls, obj: Any) -> CacheState:
        if not isinstance(obj, dict):
            raise ValueError("cache state must be a JSON object")
        try:
            return cls(str(obj["instance_id"]), int(obj["flush_count"]), int(obj["evicted_tokens_total"]),
                       int(obj["cached_tokens"]), int(obj.get("max_total_num_tokens", 0)))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"malformed cache state: {e!r}") from e


@dataclass(frozen=True)
class FeedbackConfig:
    enabled: bool = False  # False: statistics only, the tree is never corrected
    # A shortfall is phantom only above both bounds: the worker never caches a prompt's last token and rounds
    # to pages, and characters per token vary along a text, so small gaps are noise.
    phantom_min_chars: int = 32
    phantom_rel: float = 0.2  # of the credited characters
    default_chars_per_token: float = 4.0  # until responses have told us better


@dataclass
class FeedbackStats:
    clears: int = 0
    shrinks: int = 0
    shrunk_chars: int = 0
    phantom_drops: int = 0
    phantom_chars: int = 0
    polls: int = 0
    poll_errors: int = 0
    responses: int = 0  # proxied responses that carried usage
    reported_cached_tokens: int = 0
    reported_prompt_tokens: int = 0
    text_chars: int = 0  # routing-text characters of those responses (first batch item) ...
    text_tokens: int = 0  # ... and their prompt tokens: the chars-per-token estimate


@dataclass
class CacheFeedback:
    tree: ApproxRadixTree
    config: FeedbackConfig
    metrics: RouterMetrics | None = None
    stats: FeedbackStats = field(default_factory=FeedbackStats)
    states: dict[str, CacheState] = field(default_factory=dict)  # last report per worker
    # flushes the router itself made (and already cleared the tree for) since the worker's last report
    router_flushes: dict[str, int] = field(default_factory=dict)

    @property
    def chars_per_token(self) -> float:
        if self.stats.text_tokens <= 0:
            return self.config.default_chars_per_token
        return self.stats.text_chars / self.stats.text_tokens

    def reported_hit_rate(self) -> float:
        s = self.stats
        return s.reported_cached_tokens / s.reported_prompt_tokens if s.reported_prompt_tokens else 0.0

    def forget(self, url: str) -> None:
        self.states.pop(url, None)
        self.router_flushes.pop(url, None)

    def note_router_flush(self, url: str, n: int = 1) -> None:
        """The router is about to flush `url` itself (n=1; n=-1 withdraws that when the flush failed). Noted
        before the flush is sent, so a poll that sees the new count is always explained by it."""
        left = self.router_flushes.get(url, 0) + n
        if left > 0:
            self.router_flushes[url] = left
        else:
            self.router_flushes.pop(url, None)

    def _count(self, kind: str, chars: int) -> None:
        if self.metrics is not None:
            self.metrics.feedback_corrections.labels(kind).inc()
            self.metrics.feedback_chars.labels(kind).inc(chars)

    # ---- polled state ----------------------------------------------------------------------------
    def observe_state(self, url: str, state: CacheState) -> str:
        """Applies one `/cache_state` report. Returns what it did: baseline, clear, shrink or none."""
        self.stats.polls += 1
        prev = self.states.get(url)
        self.states[url] = state
        if prev is None or not self.config.enabled:
            return "baseline" if prev is None else "none"
        restarted = state.instance_id != prev.instance_id
        flushes = max(0, state.flush_count - prev.flush_count)
        explained = min(flushes, self.router_flushes.get(url, 0))
        self.note_router_flush(url, -explained)
        if restarted or flushes > explained:
            if restarted:
                self.router_flushes.pop(url, None)
            chars = self.tree.char_count.get(url, 0)
            self.tree.clear_tenant(url)
            self.stats.clears += 1
            self._count("clear", chars)
            return "clear"
        if state.evicted_tokens_total > prev.evicted_tokens_total:
            budget = int(state.cached_tokens * self.chars_per_token)
            dropped = self.tree.evict_tenant(url, budget)
            if dropped:
                self.stats.shrinks += 1
                self.stats.shrunk_chars += dropped
                self._count("shrink", dropped)
                return "shrink"
        return "none"

    # ---- per response ------------------------------------------------------------------------------
    def observe_response(self, url: str, text: str, held_chars: int, usage: Usage) -> int:
        """Accounts one response of worker `url` for routing text `text`, which the tree credited it with
        `held_chars` of at selection. Returns the phantom characters dropped from the tree."""
        s = self.stats
        s.responses += 1
        s.reported_cached_tokens += usage.cached_tokens
        s.reported_prompt_tokens += usage.prompt_tokens
        if self.metrics is not None:
            self.metrics.reported_cached_tokens.inc(usage.cached_tokens)
            self.metrics.reported_prompt_tokens.inc(usage.prompt_tokens)
            self.metrics.reported_hit_rate.set(self.reported_hit_rate())
        if not text or usage.first_prompt <= 0:
            return 0
        s.text_chars += len(text)
        s.text_tokens += usage.first_prompt
        if not self.config.enabled or held_chars <= 0:
            return 0
        # This request's own ratio converts the worker's tokens back to characters of this text.
        had = min(len(text), int(usage.first_cached * len(text) / usage.first_prompt))
        shortfall = held_chars - had
        if shortfall <= max(self.config.phantom_min_chars, self.config.phantom_rel * held_chars):
            return 0
        before = self.tree.char_count.get(url, 0)
        # Everything the tree credits the worker with beyond text[:had] is suspect (sibling requests of the
        # same vanished prefix included); the text just served is cached there now, so it goes back in.
        self.tree.remove_prefix(text[: had + 1], url)
        if url in self.tree.char_count:
            self.tree.insert(text, url)
        dropped = max(0, before - self.tree.char_count.get(url, 0))
        s.phantom_drops += 1
        s.phantom_chars += dropped
        self._count("phantom", dropped)
        return dropped

    def describe(self) -> dict[str, Any]:
        s = self.stats
        return {"enabled": self.config.enabled, "chars_per_token": round(self.chars_per_token, 4),
                "reported_cache_hit_rate": self.reported_hit_rate(),
                "reported_cached_tokens": s.reported_cached_tokens, "reported_prompt_tokens": s.reported_prompt_tokens,
                "responses_with_usage": s.responses, "clears": s.clears, "shrinks": s.shrinks,
                "shrunk_chars": s.shrunk_chars, "phantom_drops": s.phantom_drops, "phantom_chars": s.phantom_chars,
                "polls": s.polls, "poll_errors": s.poll_errors,
                "workers": {u: {"instance_id": st.instance_id, "flush_count": st.flush_count,
                                "evicted_tokens_total": st.evicted_tokens_total, "cached_tokens": st.cached_tokens,
                                "max_total_num_tokens": st.max_total_num_tokens} for u, st in self.states.items()}}
