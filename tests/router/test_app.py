"""The proxy app against fake workers behind an httpx.MockTransport (no model, no sockets), driven through
ASGITransport with the app's lifespan running (failures and retries: test_failures.py)."""
from __future__ import annotations

import asyncio

import httpx
import pytest

from radixlm.router.app import create_app
from radixlm.router.args import RouterArgs
from tests.router.fakes import FakeFleet, Mode, run


def test_proxies_and_counts_selections():
    fleet = FakeFleet("a", "b")

    async def go(c, router):
        for i in range(4):
            r = await c.post("/generate", json={"text": f"prompt {i}", "sampling_params": {"max_new_tokens": 1}})
            assert r.status_code == 200 and r.json()["text"].startswith("from ")
        assert dict(fleet.generate_calls) == {"a": 2, "b": 2}
        metrics = (await c.get("/metrics")).text
        assert 'radixlm_router:worker_selection_total{policy="round_robin",worker="http://a:1"} 2.0' in metrics
        assert all(w.in_flight == 0 for w in router.registry.workers.values())

    run(fleet, go, policy="round_robin")


def test_pooling_routes_reach_the_workers():
    fleet = FakeFleet("a", "b")
    bodies = {"/encode": {"text": "hi"}, "/v1/embeddings": {"input": ["hi", "there"]},
              "/v1/rerank": {"query": "q", "documents": ["d"]}, "/v1/score": {"query": "q", "items": ["i"]}}

    async def go(c, router):
        for path, body in bodies.items():
            r = await c.post(path, json=body)
            assert r.status_code == 200 and r.json()["text"].startswith("from "), path
        assert sorted(b for got in fleet.received.values() for b in map(str, got)) == sorted(map(str, bodies.values()))
        assert all(w.in_flight == 0 for w in router.registry.workers.values())

    run(fleet, go, policy="round_robin")


def test_retry_on_refused_connection_and_no_phantom_affinity():
    fleet = FakeFleet("a", "b")

    async def go(c, router):
        fleet.mode["a"] = Mode.REFUSE  # passes /health, refuses every request
        for i in range(3):
            r = await c.post("/generate", json={"text": f"group {i} long shared prompt text"})
            assert r.status_code == 200 and r.json()["text"] == "from b"
        assert router.tree.char_count["http://a:1"] == 0, "failed attempts must not leave affinity behind"
        assert router.tree.char_count["http://b:1"] > 0
        assert "radixlm_router:retries_total" in (await c.get("/metrics")).text

    run(fleet, go, policy="cache_aware")


def test_503_from_worker_is_retried_then_passed_on_when_all_are_busy():
    fleet = FakeFleet("a", "b")

    async def go(c, router):
        fleet.mode["a"] = Mode.BUSY
        r = await c.post("/generate", json={"text": "x"})
        assert r.status_code == 200 and fleet.generate_calls["b"] == 1
        fleet.mode["b"] = Mode.BUSY
        r = await c.post("/generate", json={"text": "y"})
        assert r.status_code == 503 and r.json()["message"] == "overloaded" and r.headers["retry-after"] == "1"
        assert all(w["healthy"] for w in router.describe_workers()), "a 503 comes from a live worker"
        fleet.mode["a"] = fleet.mode["b"] = Mode.REFUSE
        r = await c.post("/generate", json={"text": "z"})
        assert r.status_code == 502 and r.json()["object"] == "error"
        assert "no worker accepted the request (2 tried" in r.json()["message"]

    run(fleet, go, policy="round_robin")


def test_no_healthy_worker_is_a_503_in_the_openai_shape():
    fleet = FakeFleet("a")
    fleet.mode["a"] = Mode.DOWN

    async def go(c, router):
        r = await c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert r.json() == {"error": {"message": "no healthy worker available", "type": "ServiceUnavailableError",
                                      "param": None, "code": 503}}
        h = await c.get("/health")
        assert h.status_code == 503 and h.json()["workers"][0]["healthy"] is False

    run(fleet, go)


def test_bad_json_is_a_400():
    async def go(c, router):
        r = await c.post("/generate", content=b"{not json", headers={"content-type": "application/json"})
        assert r.status_code == 400 and "not valid JSON" in r.json()["message"]
        r = await c.post("/generate", json=[1, 2])
        assert r.status_code == 400

    run(FakeFleet("a"), go)


def test_streaming_passes_through_and_load_is_released():
    fleet = FakeFleet("a")

    async def go(c, router):
        async with c.stream("POST", "/generate", json={"text": "s", "stream": True}) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            body = b"".join([chunk async for chunk in r.aiter_raw()])
        assert body == b'data: {"text": "a"}\n\ndata: [DONE]\n\n'
        assert router.registry.workers["http://a:1"].in_flight == 0

    run(fleet, go)


def test_flush_cache_fans_out_and_clears_the_tree():
    fleet = FakeFleet("a", "b")

    async def go(c, router):
        await c.post("/generate", json={"text": "something to remember"})
        assert sum(router.tree.char_count.values()) > 0
        r = await c.post("/flush_cache")
        assert r.status_code == 200 and sorted(fleet.flushed) == ["a", "b"]
        assert sum(router.tree.char_count.values()) == 0

    run(fleet, go)


def test_models_loads_and_worker_admin():
    fleet = FakeFleet("a", "b")

    async def go(c, router):
        models = (await c.get("/v1/models")).json()
        assert [m["id"] for m in models["data"]] == ["default"]
        loads = (await c.get("/v1/loads")).json()["workers"]
        assert [w["worker"] for w in loads] == ["http://a:1", "http://b:1"] and loads[0]["loads"]
        r = await c.delete("/workers/http://b:1")
        assert r.status_code == 200 and "http://b:1" not in router.tree.tenants()
        assert (await c.delete("/workers/http://b:1")).status_code == 404
        fleet.mode["c"] = Mode.OK
        r = await c.post("/workers", json={"url": "http://c:1"})
        assert r.status_code == 202
        assert (await c.post("/workers", json={"url": "http://c:1"})).status_code == 409
        assert (await c.post("/workers", json={"url": "c:1"})).status_code == 400
        for _ in range(50):
            if (await c.get("/workers/http%3A%2F%2Fc%3A1")).json().get("healthy"):
                break
            await asyncio.sleep(0.01)
        assert (await c.get("/workers/http://c:1")).json()["healthy"] is True
        urls = [w["url"] for w in (await c.get("/workers")).json()["workers"]]
        assert urls == ["http://a:1", "http://c:1"]

    run(fleet, go)


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": "p"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/messages", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}),
])
def test_other_generation_routes_are_proxied(path, body):
    seen = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req.url.path)
        return httpx.Response(200, json={"ok": True})

    async def go():
        app = create_app(RouterArgs(worker_urls=["http://a:1"]), transport=httpx.MockTransport(handler))
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://r") as c:
                r = await c.post(path, json=body)
        assert r.status_code == 200 and r.json() == {"ok": True}

    asyncio.run(go())
    assert seen == ["/health", path]


def test_lora_adapters_load_and_unload_on_every_worker():
    seen = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append((req.url.host, req.url.path))
        if req.url.path == "/health":
            return httpx.Response(200)
        ok = req.url.host == "a" or b"bad" not in req.content
        return httpx.Response(200 if ok else 400, json={"success": ok, "error_message": None if ok else "no such path"})

    async def go():
        app = create_app(RouterArgs(worker_urls=["http://a:1", "http://b:1"]), transport=httpx.MockTransport(handler))
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://r") as c:
                r = await c.post("/load_lora_adapter", json={"lora_name": "x", "lora_path": "/p"})
                assert r.status_code == 200 and r.json()["success"] and set(r.json()["workers"]) == {
                    "http://a:1", "http://b:1"}
                r = await c.post("/load_lora_adapter", json={"lora_name": "y", "lora_path": "/bad"})
                assert r.status_code == 400 and r.json()["object"] == "error" and "http://b:1" in r.json()["message"]
                assert r.json()["workers"]["http://b:1"]["error_message"] == "no such path"
                assert (await c.post("/unload_lora_adapter", json={"lora_name": "x"})).status_code == 200

    asyncio.run(go())
    assert sorted(h for h, p in seen if p == "/unload_lora_adapter") == ["a", "b"]
