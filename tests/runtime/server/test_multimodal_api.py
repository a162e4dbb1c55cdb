"""Images through the three APIs against a real server on the tiny LLaVA: native image_data, OpenAI image_url content
parts (real openai SDK), Anthropic image blocks (real anthropic SDK); local files only under the allowed directory,
http URLs only from allowed domains; bad media is a 400 in each API's own shape and the server keeps serving."""
from __future__ import annotations

import base64
import http.server
import threading

import anthropic
import openai
import pytest

from tests.runtime.models.tiny_llava import IMAGE_TOKEN, NUM_IMAGE_TOKENS, hf_greedy_with_image, png, save_tiny_llava
from tests.runtime.server.conftest import start_server, stop_server

pytestmark = pytest.mark.slow

NEW = 6
B64 = base64.b64encode(png(1)).decode()
DATA_URL = f"data:image/png;base64,{B64}"
CORRUPT = base64.b64encode(b"not an image at all").decode()


@pytest.fixture(scope="module")
def media_server():
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = png(3)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    model = tmp_path_factory.mktemp("llava")
    hf = save_tiny_llava(model, seed=3)
    media = tmp_path_factory.mktemp("media")
    (media / "a.png").write_bytes(png(2))
    h = start_server("--model-path", str(model), "--allowed-local-media-path", str(media),
                     "--allowed-media-domains", "127.0.0.1")
    try:
        yield h, hf, model, media
    finally:
        stop_server(h)


def _generate(server, **body):
    return server.client.post("/generate", json={"sampling_params": {"temperature": 0, "max_new_tokens": NEW,
                                                                     "ignore_eos": True}, **body})


def test_native_image_data_matches_transformers(setup, media_server):
    server, hf, model, media = setup
    prompt = f"t5 t9 {IMAGE_TOKEN} t7"
    ids = [5, 9, 95, 7]
    for source, raw in [(B64, png(1)), (DATA_URL, png(1)), (str(media / "a.png"), png(2)),
                        (f"http://127.0.0.1:{media_server}/x.png", png(3))]:
        r = _generate(server, text=prompt, image_data=source)
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["output_ids"] == hf_greedy_with_image(hf, model, ids, [raw], NEW)
        assert out["meta_info"]["prompt_tokens"] == 3 + NUM_IMAGE_TOKENS
    again = _generate(server, text=prompt, image_data=B64).json()
    assert again["meta_info"]["cached_tokens"] == 2 + NUM_IMAGE_TOKENS


@pytest.mark.parametrize("image, message", [
    (CORRUPT, "cannot decode the image"),
    ("/etc/hostname", "outside the allowed directory"),
    ("http://localhost:9/x.png", "not in the allowed media domains"),
    ("data:image/png;base64,@@@", "base64"),
])
def test_native_bad_media_is_a_400(setup, image, message):
    server = setup[0]
    r = _generate(server, text=f"t5 {IMAGE_TOKEN} t7", image_data=image)
    assert r.status_code == 400 and r.json()["object"] == "error" and message in r.json()["message"]
    assert _generate(server, text="t5 t7").status_code == 200  # still serving


def test_native_placeholder_count_must_match(setup):
    r = _generate(setup[0], text="t5 t7", image_data=B64)
    assert r.status_code == 400 and "placeholder" in r.json()["message"]


def test_openai_image_url(setup):
    server, hf, model, _ = setup
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0, timeout=60)
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": DATA_URL}},
                                             {"type": "text", "text": "t5 t6"}]}]
    kw = dict(model="m", messages=messages, max_tokens=NEW, temperature=0, extra_body={"ignore_eos": True})
    first = client.chat.completions.create(**kw)
    second = client.chat.completions.create(**kw)
    # the chat template: "user <image>\nt5 t6 t1 " ("user" is the unknown word t0)
    assert first.choices[0].message.content == hf_text(hf, model, [0, 95, 5, 6, 1], png(1))
    assert first.usage.prompt_tokens == 4 + NUM_IMAGE_TOKENS
    assert second.usage.prompt_tokens_details.cached_tokens == 3 + NUM_IMAGE_TOKENS
    bad = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + CORRUPT}},
                                        {"type": "text", "text": "t5"}]}]
    with pytest.raises(openai.BadRequestError, match="cannot decode the image"):
        client.chat.completions.create(model="m", messages=bad, max_tokens=2)
    assert client.chat.completions.create(**kw).choices[0].message.content == first.choices[0].message.content


def test_anthropic_image_block(setup):
    server, hf, model, _ = setup
    client = anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0, timeout=60)
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": B64}}
    msg = client.messages.create(model="m", max_tokens=NEW, extra_body={"temperature": 0},
                                 messages=[{"role": "user", "content": [block, {"type": "text", "text": "t5 t6"}]}])
    # blocks joined by newlines: "user <image>\nt5 t6 t1 "
    assert msg.content[0].text == hf_text(hf, model, [0, 95, 5, 6, 1], png(1), eos=2)
    count = client.messages.count_tokens(model="m", messages=[{"role": "user", "content": [block]}])
    assert count.input_tokens == 2 + NUM_IMAGE_TOKENS  # "user <image> t1 "
    corrupt = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": CORRUPT}}
    with pytest.raises(anthropic.BadRequestError, match="cannot decode the image"):
        client.messages.create(model="m", max_tokens=2, messages=[{"role": "user", "content": [corrupt]}])


def hf_text(hf, model, ids, image, eos: int | None = None) -> str:
    toks = hf_greedy_with_image(hf, model, ids, [image], NEW)
    if eos in toks:
        toks = toks[: toks.index(eos)]
    return " ".join(f"t{t}" for t in toks)


@pytest.fixture(scope="module")
def qwen2_vl(tmp_path_factory):
    """(checkpoint directory, transformers' model, server) of one tiny Qwen2-VL, for the image and the video tests."""
    from tests.runtime.models.tiny_qwen2_vl import save_tiny_qwen2_vl

    model = tmp_path_factory.mktemp("qwen2_vl")
    hf = save_tiny_qwen2_vl(model, seed=7)
    h = start_server("--model-path", str(model))
    yield model, hf, h
    stop_server(h)


def test_qwen2_vl_through_openai_and_a_program(qwen2_vl):
    """Qwen2-VL's image text (<|vision_start|><|image_pad|><|vision_end|>) through the chat template and sgl.image."""
    import radixlm as sgl
    from tests.runtime.models.tiny_qwen2_vl import hf_greedy

    model, hf, h = qwen2_vl
    client = openai.OpenAI(base_url=f"{h.base_url}/v1", api_key="x", max_retries=0, timeout=60)
    out = client.chat.completions.create(
        model="m", max_tokens=NEW, temperature=0, extra_body={"ignore_eos": True},
        messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": DATA_URL}},
                                               {"type": "text", "text": "t5 t6"}]}])
    # "user <|vision_start|><|image_pad|><|vision_end|>\nt5 t6 t1 "
    ref, _ = hf_greedy(hf, model, [0, 96, 97, 99, 5, 6, 1], [png(1)], NEW)
    assert out.choices[0].message.content == " ".join(f"t{t}" for t in ref)

    @sgl.function
    def describe(s):
        s += sgl.user(sgl.image(png(1)) + "t5 t6")
        s += sgl.assistant(sgl.gen("answer", max_tokens=NEW, temperature=0, ignore_eos=True))

    backend = sgl.RuntimeEndpoint(h.base_url)
    try:
        state = describe.run(backend=backend)
        state.text()
    finally:
        backend.shutdown()
    assert "<|vision_start|><|image_pad|><|vision_end|>" in state.text() and state["answer"]


def test_qwen2_vl_video_through_native_and_openai(qwen2_vl):
    """video_data on /generate and video_url content parts (data URLs); a text-only model refuses videos."""
    from radixlm.runtime.model_loader.tokenizer import get_tokenizer
    from radixlm.runtime.multimodal.media import MediaLoader, MediaPolicy
    from radixlm.runtime.multimodal.processor import MultimodalProcessor
    from tests.runtime.models.tiny_qwen2_vl import VIDEO, hf_greedy_video, mp4

    model, hf, h = qwen2_vl
    video = mp4(3, frames=4)
    mm = MultimodalProcessor.for_model(str(model), get_tokenizer(str(model)), MediaLoader(MediaPolicy()))
    processed = mm.preprocess_video(mm.loader.load_video(video, 8))
    native = h.client.post("/generate", json={
        "text": f"t5 {VIDEO} t7", "video_data": base64.b64encode(video).decode(),
        "sampling_params": {"temperature": 0, "max_new_tokens": NEW, "ignore_eos": True}}).json()
    import torch

    assert native["output_ids"] == hf_greedy_video(hf, [5, 96, 98, 99, 7], processed.pixel_values,
                                                   torch.tensor(processed.grid_thw), NEW)
    client = openai.OpenAI(base_url=f"{h.base_url}/v1", api_key="x", max_retries=0, timeout=60)
    url = "data:video/mp4;base64," + base64.b64encode(video).decode()
    chat = client.chat.completions.create(
        model="m", max_tokens=NEW, temperature=0, extra_body={"ignore_eos": True},
        messages=[{"role": "user", "content": [{"type": "video_url", "video_url": {"url": url}},
                                               {"type": "text", "text": "t5"}]}])
    # "user <|vision_start|><|video_pad|><|vision_end|>\nt5 t1 "
    ref = hf_greedy_video(hf, [0, 96, 98, 99, 5, 1], processed.pixel_values, torch.tensor(processed.grid_thw), NEW)
    assert chat.choices[0].message.content == " ".join(f"t{t}" for t in ref)
    bad = h.client.post("/generate", json={"text": f"t5 {VIDEO}", "video_data": CORRUPT})
    assert bad.status_code == 400 and "cannot decode the video" in bad.json()["message"]


def test_llava_refuses_videos(setup):
    r = _generate(setup[0], text=f"t5 {IMAGE_TOKEN}", video_data=B64)
    assert r.status_code == 400 and "does not take videos" in r.json()["message"]
