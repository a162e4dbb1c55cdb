"""API speculative execution (paper §5) with the OpenAI backend against radixlm's own /v1 completions: a
program extracting three fields from a description, with and without `num_api_spec_tokens`.

The birthday's label is "Born:" because SmolLM2-135M, asked for "Birthday:", often writes "Birthdate:" on its
own, which (correctly) costs an extra call: the speculated text no longer matches the program's constant."""
from __future__ import annotations

import pytest

import radixlm as sgl

pytestmark = pytest.mark.slow

FEW_SHOT = (
    "Extract the name, birthday and job of each person.\n\n"
    "Description: Marie Curie was born on 7 November 1867. She was a physicist.\n"
    "Name: Marie Curie\nBorn: 7 November 1867\nJob: physicist\n\n"
    "Description: Charles Dickens was born on 7 February 1812. He was a writer.\n"
    "Name: Charles Dickens\nBorn: 7 February 1812\nJob: writer\n\n"
)
PEOPLE = [
    "Ada Lovelace was born on 10 December 1815. She was a mathematician.",
    "Frida Kahlo was born on 6 July 1907. She was a painter.",
]
FIELDS = ("name", "birthday", "job")


def extractor(spec_tokens):
    @sgl.function(num_api_spec_tokens=spec_tokens)
    def extract(s, description):
        s += FEW_SHOT + "Description: " + description + "\n"
        s += "Name:" + sgl.gen("name", max_tokens=12, stop="\n")
        s += "\nBorn:" + sgl.gen("birthday", max_tokens=12, stop="\n")
        s += "\nJob:" + sgl.gen("job", max_tokens=12, stop="\n")
    return extract


@pytest.fixture
def completion_model(runtime):
    return lambda: sgl.OpenAI("default", is_chat_model=False, base_url=runtime.url + "/v1", api_key="unused",
                              max_retries=0)


def test_speculation_saves_calls_with_the_same_fields(completion_model):
    plain_be, spec_be = completion_model(), completion_model()
    for desc in PEOPLE:
        plain = extractor(None).run(description=desc, temperature=0, backend=plain_be)
        spec = extractor(28).run(description=desc, temperature=0, backend=spec_be)
        assert {k: spec[k] for k in FIELDS} == {k: plain[k] for k in FIELDS}, spec.text()
        assert spec.text() == plain.text()
    plain_u, spec_u = plain_be.token_usage, spec_be.token_usage
    print(f"\nAPI calls: {plain_u.num_calls} without speculation, {spec_u.num_calls} with; prompt tokens "
          f"{plain_u.prompt_tokens} vs {spec_u.prompt_tokens}; completion tokens {plain_u.completion_tokens} vs "
          f"{spec_u.completion_tokens}")
    assert plain_u.num_calls == 3 * len(PEOPLE)
    assert spec_u.num_calls == len(PEOPLE)  # the model follows the pattern: one call per description
    assert spec_u.prompt_tokens * 2 < plain_u.prompt_tokens
