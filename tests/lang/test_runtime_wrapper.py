"""sgl.Runtime's own request methods, as SGLang documents them, against a scripted server (no process started):
`generate` answers with /generate's JSON as a string, `async_generate` (alias `add_request`) streams text pieces."""
import asyncio
import json

import httpx

from radixlm.lang.backend.runtime_endpoint import RuntimeEndpoint
from radixlm.lang.runtime import Runtime

MODEL_INFO = {"model_path": "default", "tokenizer_path": "/nonexistent"}


def scripted_runtime(handler) -> Runtime:
    rt = object.__new__(Runtime)  # the server is scripted: nothing to launch
    rt.url, rt.generate_url, rt.proc = "http://test", "http://test/generate", None
    rt.transport = httpx.MockTransport(handler)
    rt.endpoint = RuntimeEndpoint(rt.url, transport=httpx.MockTransport(handler))
    return rt


def test_generate_returns_the_json_string():
    bodies = []

    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/get_model_info":
            return httpx.Response(200, json=MODEL_INFO)
        bodies.append(json.loads(req.content))
        return httpx.Response(200, json={"text": " Paris", "meta_info": {"completion_tokens": 1}})

    rt = scripted_runtime(handler)
    out = rt.generate("The capital of France is", {"temperature": 0, "max_new_tokens": 4}, top_logprobs_num=2)
    assert isinstance(out, str)
    assert json.loads(out)["text"] == " Paris"
    assert bodies[0]["text"] == "The capital of France is"
    assert bodies[0]["sampling_params"] == {"temperature": 0, "max_new_tokens": 4}
    assert bodies[0]["top_logprobs_num"] == 2 and bodies[0]["return_logprob"] is False


def test_async_generate_and_add_request_stream_text_pieces():
    bodies = []

    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/get_model_info":
            return httpx.Response(200, json=MODEL_INFO)
        bodies.append(json.loads(req.content))
        events = [{"text": t, "meta_info": {}} for t in ("Once", "Once upon", "Once upon a")]
        sse = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        return httpx.Response(200, content=sse.encode(), headers={"content-type": "text/event-stream"})

    rt = scripted_runtime(handler)

    async def collect(gen):
        return [piece async for piece in gen]

    assert asyncio.run(collect(rt.async_generate("Tell", {"max_new_tokens": 3}))) == ["Once", " upon", " a"]
    assert asyncio.run(collect(rt.add_request("Tell", {"max_new_tokens": 3}))) == ["Once", " upon", " a"]
    assert bodies[0]["stream"] is True and bodies[0]["text"] == "Tell"
