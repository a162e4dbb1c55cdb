"""Req.extend_output appends a verdict's tokens at once; it must end the request exactly where appending them one by
one with check_finished would."""
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
        req.finished_reason = FinishReason("abort", message="aborted in flight")
    return req


def test_extend_output_ends_where_token_by_token_checks_end():
    rng, tok = random.Random(0), CharTokenizer()
    for _ in range(3000):
        seed = rng.random()
        fast, slow = _req(random.Random(seed)), _req(random.Random(seed))
        tokens = [rng.randrange(10) for _ in range(rng.randint(1, 8))]
        window = 6
        taken = fast.extend_output(tokens, tok, window)
        kept = 0
        for t in tokens:
            slow.output_ids.append(t)
            slow.check_finished(tok, window)
            kept += 1
            if slow.finished():
                break
        assert (taken, fast.output_ids, fast.finished_reason) == (kept, slow.output_ids, slow.finished_reason)
