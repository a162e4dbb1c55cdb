"""Grammar specs: API-layer validation with the compiler's message, and the shared compile cache."""
from __future__ import annotations

import json
import threading

import pytest

from radixlm.runtime.grammar.backend import GrammarCache
from radixlm.runtime.grammar.spec import GrammarSpec, InvalidGrammar, validate
from radixlm.runtime.sampling.sampling_params import SamplingParams


@pytest.mark.parametrize("kind, spec, message", [
    ("regex", "(ab", "parenthesis is not closed"),
    ("regex", "[a-", "Unclosed"),
    ("regex", "a{3,1}", "Lower bound is larger than upper bound"),
    ("json_schema", '{"type": ', "not valid JSON"),
    ("json_schema", '{"type": "objectx"}', "Unsupported type"),
    ("ebnf", 'root ::= "a" | ', "EBNF parser error"),
    ("ebnf", 'start ::= "a"', "root"),
])
def test_invalid_specs_carry_the_compilers_message(kind, spec, message):
    with pytest.raises(InvalidGrammar) as e:
        validate(GrammarSpec(kind, spec))
    assert message.lower() in str(e.value).lower() and kind in str(e.value)
    assert "/project/" not in str(e.value) and not str(e.value).startswith("[")


def test_valid_specs_pass():
    validate(GrammarSpec("regex", r"\d{3}-[a-z]+"))
    validate(GrammarSpec("json_schema", json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}})))
    validate(GrammarSpec("ebnf", 'root ::= "yes" | "no"'))


def test_spec_from_sampling_params_and_dict_schema():
    sp = SamplingParams(json_schema={"type": "object"})
    sp.normalize()
    sp.verify(100)
    assert GrammarSpec.from_sampling_params(sp) == GrammarSpec("json_schema", '{"type": "object"}')
    assert GrammarSpec.from_sampling_params(SamplingParams(regex="a+")) == GrammarSpec("regex", "a+")
    assert GrammarSpec.from_sampling_params(SamplingParams()) is None
    with pytest.raises(ValueError, match="Only one"):
        SamplingParams(regex="a", ebnf='root ::= "a"').verify(100)
    with pytest.raises(ValueError, match="regex must be a string"):
        SamplingParams(regex=5).verify(100)


class FakeBackend:
    def __init__(self):
        self.compiled: list[GrammarSpec] = []
        self.gate = threading.Event()

    def compile(self, spec):
        self.gate.wait(5)
        self.compiled.append(spec)
        if spec.spec == "bad":
            raise InvalidGrammar("invalid regex: bad")
        return ("compiled", spec.spec)


def test_cache_shares_one_compilation_and_never_blocks():
    backend = FakeBackend()
    cache = GrammarCache(lambda: backend)
    try:
        a = cache.get(GrammarSpec("regex", "x+"))
        b = cache.get(GrammarSpec("regex", "x+"))
        assert a is b and not a.done()  # returned at once, while the compiler is still held
        other = cache.get(GrammarSpec("ebnf", "x+"))  # same text, another kind: its own entry
        assert other is not a
        backend.gate.set()
        assert a.result(5) == ("compiled", "x+") and other.result(5) == ("compiled", "x+")
        assert backend.compiled.count(GrammarSpec("regex", "x+")) == 1
        assert (cache.hits, cache.misses) == (1, 2)
        bad = cache.get(GrammarSpec("regex", "bad"))
        assert isinstance(bad.exception(5), InvalidGrammar)
        assert cache.get(GrammarSpec("regex", "bad")) is bad  # a failure is cached too
    finally:
        cache.shutdown()


def test_cache_evicts_least_recently_used():
    backend = FakeBackend()
    backend.gate.set()
    cache = GrammarCache(lambda: backend, max_entries=2)
    try:
        first = cache.get(GrammarSpec("regex", "a"))
        evicted = cache.get(GrammarSpec("regex", "b"))
        assert cache.get(GrammarSpec("regex", "a")) is first  # now most recent
        cache.get(GrammarSpec("regex", "c"))  # evicts "b"
        assert cache.get(GrammarSpec("regex", "a")) is first
        again = cache.get(GrammarSpec("regex", "b"))
        assert again is not evicted
        again.result(5)
        evicted.result(5)  # two compilations, which may finish in either order
        assert backend.compiled.count(GrammarSpec("regex", "b")) == 2
    finally:
        cache.shutdown()
