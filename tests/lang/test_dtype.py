"""`gen(dtype=...)`, gen_int and gen_string: the constraint each becomes, and SGLang's JSON-building programs."""
import json
import re
import sys
from types import SimpleNamespace

import httpx
import pytest

import radixlm as sgl
from radixlm.lang.backend.runtime_endpoint import RuntimeEndpoint
from radixlm.lang.ir import REGEX_BOOL, REGEX_FLOAT, REGEX_INT, REGEX_STR

# SGLang's string contract: quoted word characters, digits and whitespace (its REGEX_STR).
SGLANG_STRINGS = ['"Paris"', '""', '"St Louis"', '"New York 10001"', '"snake_case"', '"two\nlines"', '"tab\there"']
NOT_SGLANG_STRINGS = ["Paris", '"Paris', 'Paris"', '"a"b"', '"St. Louis"', '", "', '"{city_name}{city_address}"',
                      '"say \\"hi\\""', '"UTC+01:00"']


def test_sglangs_regexes():
    assert REGEX_INT == r"[-+]?[0-9]+[ \n]*"
    assert REGEX_FLOAT == r"[-+]?[0-9]*\.?[0-9]+[ \n]*"
    assert REGEX_BOOL == r"(True|False)"
    assert REGEX_STR == r'"[\w\d\s]*"'


@pytest.mark.parametrize("text", SGLANG_STRINGS)
def test_str_regex_accepts_sglangs_strings(text):
    assert re.fullmatch(REGEX_STR, text)


@pytest.mark.parametrize("text", NOT_SGLANG_STRINGS)
def test_str_regex_rejects_punctuation_and_unquoted_text(text):
    assert not re.fullmatch(REGEX_STR, text)


def test_the_runtimes_grammar_engine_reads_the_str_regex_the_same_way():
    xgr = pytest.importorskip("xgrammar")
    from xgrammar.testing import _is_grammar_accept_string

    grammar = xgr.Grammar.from_regex(REGEX_STR)
    assert all(_is_grammar_accept_string(grammar, t) for t in SGLANG_STRINGS)
    assert not any(_is_grammar_accept_string(grammar, t) for t in NOT_SGLANG_STRINGS)


class ConstrainedServer:
    """A /generate that answers each request with the first candidate its regex admits (as constrained
    decoding would); the request bodies are kept."""

    CANDIDATES = ['"Lyon"', "522000", "48", "45.76"]

    def __init__(self) -> None:
        self.bodies: list[dict] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/get_model_info":
            return httpx.Response(200, json={"model_path": "default", "tokenizer_path": "/nonexistent"})
        body = json.loads(request.content)
        self.bodies.append(body)
        regex = body["sampling_params"].get("regex")
        text = next(c for c in self.CANDIDATES if regex is None or re.fullmatch(regex, c))
        return httpx.Response(200, json={"text": text, "meta_info": {}})


def constrained_endpoint() -> tuple[RuntimeEndpoint, ConstrainedServer]:
    srv = ConstrainedServer()
    return RuntimeEndpoint("http://test", transport=httpx.MockTransport(srv)), srv


def test_typed_gens_build_valid_json():
    # As in SGLang's JSON-decoding test: the quotes around string values come from gen_string itself.
    @sgl.function
    def city(s):
        s += "A French city as JSON:\n"
        with s.var_scope("record"):
            s += "{"
            s += '"city": ' + sgl.gen_string() + ", "
            s += '"inhabitants": ' + sgl.gen_int() + ", "
            s += '"area_km2": ' + sgl.gen(dtype=int) + ", "
            s += '"region": ' + sgl.gen(dtype=str)
            s += "}"

    be, srv = constrained_endpoint()
    state = city.run(max_new_tokens=32, backend=be)
    assert json.loads(state["record"]) == {"city": "Lyon", "inhabitants": 522000, "area_km2": 522000,
                                           "region": "Lyon"}
    params = [b["sampling_params"] for b in srv.bodies]
    assert [p["regex"] for p in params] == [REGEX_STR, REGEX_INT, REGEX_INT, REGEX_STR]
    # int (and float) also stop at a space or newline; str ends at its closing quote.
    assert [" " in p["stop"] and "\n" in p["stop"] for p in params] == [False, True, True, False]


def test_the_regex_constants_build_valid_json():
    @sgl.function
    def city(s):
        with s.var_scope("record"):
            s += '{"city": ' + sgl.gen(regex=REGEX_STR) + ", "
            s += '"inhabitants": ' + sgl.gen(regex=REGEX_INT, stop=[" ", "\n"]) + ", "
            s += '"latitude": ' + sgl.gen(regex=REGEX_FLOAT, stop=[" ", "\n"]) + "}"

    be, _ = constrained_endpoint()
    obj = json.loads(city.run(temperature=0, backend=be)["record"])
    assert obj == {"city": "Lyon", "inhabitants": 522000, "latitude": 522000}


def fake_completion_model(reply: str):
    be = sgl.OpenAI("fake", is_chat_model=False, base_url="http://127.0.0.1:9/v1", api_key="unused")
    requests = []

    def create(**kw):
        requests.append(kw)
        return SimpleNamespace(id="x", choices=[SimpleNamespace(text=reply, finish_reason="stop", index=0)],
                               usage=SimpleNamespace(prompt_tokens=1, completion_tokens=1))

    be.client = SimpleNamespace(completions=SimpleNamespace(create=create))
    return be, requests


def test_openai_completion_model_gen_string_is_quoted():
    # As SGLang's OpenAI backend: the prompt opens the quote and the reply is closed with one.
    be, requests = fake_completion_model("Paris")

    @sgl.function
    def prog(s):
        s += '{"name": ' + sgl.gen_string("name", max_tokens=8, stop="}") + "}"

    state = prog.run(backend=be)
    assert state["name"] == '"Paris"' and json.loads(state.text()) == {"name": "Paris"}
    assert requests[0]["prompt"] == '{"name": "' and requests[0]["stop"] == ['"', "\n"]
    assert requests[0]["max_tokens"] == 8


def test_openai_backend_refuses_other_constraints():
    be, _ = fake_completion_model("1")

    @sgl.function
    def prog(s):
        s += sgl.gen("n", regex=REGEX_INT)

    with pytest.raises(sgl.ProgramError, match="cannot constrain decoding"):
        prog.run(backend=be)["n"]


class FakeEncoding:
    """tiktoken's Encoding as far as the int logit bias reads it: ranks of byte tokens and the end of text."""

    eot_token = 100257
    _mergeable_ranks = {b"a": 0, b"1": 1, b" ": 2, b"23": 3, b"x9": 4, b" 4": 5, b"\xc2": 6,
                        **{str(k).encode() * 3: 10 + k for k in range(400)}}


def test_openai_completion_model_gen_int_biases_digit_tokens(monkeypatch):
    # As SGLang's OpenAI backend: a +100 logit bias on (at most 299) digit-only or space tokens and the end of
    # text, the reply ending at a space.
    encodings = []
    monkeypatch.setitem(sys.modules, "tiktoken", SimpleNamespace(
        encoding_for_model=lambda name: encodings.append(name) or FakeEncoding(), get_encoding=None))
    be, requests = fake_completion_model("1969")

    @sgl.function
    def prog(s):
        s += "Landing year: " + sgl.gen_int("year", max_tokens=6, stop="\n") + "\n"
        s += "Again: " + sgl.gen("again", dtype=int)

    state = prog.run(backend=be)
    assert state["year"] == "1969" and state.text() == "Landing year: 1969\nAgain: 1969"
    bias = requests[0]["logit_bias"]
    assert len(bias) == 300 and set(bias.values()) == {100}
    assert {1, 2, 3, FakeEncoding.eot_token} <= set(bias) and not {0, 4, 5, 6} & set(bias)
    assert requests[0]["stop"] == [" "] and requests[0]["max_tokens"] == 6
    assert requests[0]["prompt"] == "Landing year: " and requests[1]["logit_bias"] == bias
    assert encodings == ["fake"]  # built once per backend


def test_openai_gen_int_without_tiktoken_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "tiktoken", None)
    be, _ = fake_completion_model("1")

    @sgl.function
    def prog(s):
        s += sgl.gen_int("n")

    with pytest.raises(sgl.ProgramError, match="tiktoken"):
        prog.run(backend=be)["n"]


def test_openai_backend_picks_the_chat_template_by_model_name():
    # As SGLang's OpenAI backend: the template follows the model name, so a completion model served through an
    # OpenAI-compatible API gets its own chat format for a program's roles.
    assert sgl.OpenAI("gpt-4o-mini", api_key="unused").get_chat_template().name == "default"
    be = sgl.OpenAI("meta-llama/Meta-Llama-3-8B-Instruct", is_chat_model=False, base_url="http://127.0.0.1:9/v1",
                    api_key="unused")
    fake, requests = fake_completion_model("Hi")
    be.client = fake.client

    @sgl.function
    def prog(s):
        s += sgl.user("Hello") + sgl.assistant(sgl.gen("a", max_tokens=4))

    assert prog.run(backend=be)["a"] == "Hi"
    assert requests[0]["prompt"] == ("<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
                                     "<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert "<|eot_id|>" in requests[0]["stop"]


@pytest.mark.parametrize("model, field", [("o1-mini", "max_completion_tokens"), ("o3-mini", "max_completion_tokens"),
                                          ("gpt-4o", "max_tokens")])
def test_openai_reasoning_models_get_max_completion_tokens(model, field):
    # As SGLang's OpenAI backend: o1/o3 models are sent max_completion_tokens instead of max_tokens.
    be = sgl.OpenAI(model, base_url="http://127.0.0.1:9/v1", api_key="unused")
    requests = []
    be.client = SimpleNamespace(chat=SimpleNamespace(completions=SimpleNamespace(
        create=lambda **kw: requests.append(kw) or SimpleNamespace(
            id="x", choices=[SimpleNamespace(message=SimpleNamespace(content="4"), finish_reason="stop", index=0)],
            usage=SimpleNamespace(prompt_tokens=1, completion_tokens=1)))))

    @sgl.function
    def prog(s):
        s += sgl.user("2+2?") + sgl.assistant(sgl.gen("a", max_tokens=16))

    assert prog.run(backend=be)["a"] == "4"
    assert requests[0][field] == 16 and len({"max_tokens", "max_completion_tokens"} & set(requests[0])) == 1
