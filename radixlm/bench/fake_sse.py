"""A fake streaming server that measures the load generator alone: it answers /generate (SGLang's native chunks,
cumulative `text` and `output_ids`), /v1/completions and /v1/chat/completions (OpenAI chunks with a final usage
chunk) by streaming the requested number of tokens as fast as it can, one chunk per token, with bodies built once
per length so that its own cost per chunk is one socket write.

    python -m radixlm.bench.fake_sse --port 31000
    python -m radixlm.bench.serving --backend radixlm --port 31000 --dataset-name random --random-input-len 32 \
        --random-output-len 512 --num-prompts 512 --max-concurrency 256 --disable-tqdm
"""
from __future__ import annotations

import argparse
import asyncio
import functools
from dataclasses import dataclass

import orjson

TOKEN_TEXT = " tok"
TOKEN_ID = 1234
PROMPT_TOKENS = 32


def _sse(obj: dict) -> bytes:
    data = b"data: " + orjson.dumps(obj) + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


@functools.lru_cache(maxsize=64)
def native_chunks(n: int) -> tuple[bytes, ...]:
    """SGLang's /generate stream of n tokens: every chunk carries the whole output so far."""
    out = []
    for k in range(1, n + 1):
        meta = {"id": "fake", "finish_reason": None if k < n else {"type": "length", "length": n},
                "prompt_tokens": PROMPT_TOKENS, "completion_tokens": k, "cached_tokens": 0}
        out.append(_sse({"text": TOKEN_TEXT * k, "output_ids": [TOKEN_ID] * k, "meta_info": meta}))
    return tuple(out)


@functools.lru_cache(maxsize=64)
def openai_chunks(n: int, chat: bool) -> tuple[bytes, ...]:
    """OpenAI's stream of n tokens: one text delta per chunk, then a usage chunk."""
    kind = "chat.completion.chunk" if chat else "text_completion"
    head = {"id": "fake", "object": kind, "created": 0, "model": "fake"}
    choice = {"index": 0, "delta": {"content": TOKEN_TEXT}} if chat else {"index": 0, "text": TOKEN_TEXT}
    out = [_sse({**head, "choices": [{**choice, "finish_reason": None}]}) for _ in range(n)]
    usage = {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": n, "total_tokens": PROMPT_TOKENS + n,
             "prompt_tokens_details": {"cached_tokens": 0}}
    out.append(_sse({**head, "choices": [], "usage": usage}))
    return tuple(out)


DONE_CHUNK = b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"
SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def _json_response(body: bytes, status: str = "200 OK") -> bytes:
    return b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        status.encode(), len(body), body)


@dataclass
class _Stream:
    writer: asyncio.StreamWriter
    chunks: tuple[bytes, ...]
    done: asyncio.Future
    sent: int = 0


class FakeServer:
    """Every `step_s` (0: every loop turn) one chunk to each open stream, the way a server's decode step emits one
    token per running request; a stream whose socket still holds 1 MiB unsent waits for the next step."""

    def __init__(self, step_s: float = 0.0):
        if step_s < 0:
            raise ValueError(f"step_s must be >= 0, got {step_s}")
        self.step_s = step_s
        self.streams: list[_Stream] = []
        self.wake = asyncio.Event()

    async def ticker(self) -> None:
        while True:
            if not self.streams:
                self.wake.clear()
                await self.wake.wait()
            keep = []
            for st in self.streams:
                if st.writer.transport.get_write_buffer_size() < (1 << 20):
                    st.writer.write(st.chunks[st.sent])
                    st.sent += 1
                if st.sent < len(st.chunks):
                    keep.append(st)
                else:
                    st.writer.write(DONE_CHUNK)
                    st.done.set_result(None)
            self.streams = keep
            await asyncio.sleep(self.step_s)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                request_line, *header_lines = head.decode("latin-1").split("\r\n")
                _, path, _ = request_line.split(" ", 2)
                length = 0
                for h in header_lines:
                    name, _, value = h.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                body = orjson.loads(await reader.readexactly(length)) if length else {}
                if path == "/generate":
                    chunks = native_chunks(int(body["sampling_params"]["max_new_tokens"]))
                elif path in ("/v1/completions", "/v1/chat/completions"):
                    chunks = openai_chunks(int(body["max_tokens"]), path.endswith("chat/completions"))
                else:
                    writer.write(_json_response(b"{}"))  # /model_info, /flush_cache: nothing to report
                    continue
                writer.write(SSE_HEAD)
                st = _Stream(writer, chunks, asyncio.get_running_loop().create_future())
                self.streams.append(st)
                self.wake.set()
                await st.done
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def serve(self, host: str, port: int, ready: asyncio.Event | None = None) -> None:
        tick = asyncio.create_task(self.ticker())
        server = await asyncio.start_server(self.handle, host, port, backlog=1024)
        try:
            async with server:
                if ready is not None:
                    ready.set()
                await server.serve_forever()
        finally:
            tick.cancel()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--step-ms", type=float, default=0.0, help="one chunk per stream every step (0: every loop turn)")
    args = p.parse_args(argv)
    from radixlm.bench.serving import run_async

    async def run() -> None:
        await FakeServer(args.step_ms / 1000).serve(args.host, args.port)

    run_async(run())


if __name__ == "__main__":
    main()
