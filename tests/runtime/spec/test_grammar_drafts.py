"""Speculation and constrained decoding in the same request (tiny random-weight Llama, word tokenizer, xgrammar):
where the grammar forces text, jump-forward drafts or takes it; elsewhere the guessing source (a draft model,
prompt lookup, the radix cache) drafts, and verification cuts the draft where the grammar refuses. Greedy outputs
equal those of the same jump-forward mode without speculation; the KV accounting holds after every step."""
from __future__ import annotations

import pytest

from tests.runtime.scheduler.conftest import request
from tests.runtime.scheduler.fake_runner import make_prompts
from tests.runtime.scheduler.fake_serving import serve
from .test_standalone_drafts import make, models  # noqa: F401 - fixture

# Numbers t1 .. t499 (no dead ends: every prefix of an allowed token is a whole number), each followed by t5: a
# separator the grammar forces (a jump) between free choices (drafts).
REGEX = "(t[1-4][0-9]{0,2}t5){3,8}"
EOS = frozenset({2})


def _requests(prompts):
    reqs = []
    for i, p in enumerate(prompts):
        r = request(f"g{i}", p, max_new_tokens=15 + 2 * i)
        r.sampling_params.regex, r.sampling_params.ignore_eos = REGEX, False
        reqs.append(r)
    # An unconstrained request in the same passes.
    reqs.append(request("free", prompts[0], max_new_tokens=12))
    return reqs


def _outputs(sched, reqs) -> tuple[dict, int]:
    """Outputs and finish reasons by rid, and the draft tokens the constrained requests kept."""
    outs: dict = {}
    kept = 0
    pending = list(reqs)
    while pending or not sched.is_idle():
        if pending:
            sched.add_request(pending.pop(0))
        for out in sched.step():
            ids, _ = outs.get(out.rid, ([], None))
            outs[out.rid] = (ids + out.new_output_ids, out.finished_reason)
            if out.finished_reason is not None and out.rid != "free":
                kept += out.spec_accepted_tokens
    sched.check_memory()
    return outs, kept


@pytest.mark.parametrize("jump", ["off", "exact", "fast"])
@pytest.mark.parametrize("spec", ["STANDALONE", "NGRAM", "RADIX"])
def test_constrained_requests_draft_and_keep_their_outputs(models, jump, spec):
    prompts = make_prompts(71, 3, lo=10, hi=20)
    kw = {"tokenizer": True, "eos": EOS, "jump_forward": jump}
    expected, _ = _outputs(make(models, None, **kw), _requests(prompts))
    assert any(f["type"] == "stop" for rid, (_, f) in expected.items() if rid != "free")
    if spec == "STANDALONE":
        sched = make(models, "same", **kw)
    else:
        sched = make(models, None, speculative_algorithm=spec, **kw)
    stats = sched.grammar_stats
    assert _outputs(sched, _requests(prompts))[0] == expected
    # Again without the unconstrained request (RADIX drafts from what the first round left in the tree): the
    # constrained requests draft from the guessing source and keep some of it.
    guessed = stats["model_drafts"] + stats["ngram_drafts"] + stats["radix_drafts"]
    outs, kept = _outputs(sched, [r for r in _requests(prompts) if r.rid != "free"])
    assert outs == {rid: out for rid, out in expected.items() if rid != "free"}
    assert stats["model_drafts"] + stats["ngram_drafts"] + stats["radix_drafts"] > guessed
    assert kept > 0
    if jump != "off":
        assert stats["exact_jumps"] + stats["fast_jumps"] > 0
