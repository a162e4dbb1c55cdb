"""The router's PD mode without servers: its flags, select_pd_pair's independent policies over the two pools and the
bootstrap fields, and the proxy against fake workers behind an httpx.MockTransport (the decode worker's answer is the
client's; a failed prefill's error is, and cancels the decode request; the same room reaches both)."""
from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from radixlm.cli import build_parser
from radixlm.router.app import create_app
from radixlm.router.args import RouterArgs, router_args_from
from radixlm.router.pd import DEFAULT_BOOTSTRAP_PORT, PDRouter
from radixlm.router.policies import RoutingRequest

PD = dict(pd_disaggregation=True, prefill=[["http://p1:1", "9001"], ["http://p2:1"]], decode=["http://d1:1", "http://d2:1"])


def test_flags_parse_and_are_checked():
    ns = build_parser().parse_args(["router", "--pd-disaggregation", "--prefill", "http://p1:1", "9001", "--prefill",
                                    "http://p2:1", "--decode", "http://d1:1", "--prefill-policy", "cache_aware",
                                    "--decode-policy", "power_of_two"])
    args = router_args_from(ns)
    assert args.prefill == [["http://p1:1", "9001"], ["http://p2:1"]] and args.decode == ["http://d1:1"]
    assert (args.prefill_policy, args.decode_policy) == ("cache_aware", "power_of_two")
    for bad, match in [(dict(prefill=[["http://p:1"]]), "need --pd-disaggregation"),
                       (dict(pd_disaggregation=True, prefill=[["http://p:1"]]), "at least one --prefill and one"),
                       (dict(pd_disaggregation=True, prefill=[["http://p:1", "x"]], decode=["http://d:1"]),
                        "bootstrap port"),
                       (dict(pd_disaggregation=True, prefill=[["http://p:1"]], decode=["http://d:1"],
                             worker_urls=["http://w:1"]), "not --worker-urls"),
                       (dict(pd_disaggregation=True, prefill=[["http://p:1"]], decode=["http://d:1"],
                             decode_policy="nope"), "policy must be one of")]:
        with pytest.raises(ValueError, match=match):
            RouterArgs(**bad)


def _router(**kw) -> PDRouter:
    router = PDRouter(RouterArgs(**{**PD, "random_seed": 0, **kw}), httpx.AsyncClient())
    for pool in (router.prefill, router.decode):
        for w in pool.registry.workers.values():
            w.healthy = True
    return router


def test_select_pd_pair_uses_independent_policies():
    router = _router(prefill_policy="cache_aware", decode_policy="round_robin")
    pairs = [router.select_pd_pair(RoutingRequest("the same long shared prompt")) for _ in range(4)]
    assert len({p.prefill.url for p in pairs}) == 1  # the prefill pool's tree keeps the prompt on one worker
    assert [p.decode.url for p in pairs] == ["http://d1:1", "http://d2:1"] * 2  # the decode pool's own policy
    assert len({p.bootstrap_room for p in pairs}) == 4 and all(0 <= p.bootstrap_room < 1 << 63 for p in pairs)
    ports = {p.prefill.url: p.bootstrap_port for p in
             (router.select_pd_pair(RoutingRequest(f"other prompt {i}")) for i in range(8))} | {
                 pairs[0].prefill.url: pairs[0].bootstrap_port}
    assert ports == {"http://p1:1": 9001, "http://p2:1": DEFAULT_BOOTSTRAP_PORT}
    pair = pairs[0]
    assert pair.bootstrap_host == pair.prefill.url.split("//")[1].split(":")[0]
    assert pair.inject({"text": "x"})["bootstrap_room"] == pair.bootstrap_room
    for w in router.decode.registry.workers.values():
        w.healthy = False
    assert router.select_pd_pair(RoutingRequest("x")) is None


class Fleet:
    def __init__(self) -> None:
        self.bodies: dict[str, list[dict]] = {}
        self.cancelled = asyncio.Event()

    async def __call__(self, req: httpx.Request) -> httpx.Response:
        host = req.url.host
        if req.url.path == "/health":
            return httpx.Response(200, json={"status": "ok"})
        body = json.loads(req.content)
        self.bodies.setdefault(host, []).append(body)
        if host.startswith("p"):
            if body.get("text") == "fail":
                return httpx.Response(400, json={"error": {"message": "bad prompt"}})
            return httpx.Response(200, json={"text": "prefill"})
        if body.get("text") == "fail":
            try:
                await asyncio.sleep(30)
            finally:
                self.cancelled.set()
        if body.get("stream"):
            async def events():
                yield b'data: {"text": "a"}\n\n'
                yield b"data: [DONE]\n\n"
            return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=events())
        return httpx.Response(200, json={"text": f"from {host}"})


def test_proxy_pairs_both_workers_and_answers_with_the_decode_worker():
    fleet = Fleet()

    async def go():
        app = create_app(RouterArgs(**{**PD, "random_seed": 1}), transport=httpx.MockTransport(fleet))
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://router") as c:
                assert (await c.get("/health")).json()["healthy_decode_workers"] == 2
                r = await c.post("/generate", json={"text": "hello", "sampling_params": {"max_new_tokens": 2}})
                assert r.status_code == 200 and r.json()["text"].startswith("from d")
                sent = [b for bodies in fleet.bodies.values() for b in bodies]
                assert len(sent) == 2 and sent[0]["bootstrap_room"] == sent[1]["bootstrap_room"]
                assert {b["bootstrap_host"] for b in sent} == {r.headers["x-radixlm-prefill"][7:-2]}
                r = await c.post("/v1/completions", json={"prompt": "hi", "stream": True})
                assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
                r = await c.post("/generate", json={"text": "fail"})
                assert r.status_code == 400 and "bad prompt" in r.text
                await asyncio.wait_for(fleet.cancelled.wait(), 5)  # the decode request was dropped
                assert all(w.in_flight == 0 for w in app.state.router.decode.registry.workers.values())

    asyncio.run(go())
