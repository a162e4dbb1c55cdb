"""The LoRA routes over a real TokenizerManager whose scheduler is a fake on the other end of its sockets (no
process): /load_lora_adapter and /unload_lora_adapter answer SGLang's result, an unload answered later than a load
that follows it; adapters in /v1/models; every bad input a 400 in its API's error shape (native, OpenAI, Anthropic,
Responses)."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import httpx

from radixlm.runtime.args import ServerArgs
from radixlm.runtime.messages import LoadLoRAAdapterReqInput, LoRAUpdateOutput, UnloadLoRAAdapterReqInput
from radixlm.runtime.server.http_app import create_app
from radixlm.runtime.tokenizer_manager import TokenizerManager


class FakeScheduler:
    """Both sockets of the tokenizer manager: loads are answered at once (a path "/bad" fails), unloads when
    `release_unloads` is set (as the scheduler answers once the adapter's requests are done)."""

    def __init__(self) -> None:
        self.replies: asyncio.Queue = asyncio.Queue()
        self.release_unloads = asyncio.Event()
        self.sent: list = []

    def send_pyobj(self, msg, *flags) -> None:
        self.sent.append(msg)
        if isinstance(msg, LoadLoRAAdapterReqInput):
            ok = msg.lora_path != "/bad"
            self.replies.put_nowait(LoRAUpdateOutput(msg.lora_id, ok, None if ok else "cannot read /bad"))
        elif isinstance(msg, UnloadLoRAAdapterReqInput):
            async def later():
                await self.release_unloads.wait()
                self.replies.put_nowait(LoRAUpdateOutput(msg.lora_id, True))
            asyncio.get_running_loop().create_task(later())

    async def recv_pyobj(self):
        return await self.replies.get()


def _manager(fake: FakeScheduler) -> TokenizerManager:
    args = ServerArgs(model_path="base", enable_lora=True, lora_paths=["boot=/adapters/boot"])
    info = SimpleNamespace(vocab_size=100, context_len=64, max_total_num_tokens=512, model_path="/nonexistent",
                           embedding_dim=0)
    runtime = SimpleNamespace(server_args=args, info=info, dead_child=lambda: None)
    tokenizer = SimpleNamespace(decode=lambda ids, **_: " ".join(map(str, ids)), encode=lambda text, **_: [1, 2],
                                apply_chat_template=lambda messages, **_: "1 2")
    tm = TokenizerManager(runtime, tokenizer=tokenizer)
    tm.to_scheduler = tm.recv = fake
    tm.ready = True
    return tm


async def _scenario() -> None:
    fake = FakeScheduler()
    tm = _manager(fake)
    recv = asyncio.create_task(tm._recv_loop())
    app = create_app(tm)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        r = await c.post("/load_lora_adapter", json={"lora_name": "sql", "lora_path": "/adapters/sql"})
        assert r.status_code == 200 and r.json() == {"success": True, "error_message": None, "loaded_adapters": {
            "boot": "/adapters/boot", "sql": "/adapters/sql"}}
        models = (await c.get("/v1/models")).json()["data"]
        assert [m["id"] for m in models] == ["base", "boot", "sql"] and models[2]["parent"] == "base"
        assert (await c.get("/v1/models/sql")).json()["root"] == "/adapters/sql"

        bad = await c.post("/load_lora_adapter", json={"lora_name": "x", "lora_path": "/bad"})
        body = bad.json()
        assert bad.status_code == 400 and body["object"] == "error" and body["message"] == "cannot read /bad"
        assert body["success"] is False and "x" not in body["loaded_adapters"]
        for payload, message in [({"lora_name": "sql", "lora_path": "/p"}, "loaded already"),
                                 ({"lora_name": "a:b", "lora_path": "/p"}, "without ':'"),
                                 ({"lora_name": "y"}, "lora_path")]:
            r = await c.post("/load_lora_adapter", json=payload)
            assert r.status_code == 400 and r.json()["object"] == "error" and message in r.json()["message"]

        # Unknown adapters in each API's shape.
        r = await c.post("/generate", json={"input_ids": [1, 2], "lora_path": "nope"})
        assert r.status_code == 400 and r.json()["object"] == "error" and "unknown LoRA adapter" in r.json()["message"]
        r = await c.post("/v1/completions", json={"model": "base:nope", "prompt": [1, 2], "max_tokens": 2})
        assert r.status_code == 400 and "unknown LoRA adapter" in r.json()["error"]["message"]
        r = await c.post("/v1/completions", json={"model": "base", "lora_path": "nope", "prompt": [1, 2]})
        assert r.status_code == 400 and "unknown LoRA adapter" in r.json()["error"]["message"]
        chat = {"model": "base:nope", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
        for path in ("/v1/chat/completions", "/v1/messages"):
            r = await c.post(path, json=chat)
            assert r.status_code == 400 and "unknown LoRA adapter" in r.json()["error"]["message"], path
        assert r.json()["type"] == "error"  # Anthropic's shape
        r = await c.post("/v1/responses", json={"model": "base:nope", "input": "hi", "max_output_tokens": 2})
        assert r.status_code == 400 and "unknown LoRA adapter" in r.json()["error"]["message"]

        # An unload is answered when the scheduler is done with the adapter; a load meanwhile is answered first.
        unload = asyncio.create_task(c.post("/unload_lora_adapter", json={"lora_name": "sql"}))
        await asyncio.sleep(0.05)
        r = await c.post("/generate", json={"input_ids": [1, 2], "lora_path": "sql"})
        assert r.status_code == 400  # refused as soon as the unload began
        r = await c.post("/load_lora_adapter", json={"lora_name": "other", "lora_path": "/adapters/o"})
        assert r.status_code == 200 and not unload.done()
        fake.release_unloads.set()
        r = await unload
        assert r.status_code == 200 and r.json()["loaded_adapters"] == {"boot": "/adapters/boot", "other": "/adapters/o"}
        r = await c.post("/unload_lora_adapter", json={"lora_name": "sql"})
        assert r.status_code == 400 and "no LoRA adapter named 'sql'" in r.json()["message"]
    ids = [m.lora_id for m in fake.sent if isinstance(m, UnloadLoRAAdapterReqInput)]
    assert len(ids) == 1 and ids[0] not in {m.lora_id for m in fake.sent if isinstance(m, LoadLoRAAdapterReqInput)
                                            and m.lora_name != "sql"}
    recv.cancel()


def test_lora_routes():
    asyncio.run(_scenario())
