"""The HTTP server: FastAPI app over a TokenizerManager, plus `serve()` that launches the whole
pipeline (scheduler + detokenizer processes, this process serving HTTP) and tears it down."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

import radixlm
from radixlm.runtime.args import ServerArgs
from radixlm.runtime.errors import ApiError
from radixlm.runtime.server.errors import BadRequest, error_response, flavor_of, parse
from radixlm.runtime.server.guard import GuardMiddleware
from radixlm.runtime.server.anthropic import router as anthropic_router
from radixlm.runtime.server.lora import router as lora_router
from radixlm.runtime.server.metrics import router as metrics_router
from radixlm.runtime.server.native import json_response, read_json_object, router as native_router
from radixlm.runtime.server.native_protocol import AbortReq
from radixlm.runtime.server.openai.response_store import ResponseStore
from radixlm.runtime.server.openai.routes import router as openai_router
from radixlm.runtime.server.openapi import install_openapi, request_body
from radixlm.runtime.server.pooling import router as pooling_router
from radixlm.runtime.server.text_parsers import router as text_parsers_router
from radixlm.runtime.server.tokens import router as tokens_router
from radixlm.runtime.server.weights import router as weights_router
from radixlm.runtime.tokenizer_manager import RequestFailed, RuntimeDead, TokenizerManager

logger = logging.getLogger(__name__)

HEALTH_CHECK_TIMEOUT_S = 20.0
WARMUP_TIMEOUT_S = 300.0
GRACEFUL_SHUTDOWN_S = 30
SERVER_INFO_TIMEOUT_S = 5.0  # then /server_info shows the scheduler's last reported state (a long pass is running)


async def _warm_up(tm: TokenizerManager, started: float) -> None:
    try:
        prompt = "The capital city of France is"
        built = (tm.build_embed(texts=prompt) if tm.runtime.info.embedding_dim
                 else tm.build(prompt=prompt, sampling_params={"temperature": 0, "max_new_tokens": 8}))
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
    app.state.response_store = ResponseStore(tm.server_args.responses_store_size)
    app.add_middleware(GuardMiddleware, tokenizer_manager=tm)
    for router in (native_router, lora_router, openai_router, anthropic_router, pooling_router, tokens_router,
                   metrics_router, weights_router, text_parsers_router):
        app.include_router(router)

    def _answer(req: Request, message: str, status_code: int) -> Response:
        return error_response(message, status_code, flavor_of(req.url.path))

    @app.exception_handler(ApiError)
    async def _api_error(req: Request, e: ApiError) -> Response:
        return _answer(req, str(e), e.status_code)

    @app.exception_handler(RequestValidationError)
    async def _validation(req: Request, e: RequestValidationError) -> Response:
        return _answer(req, str(e), 400)

    @app.exception_handler(RuntimeDead)
    async def _dead(req: Request, e: RuntimeDead) -> Response:
        return _answer(req, str(e), 503)

    @app.exception_handler(asyncio.TimeoutError)
    async def _timeout(req: Request, e: asyncio.TimeoutError) -> Response:
        return _answer(req, "the scheduler did not answer in time (busy); retry later", 503)

    @app.exception_handler(StarletteHTTPException)
    async def _http(req: Request, e: StarletteHTTPException) -> Response:
        resp = _answer(req, str(e.detail), e.status_code)
        resp.headers.update(e.headers or {})
        return resp

    def _unhealthy(req: Request) -> Response | None:
        if tm.dead is not None:
            return _answer(req, tm.dead, 503)
        if not tm.ready:
            return _answer(req, "the server is starting", 503)
        return None

    # Plain-text routes say so in the OpenAPI document (schemathesis checks responses against it).
    @app.get("/health", response_class=PlainTextResponse)
    async def health(request: Request) -> Response:
        return _unhealthy(request) or PlainTextResponse("")

    @app.get("/health_generate", response_class=PlainTextResponse)
    async def health_generate(request: Request) -> Response:
        bad = _unhealthy(request)
        if bad is not None:
            return bad
        built = (tm.build_embed(input_ids=[0]) if tm.runtime.info.embedding_dim
                 else tm.build(input_ids=[0], sampling_params={"temperature": 0, "max_new_tokens": 1}, prompt=None))
        try:
            await asyncio.wait_for(tm.generate(built, False, log_metrics=False), HEALTH_CHECK_TIMEOUT_S)
        except (asyncio.TimeoutError, RuntimeDead, RequestFailed) as e:
            return _answer(request, f"health check generation failed: {e!r}", 503)
        return PlainTextResponse("")

    @app.get("/model_info")
    @app.get("/get_model_info")
    async def model_info() -> Response:
        info = tm.runtime.info
        return json_response({
            "model_path": tm.server_args.model_path, "tokenizer_path": tm.server_args.tokenizer_path or info.model_path,
            "is_generation": True, "preferred_sampling_params": None, "weight_version": tm.weight_version,
            "has_image_understanding": tm.builder.mm is not None, "has_audio_understanding": False,
            "image_token": tm.builder.mm.image_token if tm.builder.mm is not None else None,
            "video_token": tm.builder.mm.video_token if tm.builder.mm is not None else None,
            "model_type": info.model_type, "architectures": [info.architecture],
            "chat_template": getattr(tm.tokenizer, "chat_template", None),
        })

    @app.get("/server_info")
    @app.get("/get_server_info")
    async def server_info() -> Response:
        info = tm.runtime.info
        state = await tm.get_internal_state(SERVER_INFO_TIMEOUT_S, allow_stale=True)
        return json_response({
            **dataclasses.asdict(tm.server_args), "api_key": None if tm.server_args.api_key is None else "<set>",
            "max_total_num_tokens": info.max_total_num_tokens, "max_running_requests": info.max_running_requests,
            "max_req_input_len": min(info.context_len, info.max_total_num_tokens) - 1, "context_len": info.context_len,
            "kv_cache": info.kv_cache, "internal_states": [state], "version": radixlm.__version__,
            "weight_version": state.get("weight_version", tm.weight_version),
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


def listen_socket(host: str, port: int) -> socket.socket:
    """The HTTP port, bound (not yet listening: a client meanwhile is refused, as before) before the children start,
    so that no port they take (a tensor-parallel rendezvous at launch.free_port, gloo's connections) can be it. A
    port in use is refused here, before the model loads."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise SystemExit(f"radixlm serve: cannot bind {host}:{port}: {e}") from None
    return sock


def serve(server_args: ServerArgs, host: str = "127.0.0.1", port: int = 30000) -> None:
    import uvicorn

    from radixlm.runtime.launch import launch_subprocesses
    from radixlm.runtime.model_loader.tokenizer import get_tokenizer

    started = time.perf_counter()
    with listen_socket(host, port) as sock:
        # This process's tokenizer (the model's: get_tokenizer resolves the path as the scheduler does) loads while
        # the children start, instead of after them (a few seconds of start-up).
        with ThreadPoolExecutor(1, thread_name_prefix="radixlm-tokenizer") as pool:
            tokenizer = pool.submit(get_tokenizer, server_args.tokenizer_path or server_args.model_path)
            runtime = launch_subprocesses(server_args)
        tm: TokenizerManager | None = None
        try:
            info = runtime.info
            logger.info("model loaded in %.1fs: KV pool %d tokens, max running requests %d, context %d",
                        runtime.load_time_s, info.max_total_num_tokens, info.max_running_requests, info.context_len)
            tm = TokenizerManager(runtime, tokenizer.result())
            config = uvicorn.Config(create_app(tm, started), host=host, port=port,
                                    log_level=server_args.log_level.lower(),
                                    timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S, timeout_keep_alive=5)
            server = uvicorn.Server(config)

            def exit_when_dead(reason: str) -> None:
                # A dead pipeline is not restarted in place: its pending requests were failed, and the server exits
                # non-zero so that its supervisor (systemd, Kubernetes, a router's health checks) sees it go.
                logger.error("the pipeline is dead (%s); shutting down", reason)
                server.should_exit = True

            tm.on_dead = exit_when_dead
            # uvicorn handles SIGTERM/SIGINT: stop accepting, let in-flight requests finish (bounded), run the
            # lifespan exit.
            server.run(sockets=[sock])
        finally:
            runtime.shutdown()
    if tm is not None and tm.dead is not None:
        sys.exit(1)
