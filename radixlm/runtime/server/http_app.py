"""The HTTP server: FastAPI app over a TokenizerManager, plus `serve()` that launches the whole
pipeline (scheduler + detokenizer processes, this process serving HTTP) and tears it down."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse, Response

import radixlm
from radixlm.runtime.args import ServerArgs
from radixlm.runtime.server.errors import BadRequest, error_response, parse
from radixlm.runtime.server.guard import GuardMiddleware
from radixlm.runtime.server.anthropic import router as anthropic_router
from radixlm.runtime.server.metrics import router as metrics_router
from radixlm.runtime.server.native import json_response, read_json_object, router as native_router
from radixlm.runtime.server.native_protocol import AbortReq
from radixlm.runtime.server.openai.routes import router as openai_router
from radixlm.runtime.server.openapi import install_openapi, request_body
from radixlm.runtime.server.tokens import router as tokens_router
from radixlm.runtime.tokenizer_manager import RuntimeDead, TokenizerManager

logger = logging.getLogger(__name__)

HEALTH_CHECK_TIMEOUT_S = 20.0
WARMUP_TIMEOUT_S = 300.0
GRACEFUL_SHUTDOWN_S = 30


async def _warm_up(tm: TokenizerManager, started: float) -> None:
    try:
        built = tm.build(prompt="The capital city of France is", sampling_params={"temperature": 0, "max_new_tokens": 8})
        await asyncio.wait_for(tm.generate(built, False, log_metrics=False), WARMUP_TIMEOUT_S)
    except Exception:  # noqa: BLE001 - the server stays unhealthy (503)
        logger.exception("warm-up generation failed; the server stays unhealthy")
        return
    tm.ready = True
    info = tm.runtime.info
    logger.info("ready in %.1fs: KV pool %d tokens, max running requests %d", time.perf_counter() - started,
                info.max_total_num_tokens, info.max_running_requests)


def create_app(tm: TokenizerManager, started: float | None = None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await tm.start()
        warm = asyncio.create_task(_warm_up(tm, started or time.perf_counter()))
        yield
        warm.cancel()
        await tm.stop()
        # NOTE: here, not after uvicorn returns: uvicorn re-raises SIGTERM/SIGINT once its shutdown is done.
        await asyncio.to_thread(tm.runtime.shutdown)

    app = FastAPI(lifespan=lifespan)
    app.state.tokenizer_manager = tm
    app.add_middleware(GuardMiddleware, tokenizer_manager=tm)
    for router in (native_router, openai_router, anthropic_router, tokens_router, metrics_router):
        app.include_router(router)

    @app.exception_handler(BadRequest)
    async def _bad_request(_req: Request, e: BadRequest) -> Response:
        return error_response(str(e))

    @app.exception_handler(RequestValidationError)
    async def _validation(_req: Request, e: RequestValidationError) -> Response:
        return error_response(str(e))

    @app.exception_handler(RuntimeDead)
    async def _dead(_req: Request, e: RuntimeDead) -> Response:
        return error_response(str(e), 503, "ServiceUnavailable")

    def _unhealthy() -> Response | None:
        if tm.dead is not None:
            return error_response(tm.dead, 503, "ServiceUnavailable")
        if not tm.ready:
            return error_response("the server is starting", 503, "ServiceUnavailable")
        return None

    # Plain-text routes say so in the OpenAPI document (schemathesis checks responses against it).
    @app.get("/health", response_class=PlainTextResponse)
    async def health() -> Response:
        return _unhealthy() or PlainTextResponse("")

    @app.get("/health_generate", response_class=PlainTextResponse)
    async def health_generate() -> Response:
        bad = _unhealthy()
        if bad is not None:
            return bad
        built = tm.build(input_ids=[0], sampling_params={"temperature": 0, "max_new_tokens": 1}, prompt=None)
        try:
            await asyncio.wait_for(tm.generate(built, False, log_metrics=False), HEALTH_CHECK_TIMEOUT_S)
        except (asyncio.TimeoutError, RuntimeDead) as e:
            return error_response(f"health check generation failed: {e!r}", 503, "ServiceUnavailable")
        return PlainTextResponse("")

    @app.get("/model_info")
    @app.get("/get_model_info")
    async def model_info() -> Response:
        info = tm.runtime.info
        return json_response({
            "model_path": tm.server_args.model_path, "tokenizer_path": tm.server_args.tokenizer_path or info.model_path,
            "is_generation": True, "preferred_sampling_params": None, "weight_version": "default",
            "has_image_understanding": False, "has_audio_understanding": False,
            "model_type": info.model_type, "architectures": [info.architecture],
            "chat_template": getattr(tm.tokenizer, "chat_template", None),
        })

    @app.get("/server_info")
    @app.get("/get_server_info")
    async def server_info() -> Response:
        info = tm.runtime.info
        return json_response({
            **dataclasses.asdict(tm.server_args), "api_key": None if tm.server_args.api_key is None else "<set>",
            "max_total_num_tokens": info.max_total_num_tokens, "max_running_requests": info.max_running_requests,
            "max_req_input_len": min(info.context_len, info.max_total_num_tokens) - 1, "context_len": info.context_len,
            "internal_states": [await tm.get_internal_state()], "version": radixlm.__version__,
            "load_time_s": tm.runtime.load_time_s, "process_pids": {n: p.pid for n, p in tm.runtime.procs.items()},
        })

    @app.post("/flush_cache", response_class=PlainTextResponse)
    @app.get("/flush_cache", response_class=PlainTextResponse)
    async def flush_cache() -> Response:
        if await tm.flush_cache():
            return PlainTextResponse("Cache flushed.\n")
        return PlainTextResponse("Cache not flushed: requests are running or waiting.\n", status_code=400)

    @app.post("/abort_request", openapi_extra=request_body(AbortReq))
    async def abort_request(request: Request) -> Response:
        req: AbortReq = parse(AbortReq, await read_json_object(request))
        if not req.abort_all and not req.rid:
            raise BadRequest("abort_request needs rid or abort_all=true")
        return json_response({"aborted": tm.abort_request(req.rid, req.abort_all)})

    install_openapi(app)
    return app


def serve(server_args: ServerArgs, host: str = "127.0.0.1", port: int = 30000) -> None:
    import uvicorn

    from radixlm.runtime.launch import launch_subprocesses
    from radixlm.runtime.model_loader.tokenizer import get_tokenizer

    started = time.perf_counter()
    runtime = launch_subprocesses(server_args)
    try:
        info = runtime.info
        logger.info("model loaded in %.1fs: KV pool %d tokens, max running requests %d, context %d",
                    runtime.load_time_s, info.max_total_num_tokens, info.max_running_requests, info.context_len)
        tm = TokenizerManager(runtime, get_tokenizer(server_args.tokenizer_path or info.model_path))
        config = uvicorn.Config(create_app(tm, started), host=host, port=port, log_level=server_args.log_level.lower(),
                                timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S, timeout_keep_alive=5)
        # uvicorn handles SIGTERM/SIGINT: stop accepting, let in-flight requests finish (bounded), run the lifespan exit.
        uvicorn.Server(config).run()
    finally:
        runtime.shutdown()
