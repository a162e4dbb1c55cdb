"""Req.append_tokens appends a verdict's tokens at once; it must end the request exactly where appending them one by
one would."""
import random

from radixlm.runtime.sampling.sampling_params import SamplingParams
from radixlm.runtime.scheduler.req import FinishReason, Req


class CharTokenizer:
    """Token t decodes to chr(97 + t % 4): stop strings over 'abcd'."""

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(97 + t % 4) for t in ids)


def _req(rng: random.Random) -> Req:
    sp = SamplingParams(max_new_tokens=rng.randint(1, 12), min_new_tokens=rng.choice([0, 0, 3]),
                        ignore_eos=rng.random() < 0.3,
                        stop_token_ids=rng.choice([None, [5], [6, 7]]),
                        stop=rng.choice([None, None, ["ab"], ["dd", "c"]]))
    sp.normalize()
    req = Req("r", [1, 2, 3], sp, eos_token_ids=frozenset({0, 9}))
    req.output_ids = [rng.randrange(10) for _ in range(rng.randint(0, 2))]
    if rng.random() < 0.1:
        req.finished_reason = FinishReason.aborted("aborted in flight")
    return req


def test_append_tokens_ends_where_token_by_token_appends_end():
    rng, tok = random.Random(0), CharTokenizer()
    for _ in range(3000):
        seed = rng.random()
        fast, slow = _req(random.Random(seed)), _req(random.Random(seed))
        tokens = [rng.randrange(10) for _ in range(rng.randint(1, 8))]
        was_finished, before = fast.finished(), list(fast.output_ids)
        taken = fast.append_tokens(tokens, tok)
        if was_finished:  # aborted while its pass ran: nothing is appended, the abort stands
            assert taken == 0 and fast.output_ids == before and fast.finished_reason.type == "abort"
        kept = 0
        for t in tokens:
            kept += slow.append_tokens([t], tok)
            if slow.finished():
                break
        assert (taken, fast.output_ids, fast.finished_reason) == (kept, slow.output_ids, slow.finished_reason)
