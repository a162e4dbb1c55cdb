"""The three select ranking methods on fixed logprobs with known decisions (the cases SGLang's docs describe:
a long word whose later tokens are near-certain, a prefix choice, and a choice likely regardless of context)."""
import math

import pytest

from radixlm.lang.choices import (greedy_token_selection, normalized_logprob, token_length_normalized,
                                  unconditional_likelihood_normalized)

CHOICES = ["organ", "organism", "antidisestablishmentarianism"]
# Per-choice token logprobs (logprob, token_id, text); token ids are arbitrary but consistent.
INPUT = [
    [[-0.1, 1, None]],
    [[-0.1, 1, None], [-0.3, 2, None]],
    [[-0.4, 3, None], [-0.25, 4, None], [-0.1, 5, None]] + [[-0.01, t, None] for t in (6, 7, 8, 9, 2)],
]
UNCONDITIONAL = [
    [[None, 1, None]],
    [[None, 1, None], [-1.4, 2, None]],
    [[None, 3, None], [-0.25, 4, None], [-0.1, 5, None]] + [[-0.01, t, None] for t in (6, 7, 8, 9, 2)],
]


def kwargs():
    return dict(choices=CHOICES, normalized_prompt_logprobs=[normalized_logprob(x) for x in INPUT],
                input_token_logprobs=INPUT, output_token_logprobs=[[[-0.1, 10, None]]] * 3,
                unconditional_token_logprobs=UNCONDITIONAL)


def test_normalized_logprob_skips_nulls():
    assert normalized_logprob([[None, 1, None], [-1.0, 2, None], [-3.0, 3, None]]) == pytest.approx(-2.0)
    assert normalized_logprob([[None, 1, None]]) == -math.inf


def test_token_length_normalized_prefers_confident_long_word():
    assert kwargs()["normalized_prompt_logprobs"] == pytest.approx([-0.1, -0.2, -0.1])
    k = kwargs()
    k["normalized_prompt_logprobs"] = [-0.1, -0.2, -0.05]
    assert token_length_normalized(**k).decision == "antidisestablishmentarianism"
    k["normalized_prompt_logprobs"] = [-0.3, -0.2, -0.2]  # a tie goes to the earlier choice
    assert token_length_normalized(**k).decision == "organism"


def test_greedy_token_selection_matrix_and_decision():
    d = greedy_token_selection(**kwargs())
    assert d.decision == "organ"
    expected = [
        [-0.1] * 8,
        [-0.1, -0.3] + [-0.2] * 6,
        [-0.4, -0.25, -0.1, -0.01, -0.01, -0.01, -0.01, -0.01],
    ]
    for row, exp in zip(d.meta_info["greedy_logprob_matrix"], expected):
        assert row == pytest.approx(exp)


def test_greedy_token_selection_breaks_on_later_token():
    k = kwargs()
    k["input_token_logprobs"] = [[[-0.5, 1, None], [-0.9, 2, None]], [[-0.5, 1, None], [-0.2, 3, None]]]
    k["choices"] = ["ab", "ac"]
    assert greedy_token_selection(**k).decision == "ac"


def test_unconditional_likelihood_normalized():
    d = unconditional_likelihood_normalized(**kwargs())
    assert d.decision == "organism"
    assert d.meta_info["normalized_unconditional_prompt_logprobs"] == pytest.approx([-0.1, 0.5, -0.05])
    assert unconditional_likelihood_normalized.requires_unconditional_logprobs
    assert not token_length_normalized.requires_unconditional_logprobs


def test_bad_inputs_give_clear_errors():
    k = kwargs()
    k["unconditional_token_logprobs"] = None
    with pytest.raises(ValueError, match="unconditional"):
        unconditional_likelihood_normalized(**k)
    k = kwargs()
    k["normalized_prompt_logprobs"] = [0.0]
    with pytest.raises(ValueError, match="3 choices"):
        token_length_normalized(**k)


@pytest.mark.parametrize("method", [token_length_normalized, greedy_token_selection,
                                    unconditional_likelihood_normalized])
def test_every_method_reports_the_scores_it_was_given(method):
    # SGLang's methods each put the prompt scores they ranked into the decision's meta_info (what
    # s.get_meta_info(name) shows for a select), whichever backend called them.
    k = kwargs()
    meta = method(**k).meta_info
    assert meta["normalized_prompt_logprobs"] == k["normalized_prompt_logprobs"]
    assert meta["input_token_logprobs"] == k["input_token_logprobs"]
    assert meta["output_token_logprobs"] == k["output_token_logprobs"]
