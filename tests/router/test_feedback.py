"""Cache feedback without servers: the correction logic fed fake worker reports, the usage readers, and the
proxy + poll loop against fake workers behind an httpx.MockTransport."""
from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from radixlm.router.app import create_app
from radixlm.router.args import RouterArgs
from radixlm.router.feedback import CacheFeedback, CacheState, FeedbackConfig
from radixlm.router.tree import ApproxRadixTree
from radixlm.router.usage import SseUsageScanner, Usage, usage_of, usage_of_body

W, V = "http://w:1", "http://v:1"
PREFIX = "You are a helpful assistant who knows everything about rivers. " * 4  # 256 chars


def state(instance: str = "i0", flushes: int = 0, evicted: int = 0, cached: int = 0) -> CacheState:
    return CacheState(instance, flushes, evicted, cached, 4096)


def make(enabled: bool = True) -> tuple[ApproxRadixTree, CacheFeedback]:
    tree = ApproxRadixTree()
    tree.add_tenant(W)
    tree.add_tenant(V)
    return tree, CacheFeedback(tree, FeedbackConfig(enabled=enabled))


def test_restart_and_flush_clear_only_that_worker():
    tree, fb = make()
    tree.insert(PREFIX + "q1", W)
    tree.insert(PREFIX + "q2", V)
    assert fb.observe_state(W, state()) == "baseline"
    assert fb.observe_state(W, state()) == "none" and tree.match_tenant(PREFIX, W) == len(PREFIX)
    assert fb.observe_state(W, state(flushes=1)) == "clear"
    assert tree.char_count[W] == 0 and tree.match_tenant(PREFIX, V) == len(PREFIX)
    tree.insert(PREFIX, W)
    assert fb.observe_state(W, state("i1", flushes=0)) == "clear", "a new instance id is a restart"
    assert tree.match_tenant(PREFIX, W) == 0 and fb.stats.clears == 2
    tree.check_invariants()


def test_a_flush_the_router_made_itself_is_not_cleared_twice():
    tree, fb = make()
    fb.observe_state(W, state())
    tree.clear_tenant(W)
    fb.note_router_flush(W)
    tree.insert(PREFIX, W)  # traffic after the router's flush is real
    assert fb.observe_state(W, state(flushes=1)) == "none"
    assert tree.match_tenant(PREFIX, W) == len(PREFIX)
    assert fb.observe_state(W, state(flushes=3)) == "clear", "two more flushes the router never made"


def test_evictions_shrink_lru_entries_to_the_reported_budget():
    tree, fb = make()
    fb.observe_state(W, state())
    old, new = "A" * 400, "B" * 400
    tree.insert(old, W)
    tree.insert(new, W)
    tree.insert("C" * 400, V)
    # No eviction reported: however big the tree, nothing happens.
    assert fb.observe_state(W, state(cached=10)) == "none" and tree.char_count[W] == 800
    # 4 chars/token by default: 120 cached tokens -> 480 chars; the least recently used text goes.
    assert fb.observe_state(W, state(evicted=300, cached=120)) == "shrink"
    assert tree.match_tenant(old, W) == 0 and tree.match_tenant(new, W) == 400
    assert tree.char_count[V] == 400 and fb.stats.shrinks == 1 and fb.stats.shrunk_chars == 400
    tree.check_invariants()


def test_chars_per_token_is_learned_from_responses():
    tree, fb = make()
    fb.observe_response(W, "x" * 300, 0, Usage(0, 100, 0, 100))
    assert fb.chars_per_token == pytest.approx(3.0)
    fb.observe_state(W, state())
    tree.insert("A" * 400, W)
    tree.insert("B" * 400, W)
    fb.observe_state(W, state(evicted=50, cached=150))  # 150 tokens x 3 chars = 450 chars kept
    assert tree.char_count[W] == 400


def test_disabled_feedback_only_counts():
    tree, fb = make(enabled=False)
    tree.insert(PREFIX + "q1", W)
    fb.observe_state(W, state())
    assert fb.observe_state(W, state("other", flushes=5, evicted=99)) == "none"
    assert fb.observe_response(W, PREFIX + "q2", len(PREFIX), Usage(0, 70, 0, 70)) == 0
    assert tree.match_tenant(PREFIX, W) == len(PREFIX)
    assert fb.stats.reported_prompt_tokens == 70 and fb.reported_hit_rate() == 0.0


def test_phantom_prefix_is_dropped_but_the_served_text_stays():
    tree, fb = make()
    for q in ("q1", "q2", "q3"):
        tree.insert(PREFIX + q, W)
    tree.insert(PREFIX + "q9", V)
    text = PREFIX + "q4"
    held = tree.match_tenant(text, W)
    tree.insert(text, W)  # as select() does
    # The worker had nothing cached (it was flushed behind the router's back).
    assert fb.observe_response(W, text, held, Usage(0, 65, 0, 65)) > 0
    assert fb.stats.phantom_drops == 1
    for q in ("q1", "q2", "q3"):
        assert tree.match_tenant(PREFIX + q, W) == len(PREFIX) + 1, "only the served text is known there"
    assert tree.match_tenant(text, W) == len(text)
    assert tree.match_tenant(PREFIX + "q9", V) == len(PREFIX + "q9")
    tree.check_invariants()


def test_partial_hit_keeps_what_the_worker_had():
    tree, fb = make()
    early = PREFIX[:100] + "an early branch of the conversation"
    tree.insert(early, W)
    tree.insert(PREFIX + "tail one", W)
    text = PREFIX + "tail two"
    held = tree.match_tenant(text, W)
    tree.insert(text, W)
    # About half the prefix was still cached: 32 of 65 tokens (~3.9 chars per token -> ~125 chars).
    fb.observe_response(W, text, held, Usage(32, 65, 32, 65))
    assert fb.stats.phantom_drops == 1
    assert tree.match_tenant(early, W) == len(early), "what branches off before the cut is kept"
    assert tree.match_tenant(PREFIX + "tail one", W) == len(PREFIX + "tail "), "only via the served text"
    tree.check_invariants()


def test_small_shortfalls_are_noise():
    tree, fb = make()
    tree.insert(PREFIX + "a", W)
    text = PREFIX + "b"
    held = tree.match_tenant(text, W)
    tree.insert(text, W)
    assert fb.observe_response(W, text, held, Usage(60, 65, 60, 65)) == 0 and fb.stats.phantom_drops == 0
    assert tree.match_tenant(PREFIX + "a", W) == len(PREFIX + "a")


def test_usage_readers():
    assert usage_of({"meta_info": {"prompt_tokens": 10, "cached_tokens": 4}}) == Usage(4, 10, 4, 10)
    batch = [{"meta_info": {"prompt_tokens": 10, "cached_tokens": 4}},
             {"meta_info": {"prompt_tokens": 20, "cached_tokens": 0}}]
    assert usage_of(batch) == Usage(4, 30, 4, 10)
    oai = {"usage": {"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": 3}}}
    assert usage_of_body(json.dumps(oai).encode()) == Usage(3, 9, 3, 9)
    assert usage_of({"usage": {"input_tokens": 5, "cache_read_input_tokens": 7}}) == Usage(7, 12, 7, 12)
    assert usage_of_body(b'{"text": "no usage here"}') is None and usage_of_body(b"cached_tokens{") is None


def test_sse_scanner_reads_the_last_report_across_chunk_boundaries():
    events = [b'data: {"text": "a", "meta_info": {"prompt_tokens": 50, "cached_tokens": 10}}\n\n',
              b'data: {"text": "ab", "meta_info": {"prompt_tokens": 50, "cached_tokens": 10, "x": 1}}\n\n',
              b'data: {"choices": [], "usage": {"prompt_tokens": 50, "prompt_tokens_details": '
              b'{"cached_tokens": 40}}}\n\ndata: [DONE]\n\n']
    raw = b"".join(events)
    for cut in (1, 7, 33, 80, len(raw) - 3):
        sc = SseUsageScanner()
        for i in range(0, len(raw), cut):
            sc.feed(raw[i:i + cut])
        assert sc.result() == Usage(40, 50, 40, 50), cut
    assert SseUsageScanner().result() is None
    anthropic = SseUsageScanner()
    anthropic.feed(b'event: message_start\ndata: {"type": "message_start", "message": {"usage": {"input_tokens": 9, '
                   b'"cache_read_input_tokens": 0}}}\n\nevent: content_block_start\ndata: {"type": '
                   b'"content_block_start", "index": 0}\n\nevent: message_delta\ndata: {"type": "message_delta", '
                   b'"usage": {"input_tokens": 4, "cache_read_input_tokens": 5, "output_tokens": 2}}\n\n')
    assert anthropic.result() == Usage(5, 9, 5, 9)


class FakeWorkers:
    """Fake workers that report a cache: `cached[host]` tokens hit on every /generate, and a /cache_state."""

    def __init__(self, *hosts: str) -> None:
        self.cached = {h: 0 for h in hosts}
        self.state = {h: {"instance_id": "a", "flush_count": 0, "evicted_tokens_total": 0, "cached_tokens": 0,
                          "max_total_num_tokens": 1024} for h in hosts}

    def __call__(self, req: httpx.Request) -> httpx.Response:
        host, path = req.url.host, req.url.path
        if path == "/health":
            return httpx.Response(200)
        if path == "/cache_state":
            return httpx.Response(200, json=self.state[host])
        if path == "/generate":
            body = json.loads(req.content)
            meta = {"prompt_tokens": len(body["text"]) // 4, "cached_tokens": self.cached[host]}
            if body.get("stream"):
                async def events():
                    yield b'data: {"text": "x", "meta_info": ' + json.dumps(meta).encode()[:20]
                    yield json.dumps(meta).encode()[20:] + b"}\n\ndata: [DONE]\n\n"
                return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=events())
            return httpx.Response(200, json={"text": "x", "meta_info": meta})
        return httpx.Response(404)


def run_app(workers: FakeWorkers, fn, **kw) -> None:
    async def main() -> None:
        args = RouterArgs(worker_urls=[f"http://{h}:1" for h in workers.cached], **kw)
        app = create_app(args, transport=httpx.MockTransport(workers))
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://r") as client:
                await fn(client, app.state.router)
    asyncio.run(main())


async def wait_until(pred, timeout: float = 3.0) -> bool:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while loop.time() < end:
        if pred():
            return True
        await asyncio.sleep(0.02)
    return False


def test_poll_loop_clears_a_restarted_worker_and_endpoints_report():
    workers = FakeWorkers("w", "v")

    async def go(c, router):
        r = await c.post("/generate", json={"text": PREFIX + "q1"})
        served = r.headers["x-radixlm-worker"]
        assert router.tree.match_tenant(PREFIX, served) == len(PREFIX)
        assert await wait_until(lambda: len(router.feedback.states) == 2)
        workers.state[served.split("//")[1].split(":")[0]]["instance_id"] = "b"  # restarted
        assert await wait_until(lambda: router.tree.char_count[served] == 0)
        fb = (await c.get("/cache_feedback")).json()
        assert fb["clears"] == 1 and fb["enabled"] and fb["tree_chars"][served] == 0
        assert fb["reported_prompt_tokens"] == len(PREFIX + "q1") // 4
        metrics = (await c.get("/metrics")).text
        assert 'radixlm_router:cache_feedback_corrections_total{kind="clear"} 1.0' in metrics
        assert "radixlm_router:reported_prompt_tokens_total" in metrics

    run_app(workers, go, policy="cache_aware", cache_feedback=True, cache_feedback_interval=0.02)


@pytest.mark.parametrize("stream", [False, True])
def test_proxy_drops_phantom_affinity_from_reported_cached_tokens(stream):
    workers = FakeWorkers("w")

    async def go(c, router):
        async def send(text: str) -> None:
            r = await c.post("/generate", json={"text": text, "stream": stream})
            assert r.status_code == 200
            assert (b"[DONE]" in r.content) == stream
        await send(PREFIX + "q1")
        await send(PREFIX + "q2")  # credited with the prefix, but the worker reports 0 cached
        fb = (await c.get("/cache_feedback")).json()
        assert fb["phantom_drops"] == 1 and fb["responses_with_usage"] == 2
        assert fb["estimated_cache_hit_rate"] > 0.4 and fb["reported_cache_hit_rate"] == 0.0
        assert router.tree.match_tenant(PREFIX + "q1", "http://w:1") == len(PREFIX) + 1  # via q2: real now

    run_app(workers, go, policy="cache_aware", cache_feedback=True, cache_feedback_interval=60)


def test_without_the_flag_nothing_is_corrected_but_usage_is_counted():
    workers = FakeWorkers("w")

    async def go(c, router):
        await c.post("/generate", json={"text": PREFIX + "q1"})
        await c.post("/generate", json={"text": PREFIX + "q2"})
        fb = (await c.get("/cache_feedback")).json()
        assert not fb["enabled"] and fb["phantom_drops"] == 0 and fb["polls"] == 0
        assert fb["responses_with_usage"] == 2 and fb["hit_rate_gap"] > 0.4

    run_app(workers, go, policy="cache_aware")
