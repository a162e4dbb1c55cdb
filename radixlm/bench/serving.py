"""Online serving benchmark against a running server (radixlm, SGLang, or any OpenAI-compatible one).

    python -m radixlm.bench.serving --backend radixlm --port 30000 --dataset-name generated-shared-prefix \
        --gsp-num-groups 4 --gsp-prompts-per-group 8 --max-concurrency 8 --output-file out.json

Prompts are built locally with the server's tokenizer (`--tokenizer`, else `--model`, else the server's
/model_info), so lengths are exact in tokens; native backends receive `input_ids`, OpenAI ones the decoded text.
"""
from __future__ import annotations

import argparse
import asyncio
import enum
import json
import multiprocessing
import random
import sys
import time
from dataclasses import dataclass, replace

import httpx
import orjson
from tqdm.asyncio import tqdm

from radixlm.bench.datasets import GSP_ORDERS, BenchRequest, build_dataset
from radixlm.bench.metrics import ClientRun, RequestResult, client_report, format_report, merge_runs, summarize
from radixlm.bench.sse import StreamReader, StreamTimer, native_completion_tokens, sse_data  # noqa: F401 (API)

NATIVE = ("radixlm", "sglang")
PATHS = {"radixlm": "/generate", "sglang": "/generate", "openai": "/v1/completions",
         "vllm": "/v1/completions", "openai-chat": "/v1/chat/completions"}


class HttpClient(str, enum.Enum):
    AIOHTTP = "aiohttp"
    HTTPX = "httpx"


@dataclass
class RunConfig:
    backend: str
    base_url: str
    model: str
    request_rate: float
    max_concurrency: int | None
    ignore_eos: bool
    seed: int
    disable_tqdm: bool = False
    lora_names: tuple[str, ...] = ()  # LoRA adapters the requests are spread over (round robin); () the base model
    http_client: HttpClient = HttpClient.AIOHTTP


def build_payload(cfg: RunConfig, req: BenchRequest, index: int = 0) -> dict:
    lora = cfg.lora_names[index % len(cfg.lora_names)] if cfg.lora_names else None
    if cfg.backend in NATIVE:
        body: dict = {"input_ids": req.input_ids} if req.input_ids is not None else {"text": req.prompt}
        body.update(sampling_params={"temperature": 0.0, "max_new_tokens": req.output_len, "ignore_eos": cfg.ignore_eos},
                    stream=True)
        if lora is not None:
            body["lora_path"] = lora
        return body
    body = {"model": lora or cfg.model, "temperature": 0.0, "max_tokens": req.output_len, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": cfg.ignore_eos}
    if cfg.backend == "openai-chat":
        body["messages"] = [{"role": "user", "content": req.prompt}]
    else:
        body["prompt"] = req.prompt
    return body


async def send_one(client: httpx.AsyncClient, cfg: RunConfig, req: BenchRequest, index: int = 0) -> RequestResult:
    res = RequestResult(prompt_len=req.prompt_len)
    res.start = start = time.perf_counter()
    reader = StreamReader(cfg.backend in NATIVE, cfg.backend == "openai-chat", res, start)
    try:
        async with client.stream("POST", PATHS[cfg.backend], json=build_payload(cfg, req, index)) as resp:
            if resp.status_code != 200:
                res.error = f"HTTP {resp.status_code}: {(await resp.aread()).decode(errors='replace')[:200]}"
                return res
            async for raw in resp.aiter_bytes():
                reader.feed(raw)
        reader.close(start)
    except (httpx.HTTPError, orjson.JSONDecodeError) as e:
        res.error = f"{type(e).__name__}: {e}"
    return res


async def send_one_aiohttp(session, cfg: RunConfig, req: BenchRequest, index: int = 0) -> RequestResult:
    import aiohttp

    res = RequestResult(prompt_len=req.prompt_len)
    res.start = start = time.perf_counter()
    reader = StreamReader(cfg.backend in NATIVE, cfg.backend == "openai-chat", res, start)
    try:
        async with session.post(cfg.base_url + PATHS[cfg.backend], data=orjson.dumps(build_payload(cfg, req, index)),
                                headers={"Content-Type": "application/json"}) as resp:
            if resp.status != 200:
                res.error = f"HTTP {resp.status}: {(await resp.read()).decode(errors='replace')[:200]}"
                return res
            async for raw in resp.content.iter_any():
                reader.feed(raw)
        reader.close(start)
    except (aiohttp.ClientError, orjson.JSONDecodeError) as e:
        res.error = f"{type(e).__name__}: {e}"
    return res


def run_async(coro):
    """asyncio.run on uvloop where it is installed: the generator's own per-chunk cost must stay below the
    server's, or it measures itself."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


def arrival_offsets(n: int, rate: float, seed: int) -> list[float]:
    """Seconds after the start at which each request is sent: Poisson arrivals at `rate`, all at 0 when inf."""
    if rate == float("inf"):
        return [0.0] * n
    rng, t, out = random.Random(seed), 0.0, []
    for i in range(n):
        if i:
            t += rng.expovariate(rate)
        out.append(t)
    return out


async def run_requests(cfg: RunConfig, requests: list[BenchRequest], offsets: list[float] | None = None,
                       start_at: float | None = None, indices: list[int] | None = None) -> ClientRun:
    """Sends `requests`, request i at start_at + offsets[i] (perf_counter, shared by all client processes)."""
    offsets = offsets if offsets is not None else arrival_offsets(len(requests), cfg.request_rate, cfg.seed)
    indices = indices if indices is not None else list(range(len(requests)))
    limit = cfg.max_concurrency or len(requests) or 1
    sem = asyncio.Semaphore(limit)
    bar = tqdm(total=len(requests), disable=cfg.disable_tqdm, desc="requests")
    if cfg.http_client is HttpClient.AIOHTTP:
        import aiohttp

        conn = aiohttp.TCPConnector(limit=limit, force_close=False)
        client = aiohttp.ClientSession(connector=conn,
                                       timeout=aiohttp.ClientTimeout(total=None, sock_connect=30))
        send = send_one_aiohttp
    else:
        limits = httpx.Limits(max_connections=limit, max_keepalive_connections=limit)
        client = httpx.AsyncClient(base_url=cfg.base_url, timeout=httpx.Timeout(None, connect=30), limits=limits)
        send = send_one
    async with client:
        async def guarded(req: BenchRequest, index: int, at: float) -> RequestResult:
            delay = at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            async with sem:
                r = await send(client, cfg, req, index)
            bar.update(1)
            return r

        if start_at is None:
            start_at = time.perf_counter()
        else:
            await asyncio.sleep(max(0.0, start_at - time.perf_counter()))
        cpu0 = time.process_time()
        tasks = [asyncio.create_task(guarded(req, i, start_at + off))
                 for req, i, off in zip(requests, indices, offsets)]
        results = await asyncio.gather(*tasks)
        end = time.perf_counter()
        cpu = time.process_time() - cpu0
    bar.close()
    return ClientRun(list(results), start_at, end, cpu)


def _client_worker(conn, cfg: RunConfig, requests: list[BenchRequest], offsets: list[float], indices: list[int]) -> None:
    conn.send("ready")
    start_at = conn.recv()
    conn.send(run_async(run_requests(cfg, requests, offsets, start_at, indices)))
    conn.close()


def run_multi(cfg: RunConfig, requests: list[BenchRequest], num_processes: int) -> list[ClientRun]:
    """The requests dealt round robin over `num_processes` client processes (each with its share of
    max_concurrency) that start together; with 1, the run stays in this process."""
    if num_processes < 1:
        raise ValueError(f"--num-client-processes must be >= 1, got {num_processes}")
    offsets = arrival_offsets(len(requests), cfg.request_rate, cfg.seed)
    if num_processes == 1:
        return [run_async(run_requests(cfg, requests, offsets))]
    limit = cfg.max_concurrency or len(requests)
    if num_processes > max(1, min(limit, len(requests))):
        raise ValueError(f"--num-client-processes {num_processes} exceeds the requests ({len(requests)}) or "
                         f"--max-concurrency ({limit})")
    ctx = multiprocessing.get_context("spawn")
    procs, pipes = [], []
    for k in range(num_processes):
        idx = list(range(k, len(requests), num_processes))
        share = limit // num_processes + (k < limit % num_processes)
        sub = replace(cfg, max_concurrency=share, disable_tqdm=True)
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_client_worker, args=(child, sub, [requests[i] for i in idx],
                                                     [offsets[i] for i in idx], idx), daemon=True)
        p.start()
        procs.append(p)
        pipes.append(parent)
    try:
        for pipe in pipes:
            if pipe.recv() != "ready":
                raise RuntimeError("a client process did not start")
        start_at = time.perf_counter() + 0.05
        for pipe in pipes:
            pipe.send(start_at)
        return [pipe.recv() for pipe in pipes]
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()


def load_tokenizer(name: str | None, base_url: str):
    """The server's tokenizer, loaded locally; None (word prompts) when it cannot be found."""
    from radixlm.runtime.model_loader.tokenizer import get_tokenizer

    if name is None:
        try:
            info = httpx.get(f"{base_url}/model_info", timeout=10).json()
            name = info.get("tokenizer_path") or info.get("model_path")
        except (httpx.HTTPError, ValueError):
            name = None
    if name is None:
        return None
    try:
        return get_tokenizer(name)
    except Exception as e:  # noqa: BLE001 - any failure falls back to word prompts
        print(f"warning: no tokenizer for {name!r} ({e}); using word prompts with approximate lengths", file=sys.stderr)
        return None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="radixlm", choices=sorted(PATHS))
    p.add_argument("--base-url", default=None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--model", default=None, help="model name sent to OpenAI backends; also the tokenizer by default")
    p.add_argument("--tokenizer", default=None, help="local model path or alias ('default') whose tokenizer builds prompts")
    p.add_argument("--dataset-name", default="sharegpt-like", choices=["random", "sharegpt-like", "generated-shared-prefix"])
    p.add_argument("--num-prompts", type=int, default=200)
    p.add_argument("--random-input-len", type=int, default=1024)
    p.add_argument("--random-output-len", type=int, default=128)
    p.add_argument("--random-range-ratio", type=float, default=0.0)
    p.add_argument("--gsp-num-groups", type=int, default=64)
    p.add_argument("--gsp-prompts-per-group", type=int, default=16)
    p.add_argument("--gsp-system-prompt-len", type=int, default=2048)
    p.add_argument("--gsp-question-len", type=int, default=128)
    p.add_argument("--gsp-output-len", type=int, default=256)
    p.add_argument("--gsp-order", default="shuffled", choices=GSP_ORDERS,
                   help="shuffled; grouped (a group's prompts together); rounds (one prompt of every group per round)")
    p.add_argument("--request-rate", type=float, default=float("inf"), help="Poisson arrivals per second; inf = all at once")
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--disable-ignore-eos", action="store_true")
    p.add_argument("--warmup-requests", type=int, default=0, help="untimed requests (2 output tokens) before the run")
    p.add_argument("--flush-cache", action="store_true", help="POST /flush_cache before the run")
    p.add_argument("--lora-name", nargs="+", default=None,
                   help="LoRA adapters (loaded in the server) the requests are spread over, round robin: lora_path on "
                        "native backends, the model on OpenAI ones")
    p.add_argument("--http-client", type=HttpClient, default=HttpClient.AIOHTTP, choices=list(HttpClient),
                   help="the streaming client library (aiohttp: the cheaper per chunk)")
    p.add_argument("--num-client-processes", type=int, default=1,
                   help="load-generator processes the requests are dealt over (each with its share of "
                        "--max-concurrency); more when the report says 'Client bound'")
    p.add_argument("--output-file", default=None)
    p.add_argument("--disable-tqdm", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.http_client is HttpClient.AIOHTTP:
        try:
            import aiohttp  # noqa: F401
        except ImportError:
            raise SystemExit("--http-client aiohttp needs aiohttp (pip install aiohttp), or use --http-client httpx") from None
    base_url = (args.base_url or f"http://{args.host}:{args.port}").rstrip("/")
    tokenizer = load_tokenizer(args.tokenizer or args.model, base_url)
    kw = {k: v for k, v in vars(args).items() if k.startswith(("random_", "gsp_"))}
    requests = build_dataset(args.dataset_name, tokenizer, args.num_prompts, args.seed, **kw)
    cfg = RunConfig(args.backend, base_url, args.model or "default", args.request_rate, args.max_concurrency,
                    not args.disable_ignore_eos, args.seed, args.disable_tqdm, tuple(args.lora_name or ()),
                    args.http_client)
    if args.warmup_requests and requests:
        # Untimed: first requests pay one-off costs (allocator growth, kernel selection) in the server.
        warm = [BenchRequest(r.prompt, r.input_ids, r.prompt_len, 2) for r in requests[:args.warmup_requests]]
        run_async(run_requests(RunConfig(**{**vars(cfg), "disable_tqdm": True}), warm))
    if args.flush_cache:
        httpx.post(f"{base_url}/flush_cache", timeout=60).raise_for_status()
    runs = run_multi(cfg, requests, args.num_client_processes)
    results, duration = merge_runs(runs)
    report = summarize(results, duration)
    report["client"] = client_report(runs, report["total_output_tokens"])
    report["client_bound"] = report["client"]["client_bound"]
    print(format_report(report, f"Serving benchmark: {args.backend} / {args.dataset_name}"))
    if report["client_bound"]:
        print("warning: the load generator used more than 80% of a core: the figures may be its ceiling; rerun "
              "with more --num-client-processes", file=sys.stderr)
    out = {"config": {k: v for k, v in vars(args).items() if k not in ("request_rate", "http_client")} | {
        "http_client": args.http_client.value,
        "request_rate": str(args.request_rate), "base_url": base_url, "num_requests": len(requests),
        "command": " ".join([sys.executable, "-m", "radixlm.bench.serving", *(argv if argv is not None else sys.argv[1:])])},
        **report}
    if args.output_file:
        with open(args.output_file, "w") as f:
            json.dump(out, f, indent=2)
    return out


if __name__ == "__main__":
    main()
