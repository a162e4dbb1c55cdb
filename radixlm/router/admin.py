"""The router's admin endpoints: fan-outs to every worker (models, flush, LoRA adapters' load and unload, abort,
loads), its own state (server info, cache feedback, metrics) and the worker registry (/workers)."""
from __future__ import annotations

import asyncio
import dataclasses
from typing import Any
from urllib.parse import unquote

import httpx
import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

import radixlm
from radixlm.router.core import Router
from radixlm.router.workers import Worker
from radixlm.runtime.server.errors import ApiFlavor, error_response

OPENAI = ApiFlavor.OPENAI


def json_response(obj: Any, status_code: int = 200) -> Response:
    return Response(orjson.dumps(obj), status_code=status_code, media_type="application/json")


async def _fan_out(router: Router, method: str, path: str, body: bytes | None = None,
                   healthy_only: bool = True) -> dict[str, httpx.Response | Exception]:
    workers = [w for w in router.registry.workers.values() if w.healthy or not healthy_only]

    async def one(w: Worker) -> httpx.Response | Exception:
        try:
            return await router.client.request(method, w.url + path, content=body,
                                               headers={"content-type": "application/json"},
                                               timeout=router.args.health_check_timeout_secs * 4)
        except httpx.HTTPError as e:
            return e
    results = await asyncio.gather(*(one(w) for w in workers))
    return {w.url: r for w, r in zip(workers, results)}


def install_admin_routes(app: FastAPI, router: Router) -> None:
    args = router.args

    @app.get("/v1/models")
    async def models() -> Response:
        seen: dict[str, dict] = {}
        for r in (await _fan_out(router, "GET", "/v1/models")).values():
            if isinstance(r, httpx.Response) and r.status_code == 200:
                for m in r.json().get("data", []):
                    seen.setdefault(m.get("id"), m)
        if not seen:
            return error_response("no healthy worker available", 503, OPENAI)
        return json_response({"object": "list", "data": list(seen.values())})

    @app.get("/server_info")
    @app.get("/get_server_info")
    async def server_info() -> Response:
        return json_response({"router": dataclasses.asdict(args), "version": radixlm.__version__,
                              "workers": router.describe_workers(),
                              "estimated_cache_hit_rate": router.estimated_hit_rate()})

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        noted = [w.url for w in router.registry.workers.values() if w.healthy]
        for url in noted:
            router.feedback.note_router_flush(url)
        results = await _fan_out(router, "POST", "/flush_cache")
        failed = {}
        for url in noted:
            r = results.get(url)
            if not (isinstance(r, httpx.Response) and r.status_code == 200):
                router.feedback.note_router_flush(url, -1)
        for url, r in results.items():
            if isinstance(r, httpx.Response) and r.status_code == 200:
                router.tree.clear_tenant(url)  # the worker's cache is empty now; so is our belief about it
            else:
                failed[url] = r.text.strip() if isinstance(r, httpx.Response) else repr(r)
        if failed or not results:
            msg = "no healthy worker to flush" if not results else f"cache not flushed on {failed}"
            return error_response(msg, 400)
        return json_response({"status": "flushed", "workers": list(results)})

    async def lora_update(request: Request, path: str) -> Response:
        """Every healthy worker loads (unloads) the adapter: 200 when all did, else 400 with each worker's answer."""
        results = await _fan_out(router, "POST", path, await request.body())
        answers = {url: (r.json() if isinstance(r, httpx.Response) and r.headers.get("content-type", "").startswith(
            "application/json") else {"success": False, "error_message": r.text if isinstance(r, httpx.Response)
                                      else repr(r)}) for url, r in results.items()}
        ok = bool(results) and all(isinstance(r, httpx.Response) and r.status_code == 200 for r in results.values())
        if ok:
            return json_response({"success": True, "error_message": None, "workers": answers})
        msg = "no healthy worker" if not results else f"{path.strip('/')} failed on " + ", ".join(
            url for url, r in results.items() if not (isinstance(r, httpx.Response) and r.status_code == 200))
        return json_response({"object": "error", "message": msg, "type": "BadRequestError", "param": None,
                              "code": 400, "success": False, "error_message": msg, "workers": answers}, 400)

    @app.post("/load_lora_adapter")
    async def load_lora_adapter(request: Request) -> Response:
        return await lora_update(request, "/load_lora_adapter")

    @app.post("/unload_lora_adapter")
    async def unload_lora_adapter(request: Request) -> Response:
        return await lora_update(request, "/unload_lora_adapter")

    @app.post("/abort_request")
    async def abort_request(request: Request) -> Response:
        results = await _fan_out(router, "POST", "/abort_request", await request.body())
        return json_response({url: (r.json() if isinstance(r, httpx.Response) and r.status_code == 200
                                    else {"error": r.text if isinstance(r, httpx.Response) else repr(r)})
                              for url, r in results.items()})

    @app.get("/v1/loads")
    @app.get("/get_loads")
    async def loads() -> Response:
        results = await _fan_out(router, "GET", "/v1/loads")
        out = []
        for w in router.registry.workers.values():
            r = results.get(w.url)
            reported = r.json().get("loads", []) if isinstance(r, httpx.Response) and r.status_code == 200 else []
            out.append({"worker": w.url, "healthy": w.healthy, "router_in_flight": w.in_flight, "loads": reported})
        return json_response({"workers": out})

    @app.get("/cache_feedback")
    async def cache_feedback() -> Response:
        """The router's estimated hit rate next to the workers' reported one, and the corrections made."""
        est = router.estimated_hit_rate()
        reported = router.feedback.reported_hit_rate()
        return json_response({**router.feedback.describe(), "estimated_cache_hit_rate": est,
                              "estimated_cached_chars": router.est_cached_chars,
                              "estimated_input_chars": router.est_input_chars,
                              "hit_rate_gap": abs(est - reported), "decisions": router.decisions,
                              "tree_chars": dict(router.tree.char_count)})

    @app.get("/metrics")
    async def metrics() -> Response:
        body = router.metrics.render(list(router.registry.workers.values()), router.tree.char_count,
                                     router.quarantine.counts()["quarantined"])
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.get("/quarantine")
    async def quarantine() -> Response:
        """How many request fingerprints are quarantined (copies refused) or suspected (one worker broke)."""
        return json_response({**router.quarantine.counts(), "quarantine_secs": args.quarantine_secs})

    _install_worker_routes(app, router)


def _install_worker_routes(app: FastAPI, router: Router) -> None:
    def add(url: Any) -> Response:
        if not isinstance(url, str):
            return error_response("give the worker as {\"url\": \"http://host:port\"}", 400)
        try:
            w = router.registry.add(url)
        except ValueError as e:
            return error_response(str(e), 409 if "already" in str(e) else 400)
        # The first check decides at once; until then the worker gets no traffic.
        asyncio.get_running_loop().create_task(router.registry.check(w, first=True))
        return json_response({"status": "accepted", "worker_id": w.url}, 202)

    def remove(url: str) -> Response:
        try:
            w = router.registry.remove(url)
        except (KeyError, ValueError) as e:
            return error_response(str(e).strip("'\""), 404)
        return json_response({"status": "removed", "worker_id": w.url})

    def worker_id(raw: str) -> str:
        raw = unquote(raw)
        # Some clients collapse "//" in paths: accept http:/host too.
        for scheme in ("http:/", "https:/"):
            if raw.startswith(scheme) and not raw.startswith(scheme + "/"):
                raw = scheme + "/" + raw[len(scheme):]
        return raw

    @app.get("/workers")
    async def list_workers() -> Response:
        return json_response({"workers": router.describe_workers(), "total": len(router.registry.workers)})

    @app.post("/workers")
    async def add_worker(request: Request) -> Response:
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError:
            return error_response("request body is not valid JSON", 400)
        return add(body.get("url") if isinstance(body, dict) else None)

    @app.get("/workers/{wid:path}")
    async def get_worker(wid: str) -> Response:
        url = worker_id(wid)
        for w in router.describe_workers():
            if w["url"] == url.rstrip("/"):
                return json_response(w)
        return error_response(f"no worker {url}", 404)

    @app.delete("/workers/{wid:path}")
    async def delete_worker(wid: str) -> Response:
        return remove(worker_id(wid))

    @app.post("/add_worker")
    async def add_worker_legacy(url: str) -> Response:
        return add(url)

    @app.post("/remove_worker")
    async def remove_worker_legacy(url: str) -> Response:
        return remove(url)
