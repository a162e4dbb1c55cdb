"""select on an OpenAI completion model whose endpoint refuses echoed prompt logprobs (OpenAI's own instruct
models): SGLang's biased one-token steps over the choices' tokens (tiktoken ids), against a scripted client."""
import sys
from types import SimpleNamespace

import httpx
import openai
import pytest

import radixlm as sgl


class CharEncoding:
    """A stand-in tiktoken encoding: one token per character, its code point."""

    def encode(self, text):
        return [ord(c) for c in text]


def instruct_backend(picks):
    """A completion model that refuses echo+logprobs and answers each biased one-token request with `picks`."""
    be = sgl.OpenAI("gpt-3.5-turbo-instruct", base_url="http://127.0.0.1:9/v1", api_key="unused")
    requests = []

    def create(**kw):
        requests.append(kw)
        if kw.get("echo"):
            raise openai.BadRequestError("echo and logprobs together are not supported", body=None,
                                         response=httpx.Response(400, request=httpx.Request("POST", "http://x")))
        text = picks.pop(0)
        assert ord(text) in kw["logit_bias"] and set(kw["logit_bias"].values()) == {100} and kw["max_tokens"] == 1
        return SimpleNamespace(id="x", choices=[SimpleNamespace(text=text, finish_reason="length", index=0)],
                               usage=SimpleNamespace(prompt_tokens=1, completion_tokens=1))

    be.client = SimpleNamespace(completions=SimpleNamespace(create=create))
    return be, requests


@pytest.fixture(autouse=True)
def fake_tiktoken(monkeypatch):
    monkeypatch.setitem(sys.modules, "tiktoken", SimpleNamespace(encoding_for_model=lambda name: CharEncoding()))


def test_one_step_decides_between_different_first_tokens():
    be, requests = instruct_backend(["F"])

    @sgl.function
    def judge(s):
        s += "Statement: The capital of Canada is Tokyo.\nAnswer:" + sgl.select("answer", ["True", "False", "Unknown"])

    state = judge.run(backend=be)
    assert state["answer"] == "False" and state.text().endswith("Answer:False")
    assert state.get_meta_info("answer") == {"scores": [0, 1, 0]}
    step = requests[1]
    assert set(step["logit_bias"]) == {ord("T"), ord("F"), ord("U")} and step["temperature"] == 0.0
    assert step["prompt"] == [ord(c) for c in "Statement: The capital of Canada is Tokyo.\nAnswer:"]


def test_shared_first_tokens_take_more_steps_with_the_pick_appended():
    be, requests = instruct_backend(["a", "c"])

    @sgl.function
    def pick(s):
        s += "x" + sgl.select("v", ["ab", "ac", "d"])

    assert pick.run(backend=be)["v"] == "ac"
    assert requests[2]["prompt"] == [ord("x"), ord("a")] and set(requests[2]["logit_bias"]) == {ord("b"), ord("c")}


def test_other_endpoint_errors_are_not_swallowed():
    be, _ = instruct_backend([])
    be.client = SimpleNamespace(completions=SimpleNamespace(create=lambda **kw: (_ for _ in ()).throw(
        openai.APIConnectionError(request=httpx.Request("POST", "http://x")))))

    @sgl.function
    def judge(s):
        s += "A:" + sgl.select("answer", ["yes", "no"])

    with pytest.raises(sgl.ProgramError, match="OpenAI request failed"):
        judge.run(backend=be)["answer"]
