"""Ranking methods for `select`: given per-choice token logprobs, pick one choice.

A token logprob entry is `(logprob, token_id, text_or_None)` as the native /generate returns it; the logprob may
be None (the first token of a sequence has no prediction)."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

TokenLogprob = Sequence[Any]  # (logprob | None, token_id, text | None)


@dataclass
class ChoicesDecision:
    decision: str
    meta_info: dict[str, Any] = field(default_factory=dict)


class ChoicesSamplingMethod(ABC):
    @property
    def requires_unconditional_logprobs(self) -> bool:
        return False

    @abstractmethod
    def __call__(self, *, choices: list[str], normalized_prompt_logprobs: list[float],
                 input_token_logprobs: list[list[TokenLogprob]], output_token_logprobs: list[list[TokenLogprob]],
                 unconditional_token_logprobs: Optional[list[list[TokenLogprob]]] = None) -> ChoicesDecision:
        ...


def _argmax(values: Sequence[float]) -> int:
    """The first index holding the maximum (ties go to the earlier choice)."""
    best = 0
    for i, v in enumerate(values):
        if v > values[best]:
            best = i
    return best


def _common_meta(normalized_prompt_logprobs: list[float], input_token_logprobs: list,
                 output_token_logprobs: list, **extra: Any) -> dict[str, Any]:
    """Every method's meta_info carries the scores it was given (what `s.get_meta_info(name)` shows for a select),
    plus the method's own."""
    return {"normalized_prompt_logprobs": normalized_prompt_logprobs, "input_token_logprobs": input_token_logprobs,
            "output_token_logprobs": output_token_logprobs, **extra}


def _check_lengths(choices: list[str], **lists: Optional[list]) -> None:
    if not choices:
        raise ValueError("select needs at least one choice")
    for name, lst in lists.items():
        if lst is not None and len(lst) != len(choices):
            raise ValueError(f"{name} has {len(lst)} entries for {len(choices)} choices")


class TokenLengthNormalized(ChoicesSamplingMethod):
    """The choice with the highest mean logprob per token of the choice."""

    def __call__(self, *, choices, normalized_prompt_logprobs, input_token_logprobs, output_token_logprobs,
                 unconditional_token_logprobs=None) -> ChoicesDecision:
        _check_lengths(choices, normalized_prompt_logprobs=normalized_prompt_logprobs)
        best = _argmax(normalized_prompt_logprobs)
        return ChoicesDecision(choices[best], _common_meta(normalized_prompt_logprobs, input_token_logprobs,
                                                           output_token_logprobs))

    def __repr__(self) -> str:
        return "token_length_normalized"


class GreedyTokenSelection(ChoicesSamplingMethod):
    """Compares choices token by token: at each position keep only the choices holding the maximum logprob, until
    one remains. A shorter choice is padded with its own mean logprob so that it can be compared with the longer
    ones past its end."""

    def __call__(self, *, choices, normalized_prompt_logprobs, input_token_logprobs, output_token_logprobs,
                 unconditional_token_logprobs=None) -> ChoicesDecision:
        _check_lengths(choices, input_token_logprobs=input_token_logprobs)
        rows = [[_value(t) for t in toks] for toks in input_token_logprobs]
        width = max(len(r) for r in rows)
        matrix = []
        for r in rows:
            mean = sum(r) / len(r) if r else float("-inf")
            matrix.append(r + [mean] * (width - len(r)))
        alive = list(range(len(choices)))
        for col in range(width):
            top = max(matrix[i][col] for i in alive)
            alive = [i for i in alive if matrix[i][col] == top]
            if len(alive) == 1:
                break
        return ChoicesDecision(choices[alive[0]], _common_meta(normalized_prompt_logprobs, input_token_logprobs,
                                                               output_token_logprobs, greedy_logprob_matrix=matrix))

    def __repr__(self) -> str:
        return "greedy_token_selection"


class UnconditionalLikelihoodNormalized(ChoicesSamplingMethod):
    """The choice with the highest mean of logp(token | context) - logp(token | nothing): it discounts choices
    that are likely regardless of the question. The unconditional first token has no logprob and counts as 0."""

    @property
    def requires_unconditional_logprobs(self) -> bool:
        return True

    def __call__(self, *, choices, normalized_prompt_logprobs, input_token_logprobs, output_token_logprobs,
                 unconditional_token_logprobs=None) -> ChoicesDecision:
        if unconditional_token_logprobs is None:
            raise ValueError("unconditional_likelihood_normalized needs unconditional_token_logprobs")
        _check_lengths(choices, input_token_logprobs=input_token_logprobs,
                       unconditional_token_logprobs=unconditional_token_logprobs)
        scores = []
        for cond, uncond in zip(input_token_logprobs, unconditional_token_logprobs):
            if len(cond) != len(uncond):
                raise ValueError(f"conditional ({len(cond)}) and unconditional ({len(uncond)}) token counts differ")
            diffs = [_value(c) - _value(u) for c, u in zip(cond, uncond)]
            scores.append(sum(diffs) / len(diffs) if diffs else float("-inf"))
        best = _argmax(scores)
        return ChoicesDecision(choices[best], _common_meta(
            normalized_prompt_logprobs, input_token_logprobs, output_token_logprobs,
            unconditional_token_logprobs=unconditional_token_logprobs,
            normalized_unconditional_prompt_logprobs=scores))

    def __repr__(self) -> str:
        return "unconditional_likelihood_normalized"


def _value(entry: TokenLogprob) -> float:
    v = entry[0]
    return 0.0 if v is None else float(v)


def normalized_logprob(entries: Sequence[TokenLogprob]) -> float:
    """Mean of the non-null logprobs (-inf for none)."""
    vals = [float(e[0]) for e in entries if e[0] is not None]
    return sum(vals) / len(vals) if vals else float("-inf")


token_length_normalized = TokenLengthNormalized()
greedy_token_selection = GreedyTokenSelection()
unconditional_likelihood_normalized = UnconditionalLikelihoodNormalized()
