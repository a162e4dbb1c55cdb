"""BuiltRequests.prefix_requests: what the Engine and the TokenizerManager run before n > 1 samples."""
from __future__ import annotations

from radixlm.runtime.front import FrontLimits, RequestBuilder
from tests.runtime.test_front import VOCAB, ByteTokenizer, builder


def test_one_prefill_only_request_per_group_of_samples():
    built = builder().build(prompt=["ab", "cde", "f"], sampling_params=[{"n": 2}, {"n": 1}, {"n": 3}],
                            rid=["x", "y", "z"], extra_key="k")
    prefixes = built.prefix_requests()
    assert [p.rid for p in prefixes] == ["x-0-prefix", "z-0-prefix"]
    assert [p.input_ids for p in prefixes] == [built.msgs[0].input_ids, built.msgs[3].input_ids]
    assert all(p.sampling_params.max_new_tokens == 0 and p.extra_key == "k" and not p.stream for p in prefixes)


def test_none_without_a_radix_cache_or_for_single_samples():
    no_cache = RequestBuilder(ByteTokenizer(), FrontLimits(VOCAB, 256, 512, disable_radix_cache=True))
    assert no_cache.build(prompt="ab", sampling_params={"n": 4}).prefix_requests() == []
    assert builder().build(prompt=["ab", "cd"]).prefix_requests() == []
