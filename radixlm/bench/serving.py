"""Online serving benchmark against a running server (radixlm, SGLang, or any OpenAI-compatible one).

    python -m radixlm.bench.serving --backend radixlm --port 30000 --dataset-name generated-shared-prefix \
        --gsp-num-groups 4 --gsp-prompts-per-group 8 --max-concurrency 8 --output-file out.json

Prompts are built locally with the server's tokenizer (`--tokenizer`, else `--model`, else the server's
/model_info), so lengths are exact in tokens; native backends receive `input_ids`, OpenAI ones the decoded text.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass

import httpx
import orjson
from tqdm.asyncio import tqdm

from radixlm.bench.datasets import GSP_ORDERS, BenchRequest, build_dataset
from radixlm.bench.metrics import RequestResult, format_report, summarize

NATIVE = ("radixlm", "sglang")
PATHS = {"radixlm": "/generate", "sglang": "/generate", "openai": "/v1/completions",
         "vllm": "/v1/completions", "openai-chat": "/v1/chat/completions"}


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


class StreamTimer:
    """Turns output arrivals into TTFT and ITL; a chunk carrying k new tokens adds k gaps of (gap / k)."""

    def __init__(self, res: RequestResult, start: float):
        self.res, self.start, self.last = res, start, start
        self.tokens = 0

    def add(self, new_tokens: int, now: float) -> None:
        if new_tokens <= 0:
            return
        if self.tokens == 0:
            self.res.ttft = now - self.start
        else:
            self.res.itl.extend([(now - self.last) / new_tokens] * new_tokens)
        self.tokens += new_tokens
        self.last = now


async def sse_data(resp: httpx.Response):
    # Split on \n only (SSE's line ends are \r\n, \n, \r): aiter_lines() also splits on U+2028, U+0085 and the
    # like, which JSON strings of generated text carry unescaped.
    buf = b""
    async for raw in resp.aiter_bytes():
        buf += raw
        *lines, buf = buf.split(b"\n")
        for line in lines:
            line = line.rstrip(b"\r")
            if line.startswith(b"data:"):
                data = line[5:].strip()
                if data == b"[DONE]":
                    return
                yield orjson.loads(data)


def _handle_native(chunk: dict, res: RequestResult, timer: StreamTimer, now: float) -> None:
    meta = chunk.get("meta_info", {})
    done = meta.get("completion_tokens", len(chunk.get("output_ids") or []))
    timer.add(done - timer.tokens, now)
    res.output_len = done
    if "prompt_tokens" in meta:
        res.prompt_len = meta["prompt_tokens"]
    if meta.get("cached_tokens") is not None:
        res.cached_tokens = meta["cached_tokens"]


def _handle_openai(chunk: dict, res: RequestResult, timer: StreamTimer, now: float, chat: bool) -> None:
    # OpenAI chunks carry text deltas without token counts: one non-empty delta counts as one token until the
    # final usage chunk gives the true total.
    for choice in chunk.get("choices") or []:
        piece = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
        if piece:
            timer.add(1, now)
    usage = chunk.get("usage")
    if usage:
        res.output_len = usage.get("completion_tokens", timer.tokens)
        res.prompt_len = usage.get("prompt_tokens", res.prompt_len)
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        if cached is not None:
            res.cached_tokens = cached


async def send_one(client: httpx.AsyncClient, cfg: RunConfig, req: BenchRequest, index: int = 0) -> RequestResult:
    res = RequestResult(prompt_len=req.prompt_len)
    res.start = start = time.perf_counter()
    timer = StreamTimer(res, start)
    try:
        async with client.stream("POST", PATHS[cfg.backend], json=build_payload(cfg, req, index)) as resp:
            if resp.status_code != 200:
                res.error = f"HTTP {resp.status_code}: {(await resp.aread()).decode(errors='replace')[:200]}"
                return res
            async for chunk in sse_data(resp):
                now = time.perf_counter()
                if "error" in chunk:
                    res.error = str(chunk["error"])[:200]
                    return res
                if cfg.backend in NATIVE:
                    _handle_native(chunk, res, timer, now)
                else:
                    _handle_openai(chunk, res, timer, now, cfg.backend == "openai-chat")
        res.latency = time.perf_counter() - start
        if res.output_len == 0:
            res.output_len = timer.tokens
        res.ok = timer.tokens > 0
        if not res.ok:
            res.error = "no output tokens"
    except (httpx.HTTPError, orjson.JSONDecodeError) as e:
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


async def arrivals(requests: list[BenchRequest], rate: float, seed: int):
    rng = random.Random(seed)
    for i, req in enumerate(requests):
        if i and rate != float("inf"):
            await asyncio.sleep(rng.expovariate(rate))
        yield req


async def run_requests(cfg: RunConfig, requests: list[BenchRequest]) -> tuple[list[RequestResult], float]:
    limit = cfg.max_concurrency or len(requests) or 1
    sem = asyncio.Semaphore(limit)
    limits = httpx.Limits(max_connections=limit, max_keepalive_connections=limit)
    async with httpx.AsyncClient(base_url=cfg.base_url, timeout=httpx.Timeout(None, connect=30), limits=limits) as client:
        bar = tqdm(total=len(requests), disable=cfg.disable_tqdm, desc="requests")

        async def guarded(req: BenchRequest, index: int) -> RequestResult:
            async with sem:
                r = await send_one(client, cfg, req, index)
            bar.update(1)
            return r

        start = time.perf_counter()
        tasks = []
        async for req in arrivals(requests, cfg.request_rate, cfg.seed):
            tasks.append(asyncio.create_task(guarded(req, len(tasks))))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
        bar.close()
    return list(results), duration


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
    p.add_argument("--output-file", default=None)
    p.add_argument("--disable-tqdm", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    base_url = (args.base_url or f"http://{args.host}:{args.port}").rstrip("/")
    tokenizer = load_tokenizer(args.tokenizer or args.model, base_url)
    kw = {k: v for k, v in vars(args).items() if k.startswith(("random_", "gsp_"))}
    requests = build_dataset(args.dataset_name, tokenizer, args.num_prompts, args.seed, **kw)
    cfg = RunConfig(args.backend, base_url, args.model or "default", args.request_rate, args.max_concurrency,
                    not args.disable_ignore_eos, args.seed, args.disable_tqdm, tuple(args.lora_name or ()))
    if args.warmup_requests and requests:
        # Untimed: first requests pay one-off costs (allocator growth, kernel selection) in the server.
        warm = [BenchRequest(r.prompt, r.input_ids, r.prompt_len, 2) for r in requests[:args.warmup_requests]]
        run_async(run_requests(RunConfig(**{**vars(cfg), "disable_tqdm": True}), warm))
    if args.flush_cache:
        httpx.post(f"{base_url}/flush_cache", timeout=60).raise_for_status()
    results, duration = run_async(run_requests(cfg, requests))
    report = summarize(results, duration)
    print(format_report(report, f"Serving benchmark: {args.backend} / {args.dataset_name}"))
    out = {"config": {k: v for k, v in vars(args).items() if k != "request_rate"} | {
        "request_rate": str(args.request_rate), "base_url": base_url, "num_requests": len(requests),
        "command": " ".join([sys.executable, "-m", "radixlm.bench.serving", *(argv if argv is not None else sys.argv[1:])])},
        **report}
    if args.output_file:
        with open(args.output_file, "w") as f:
            json.dump(out, f, indent=2)
    return out


if __name__ == "__main__":
    main()
