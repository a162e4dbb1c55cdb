import dataclasses
import math

import pytest

from radixlm.runtime.sampling.sampling_params import SamplingParams

V = 100


def test_defaults_match_sglang():
    p = SamplingParams()
    assert (p.max_new_tokens, p.min_new_tokens, p.stop, p.stop_token_ids) == (128, 0, None, None)
    assert (p.temperature, p.top_p, p.top_k, p.min_p) == (1.0, 1.0, -1, 0.0)
    assert (p.frequency_penalty, p.presence_penalty, p.repetition_penalty, p.n) == (0.0, 0.0, 1.0, 1)
    assert (p.ignore_eos, p.skip_special_tokens, p.spaces_between_special_tokens, p.no_stop_trim) == (
        False, True, True, False)
    assert (p.logit_bias, p.sampling_seed, p.json_schema, p.regex, p.ebnf, p.stream_interval) == (None,) * 6
    p.normalize()
    p.verify(V)
    assert not p.is_greedy


def test_from_dict_unknown_key_named():
    with pytest.raises(ValueError, match="bogus"):
        SamplingParams.from_dict({"temperature": 0.5, "bogus": 1})
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams.from_dict({"max_tokens": 3})


def test_from_dict_seed_alias_and_none_means_default():
    p = SamplingParams.from_dict({"seed": 7, "top_k": None, "max_new_tokens": 5})
    assert p.sampling_seed == 7 and p.top_k == -1 and p.max_new_tokens == 5
    assert SamplingParams.from_dict({"sampling_seed": 3}).sampling_seed == 3
    assert SamplingParams.from_dict(None) == SamplingParams()
    with pytest.raises(ValueError, match="sampling_seed"):
        SamplingParams.from_dict({"seed": 1, "sampling_seed": 2})
    with pytest.raises(ValueError, match="sampling_params"):
        SamplingParams.from_dict([("temperature", 1.0)])


def test_normalize_forms_and_idempotent():
    p = SamplingParams(stop="###", stop_token_ids=[5, 6, 5], logit_bias={"3": 1, 4: -2.5})
    p.normalize()
    assert p.stop == ["###"] and p.stop_token_ids == {5, 6} and p.logit_bias == {3: 1.0, 4: -2.5}
    snapshot = dataclasses.replace(p)
    p.normalize()
    assert p == snapshot
    q = SamplingParams()
    q.normalize()
    assert q.stop == [] and q.stop_token_ids == set() and q.logit_bias is None


def test_normalize_rejects_bad_logit_bias_key():
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias={"abc": 1.0}).normalize()


@pytest.mark.parametrize("t,greedy", [(0.0, True), (5e-7, True), (1e-6, False), (0.7, False)])
def test_is_greedy_from_temperature(t, greedy):
    assert SamplingParams(temperature=t).is_greedy is greedy


def test_is_greedy_is_derived():
    p = SamplingParams(temperature=0.8, top_k=1)
    assert p.is_greedy
    p.top_k = 5
    assert not p.is_greedy
    p.temperature = 0.0
    assert p.is_greedy


BAD = [
    ("temperature", -0.1), ("temperature", math.inf), ("temperature", math.nan), ("temperature", "hot"),
    ("temperature", None), ("temperature", True),
    ("top_p", 0.0), ("top_p", 1.01), ("top_p", "x"),
    ("top_k", 0), ("top_k", -2), ("top_k", 2.5),
    ("min_p", -0.01), ("min_p", 1.5),
    ("frequency_penalty", 2.01), ("frequency_penalty", -3), ("presence_penalty", 2.5), ("presence_penalty", -2.1),
    ("repetition_penalty", 0.0), ("repetition_penalty", 2.1), ("repetition_penalty", -1),
    ("max_new_tokens", -1), ("max_new_tokens", 1.5), ("max_new_tokens", None),
    ("min_new_tokens", -1),
    ("n", 0), ("n", "2"),
    ("stream_interval", 0), ("sampling_seed", "abc"), ("ignore_eos", "yes"),
]


@pytest.mark.parametrize("field,value", BAD)
def test_verify_rejects_bad_values(field, value):
    p = SamplingParams(**{field: value})
    with pytest.raises(ValueError, match=field):
        p.verify(V)


@pytest.mark.parametrize("field,value", [
    ("top_p", 1.0), ("top_k", -1), ("top_k", 1), ("top_k", 10 * V), ("min_p", 0.0), ("min_p", 1.0),
    ("frequency_penalty", -2.0), ("presence_penalty", 2), ("repetition_penalty", 2.0), ("temperature", 0),
    ("max_new_tokens", 0), ("n", 4), ("stream_interval", 1), ("sampling_seed", -5),
])
def test_verify_accepts_boundaries(field, value):
    p = SamplingParams(**{field: value})
    p.normalize()
    p.verify(V)


def test_min_new_tokens_above_max():
    with pytest.raises(ValueError, match="min_new_tokens"):
        SamplingParams(max_new_tokens=3, min_new_tokens=4).verify(V)
    SamplingParams(max_new_tokens=3, min_new_tokens=3).verify(V)


@pytest.mark.parametrize("normalized", [False, True])
def test_logit_bias_validation(normalized):
    def check(bias):
        p = SamplingParams(logit_bias=bias)
        if normalized:
            p.normalize()
        p.verify(V)

    check({"0": 100.0, str(V - 1): -100})
    for bad in ({str(V): 1.0}, {"-1": 1.0}, {"5": "big"}, {"5": math.nan}, {"5": 1e300}, {"5": -100.5}):
        with pytest.raises(ValueError, match="logit_bias"):
            check(bad)


@pytest.mark.parametrize("normalized", [False, True])
def test_stop_token_ids_validation(normalized):
    for bad in ([V], [-1], ["a"]):
        p = SamplingParams(stop_token_ids=bad)
        with pytest.raises(ValueError, match="stop_token_ids"):
            if normalized:
                p.normalize()
            p.verify(V)
    with pytest.raises(ValueError, match="stop"):
        SamplingParams(stop=[1, 2]).verify(V)


def test_constraint_fields():
    with pytest.raises(ValueError, match="Only one of regex, json_schema, or ebnf can be set."):
        SamplingParams(regex="a+", json_schema="{}").verify(V)
    for field in ("regex", "json_schema", "ebnf"):
        SamplingParams(**{field: "x"}).verify(V)  # compiled (and rejected if invalid) by the grammar layer
        with pytest.raises(ValueError, match=f"{field} must be a string"):
            SamplingParams(**{field: 5}).verify(V)
    p = SamplingParams(json_schema={"type": "object"})
    p.verify(V)
    p.normalize()
    assert p.json_schema == '{"type": "object"}'
