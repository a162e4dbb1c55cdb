"""Structured output over HTTP: OpenAI `response_format` through the SDK, the native regex / json_schema / ebnf
sampling params, invalid specs answered 400 (the scheduler never sees them), and constrained requests running
concurrently with unconstrained ones."""
from __future__ import annotations

import asyncio
import json
import re

import httpx
import jsonschema
import openai
import pytest

from tests.runtime.grammar.cases import REGEXES, SCHEMAS

pytestmark = pytest.mark.slow

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"]}
ASK = [{"role": "user", "content": "Describe a person named Alice who is 30 as JSON."}]


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    c = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0, timeout=120)
    yield c
    c.close()


def test_response_format_json_schema(client):
    out = client.chat.completions.create(
        model="default", messages=ASK, max_tokens=64, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
    choice = out.choices[0]
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), PERSON)


def test_response_format_json_object_streamed(client):
    ask = [{"role": "user", "content": "Is the sky blue? Answer as a JSON object with one boolean field."}]
    stream = client.chat.completions.create(model="default", messages=ask, max_tokens=96, temperature=0, stream=True,
                                            response_format={"type": "json_object"})
    chunks = [c for c in stream if c.choices]
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop", text
    assert isinstance(json.loads(text), dict)


def test_completions_with_regex_extra(client):
    out = client.completions.create(model="default", prompt=REGEXES[0][0], max_tokens=20, temperature=0,
                                    extra_body={"regex": REGEXES[0][1]})
    assert re.fullmatch(REGEXES[0][1], out.choices[0].text)


def test_native_generate_constraints(server):
    c = server.client
    body = {"text": ["Reply in JSON: ", "Today's date: "],
            "sampling_params": [{"temperature": 0, "max_new_tokens": 64, "json_schema": PERSON},
                                {"temperature": 0, "max_new_tokens": 16, "regex": REGEXES[1][1]}]}
    person, date = c.post("/generate", json=body).json()
    jsonschema.validate(json.loads(person["text"]), PERSON)
    assert re.fullmatch(REGEXES[1][1], date["text"])
    out = c.post("/generate", json={"text": "Animal: ", "sampling_params": {
        "temperature": 0, "max_new_tokens": 8, "ebnf": 'root ::= "cat" | "dog"'}}).json()
    assert out["text"] in ("cat", "dog")


@pytest.mark.parametrize("path, body, field", [
    ("/generate", {"text": "x", "sampling_params": {"regex": "(unclosed"}}, "regex"),
    ("/generate", {"text": "x", "sampling_params": {"json_schema": '{"type": "objectx"}'}}, "json_schema"),
    ("/generate", {"text": "x", "sampling_params": {"json_schema": "{nope"}}, "json_schema"),
    ("/generate", {"text": "x", "sampling_params": {"ebnf": "root ::= "}}, "ebnf"),
    ("/generate", {"text": "x", "sampling_params": {"regex": "a", "ebnf": 'root ::= "a"'}}, "only one"),
    ("/v1/chat/completions", {"messages": ASK, "response_format": {"type": "json_schema"}}, "json_schema"),
    ("/v1/chat/completions", {"messages": ASK, "response_format": {"type": "xml"}}, "response_format"),
    ("/v1/chat/completions", {"messages": ASK, "response_format": {"type": "json_schema", "json_schema": {
        "name": "bad", "schema": {"type": "objectx"}}}}, "json_schema"),
    ("/v1/chat/completions", {"messages": ASK, "regex": "a", "response_format": {"type": "json_object"}}, "response_format"),
    ("/v1/completions", {"prompt": "x", "regex": "[a-"}, "regex"),
])
def test_invalid_specs_are_400_and_the_server_stays_healthy(server, path, body, field):
    r = server.client.post(path, json=body)
    assert r.status_code == 400, r.text
    body = r.json()
    assert field.lower() in (body["error"] if path.startswith("/v1/") else body)["message"].lower()
    assert server.client.get("/health").status_code == 200


def test_concurrent_constrained_and_unconstrained(server):
    free = {"text": "The history of the printing press", "sampling_params": {"temperature": 0, "max_new_tokens": 24}}
    alone = server.client.post("/generate", json=free).json()["output_ids"]

    async def main():
        async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as c:
            constrained = [c.post("/generate", json={"text": f"Reply in JSON about {task}: ", "sampling_params": {
                "temperature": 0, "max_new_tokens": 160, "json_schema": schema}}) for task, schema in SCHEMAS[:6]]
            return await asyncio.gather(c.post("/generate", json=free), *constrained)

    first, *rest = asyncio.run(main())
    assert first.json()["output_ids"] == alone
    for (_task, schema), r in zip(SCHEMAS[:6], rest):
        jsonschema.validate(json.loads(r.json()["text"]), schema)
