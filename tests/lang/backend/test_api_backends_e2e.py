"""The OpenAI and Anthropic backends (their real SDKs) against radixlm's own /v1 endpoints."""
from __future__ import annotations

import pytest

import radixlm as sgl

pytestmark = pytest.mark.slow


@pytest.fixture
def oai_chat(runtime):
    return sgl.OpenAI("default", base_url=runtime.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture
def oai_completion(runtime):
    return sgl.OpenAI("default", is_chat_model=False, base_url=runtime.url + "/v1", api_key="unused",
                      max_retries=0)


@pytest.fixture
def claude(runtime):
    return sgl.Anthropic("default", base_url=runtime.url, api_key="unused", max_retries=0)


@sgl.function
def chat(s, question):
    s += sgl.system("Answer in one short sentence.")
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=8))


def test_openai_chat_model(oai_chat):
    state = chat.run(question="What is the capital of France?", temperature=0, backend=oai_chat)
    assert "paris" in state["answer"].lower()
    assert [m["role"] for m in state.messages()] == ["system", "user", "assistant"]
    assert oai_chat.token_usage.prompt_tokens > 10 and 1 <= oai_chat.token_usage.completion_tokens <= 8


def test_openai_chat_streaming(oai_chat):
    state = chat.run(question="Name a fruit.", temperature=0, stream=True, backend=oai_chat)
    pieces = list(state.text_iter("answer"))
    assert pieces and "".join(pieces) == state["answer"]


def test_openai_chat_gen_must_follow_assistant(oai_chat):
    @sgl.function
    def bad(s):
        s += sgl.user("hi")
        s += sgl.gen("x", max_tokens=2)

    with pytest.raises(sgl.ProgramError, match="right after sgl.assistant"):
        bad.run(backend=oai_chat)["x"]


def test_openai_completion_model_and_select_matches_runtime_endpoint(oai_completion, backend):
    @sgl.function
    def qa(s):
        s += "Q: What is the capital of Germany?\nA: Berlin\nQ: What is the capital of France?\nA:"
        s += sgl.gen("answer", max_tokens=4, stop="\n")

    assert "paris" in qa.run(temperature=0, backend=oai_completion)["answer"].lower()

    @sgl.function
    def pick(s):
        s += "The capital of France is" + sgl.select("city", [" Paris", " London"])

    via_openai = pick.run(backend=oai_completion)
    via_native = pick.run(backend=backend)
    assert via_openai["city"] == via_native["city"] == " Paris"
    assert via_openai.get_meta_info("city")["normalized_prompt_logprobs"] == pytest.approx(
        via_native.get_meta_info("city")["normalized_prompt_logprobs"], abs=1e-3)


def test_openai_chat_model_cannot_select(oai_chat):
    @sgl.function
    def pick(s):
        s += sgl.user("Pick one") + sgl.assistant(sgl.select("x", ["a", "b"]))

    with pytest.raises(sgl.ProgramError, match="chat endpoints"):
        pick.run(backend=oai_chat).sync()


def test_anthropic_backend(claude):
    state = chat.run(question="What is the capital of France?", temperature=0, backend=claude)
    assert "paris" in state["answer"].lower()
    assert claude.token_usage.prompt_tokens > 10
    streamed = chat.run(question="What is the capital of France?", temperature=0, stream=True, backend=claude)
    assert "".join(streamed.text_iter("answer")) == state["answer"]
