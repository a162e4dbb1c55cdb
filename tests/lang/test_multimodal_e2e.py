"""sgl.image in programs against `radixlm serve` on the tiny LLaVA: through RuntimeEndpoint (the native API: image_data,
the server's image placeholder in the text; fork shares the image prefix, which the frontend hint prefills once; select
sends the image with each choice) and through the OpenAI backend (image_url content parts to /v1/chat/completions)."""
from __future__ import annotations

import base64

import pytest

import radixlm as sgl
from tests.runtime.models.tiny_llava import NUM_IMAGE_TOKENS, png, save_tiny_llava
from tests.runtime.server.conftest import start_server, stop_server

pytestmark = pytest.mark.slow

GEN = dict(max_tokens=5, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    model = tmp_path_factory.mktemp("llava")
    save_tiny_llava(model, seed=3)
    images = tmp_path_factory.mktemp("images")
    for i in (1, 2):
        (images / f"{i}.png").write_bytes(png(i))
    h = start_server("--model-path", str(model))
    try:
        yield h, images
    finally:
        stop_server(h)


@sgl.function
def describe(s, image):
    s += sgl.user(sgl.image(image) + "t5 t6")
    s += sgl.assistant(sgl.gen("answer", **GEN))


@sgl.function
def two_questions(s, image, metas):
    s += sgl.user(sgl.image(image) + "t5 t6")
    forks = s.fork(2)
    for f, q in zip(forks, ["t7", "t8"]):
        f += q + sgl.gen("a", **GEN)
    forks.join()
    metas.extend(f.get_meta_info("a") for f in forks)
    s += sgl.select("pick", choices=["t11", "t12 t13"])


def test_runtime_endpoint(served):
    server, images = served
    backend = sgl.RuntimeEndpoint(server.base_url)
    try:
        state = describe.run(image=str(images / "1.png"), backend=backend)
        other = describe.run(image=str(images / "2.png"), backend=backend)
        state.text(), other.text()  # finished before the backend closes
    finally:
        backend.shutdown()
    prompt = state.text()[: -len(state["answer"])]
    assert prompt.count(" <image>\n") == 1  # the server's placeholder, from /model_info
    ref = server.client.post("/generate", json={
        "text": prompt, "image_data": base64.b64encode(png(1)).decode(),
        "sampling_params": {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True}}).json()
    assert state["answer"] == ref["text"] and state["answer"]
    assert other["answer"] != state["answer"]  # the answer depends on the image


def test_fork_shares_the_image_prefix_and_select_sends_the_image(served):
    server, images = served
    backend = sgl.RuntimeEndpoint(server.base_url)
    metas: list[dict] = []
    try:
        server.client.post("/flush_cache")
        state = two_questions.run(image=str(images / "1.png"), metas=metas, backend=backend)
        state.text()
    finally:
        backend.shutdown()
    assert len(state["a"]) == 2 and all(state["a"])
    # The fork's hint prefilled "USER: <image> t5 t6" once; both branches found it (and its image) cached.
    assert [m["cached_tokens"] >= 3 + NUM_IMAGE_TOKENS for m in metas] == [True, True]
    assert state["pick"] in ("t11", "t12 t13")


def test_openai_backend_sends_content_parts(served):
    server, images = served
    backend = sgl.OpenAI("m", base_url=f"{server.base_url}/v1", api_key="x", max_retries=0)
    state = describe.run(image=str(images / "1.png"), backend=backend)
    chat = server.client.post("/v1/chat/completions", json={
        "model": "m", "max_tokens": 5, "temperature": 0, "ignore_eos": True, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(png(1)).decode()}},
            {"type": "text", "text": "t5 t6"}]}]}).json()
    assert state["answer"] == chat["choices"][0]["message"]["content"] and state["answer"]
    assert chat["usage"]["prompt_tokens"] > NUM_IMAGE_TOKENS


def test_video_through_runtime_endpoint(tmp_path_factory):
    """sgl.video(path, num_frames) on a Qwen2-VL server: the server's video placeholder, the frame count honoured."""
    from tests.runtime.models.tiny_qwen2_vl import mp4, save_tiny_qwen2_vl

    model = tmp_path_factory.mktemp("qwen2_vl")
    save_tiny_qwen2_vl(model, seed=7)
    clip = model / "clip.mp4"
    clip.write_bytes(mp4(3, frames=8))

    @sgl.function
    def watch(s, frames):
        s += sgl.user(sgl.video(str(clip), num_frames=frames) + "t5")
        s += sgl.assistant(sgl.gen("answer", **GEN))

    h = start_server("--model-path", str(model))
    backend = sgl.RuntimeEndpoint(h.base_url)
    try:
        two, eight = watch.run(frames=2, backend=backend), watch.run(frames=8, backend=backend)
        two.text(), eight.text()
    finally:
        backend.shutdown()
        stop_server(h)
    assert "<|vision_start|><|video_pad|><|vision_end|>" in two.text()
    # 2 frames make one temporal patch, 8 make four; a 40x32 frame is 10x8 patches, 20 tokens after 2x2 merging
    n2, n8 = two.get_meta_info("answer")["prompt_tokens"], eight.get_meta_info("answer")["prompt_tokens"]
    assert n8 - n2 == 3 * 20
