"""Per-request sampling parameters (the `sampling_params` of /generate), with SGLang's names and defaults.

Lifecycle: `SamplingParams.from_dict(d)` (or the constructor) -> `normalize()` -> `verify(vocab_size)`.
`verify` also accepts un-normalized values, so the two calls may come in either order."""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any

# 0 <= temperature < this is greedy decoding.
GREEDY_TEMPERATURE_EPS = 1e-6
# OpenAI's range; far beyond it a float32 logit overflows to inf and the row's probabilities become NaN.
MAX_LOGIT_BIAS = 100.0

_ALIASES = {"seed": "sampling_seed"}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _number(name: str, v: Any) -> float:
    if not _is_number(v):
        raise ValueError(f"{name} must be a number, got {v!r}")
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v!r}")
    return float(v)


def _integer(name: str, v: Any) -> int:
    if not _is_int(v):
        raise ValueError(f"{name} must be an integer, got {v!r}")
    return v


def _token_id(name: str, v: Any) -> int:
    """A token id given as an int or a decimal string (JSON object keys are strings)."""
    if _is_int(v):
        return v
    if isinstance(v, str):
        try:
            return int(v.strip())
        except ValueError:
            pass
    raise ValueError(f"{name}: token id must be an integer, got {v!r}")


@dataclass
class SamplingParams:
    max_new_tokens: int = 128
    min_new_tokens: int = 0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | set[int] | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 = whole vocab
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    n: int = 1
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    logit_bias: dict[str | int, float] | None = None
    sampling_seed: int | None = None
    json_schema: str | dict | None = None  # a dict is serialized to a JSON string by normalize()
    regex: str | None = None
    ebnf: str | None = None
    stream_interval: int | None = None
    # Reasoning tokens before the reasoning block's end is forced (needs --reasoning-parser; thinking_budget.py).
    thinking_budget: int | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "SamplingParams":
        """Build from a request's `sampling_params` dict. Unknown keys raise ValueError; `seed` is an alias
        of `sampling_seed`; a key whose value is None means "use the default"."""
        if d is None:
            return cls()
        if not isinstance(d, dict):
            raise ValueError(f"sampling_params must be a dict, got {type(d).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in d.items():
            name = _ALIASES.get(key, key)
            if name not in names:
                raise ValueError(f"Unknown sampling parameter: {key!r}")
            if name in kwargs:
                raise ValueError(f"sampling parameter {name!r} given twice (as {key!r} and its alias)")
            if value is not None:
                kwargs[name] = value
        return cls(**kwargs)

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE_EPS or self.top_k == 1

    def normalize(self) -> None:
        """Canonical forms: stop -> list[str] (None -> []), stop_token_ids -> set[int] (None -> set()),
        logit_bias keys -> int and values -> float. Idempotent."""
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        elif isinstance(self.stop, (list, tuple)):
            self.stop = list(self.stop)
        else:
            raise ValueError(f"stop must be a string or a list of strings, got {self.stop!r}")
        if self.stop_token_ids is None:
            self.stop_token_ids = set()
        elif isinstance(self.stop_token_ids, (list, tuple, set, frozenset)):
            self.stop_token_ids = {_token_id("stop_token_ids", t) for t in self.stop_token_ids}
        else:
            raise ValueError(f"stop_token_ids must be a list of integers, got {self.stop_token_ids!r}")
        if isinstance(self.json_schema, dict):
            self.json_schema = json.dumps(self.json_schema)
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise ValueError(f"logit_bias must be a dict of token id -> bias, got {self.logit_bias!r}")
            self.logit_bias = {
                _token_id("logit_bias", k): _number(f"logit_bias[{k!r}]", v) for k, v in self.logit_bias.items()
            }

    def verify(self, vocab_size: int) -> None:
        """Raise ValueError naming the offending field if any value is out of range or of the wrong type."""
        t = _number("temperature", self.temperature)
        if t < 0:
            raise ValueError(f"temperature must be >= 0, got {t}")
        top_p = _number("top_p", self.top_p)
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        top_k = _integer("top_k", self.top_k)
        if top_k != -1 and top_k < 1:
            raise ValueError(f"top_k must be -1 (disable) or at least 1, got {top_k}")
        min_p = _number("min_p", self.min_p)
        if not 0.0 <= min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {min_p}")
        for name in ("frequency_penalty", "presence_penalty"):
            v = _number(name, getattr(self, name))
            if not -2.0 <= v <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {v}")
        rep = _number("repetition_penalty", self.repetition_penalty)
        if not 0.0 < rep <= 2.0:
            raise ValueError(f"repetition_penalty must be in (0, 2], got {rep}")
        max_new = _integer("max_new_tokens", self.max_new_tokens)
        if max_new < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new}")
        min_new = _integer("min_new_tokens", self.min_new_tokens)
        if min_new < 0:
            raise ValueError(f"min_new_tokens must be >= 0, got {min_new}")
        if min_new > max_new:
            raise ValueError(f"min_new_tokens ({min_new}) must be <= max_new_tokens ({max_new})")
        if _integer("n", self.n) < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.stream_interval is not None and _integer("stream_interval", self.stream_interval) < 1:
            raise ValueError(f"stream_interval must be >= 1, got {self.stream_interval}")
        if self.sampling_seed is not None:
            _integer("sampling_seed", self.sampling_seed)
        if self.thinking_budget is not None and _integer("thinking_budget", self.thinking_budget) < 1:
            raise ValueError(f"thinking_budget must be >= 1, got {self.thinking_budget}")
        for name in ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a boolean, got {getattr(self, name)!r}")
        self._verify_stops(vocab_size)
        self._verify_logit_bias(vocab_size)
        self._verify_constraints()

    def _verify_stops(self, vocab_size: int) -> None:
        stops = [self.stop] if isinstance(self.stop, str) else self.stop
        if stops is not None:
            if not isinstance(stops, (list, tuple)) or not all(isinstance(s, str) for s in stops):
                raise ValueError(f"stop must be a string or a list of strings, got {self.stop!r}")
        if self.stop_token_ids is not None:
            if not isinstance(self.stop_token_ids, (list, tuple, set, frozenset)):
                raise ValueError(f"stop_token_ids must be a list of integers, got {self.stop_token_ids!r}")
            for tid in self.stop_token_ids:
                if not _is_int(tid) or not 0 <= tid < vocab_size:
                    raise ValueError(f"stop_token_ids: {tid!r} is not a token id in [0, {vocab_size})")

    def _verify_logit_bias(self, vocab_size: int) -> None:
        if self.logit_bias is None:
            return
        if not isinstance(self.logit_bias, dict):
            raise ValueError(f"logit_bias must be a dict of token id -> bias, got {self.logit_bias!r}")
        for key, bias in self.logit_bias.items():
            tid = _token_id("logit_bias", key)
            if not 0 <= tid < vocab_size:
                raise ValueError(f"logit_bias: token id {key!r} is outside the vocabulary [0, {vocab_size})")
            if not -MAX_LOGIT_BIAS <= _number(f"logit_bias[{key!r}]", bias) <= MAX_LOGIT_BIAS:
                raise ValueError(f"logit_bias: bias {bias!r} of token {key!r} is outside [-100, 100]")

    def _verify_constraints(self) -> None:
        n_set = sum(x is not None for x in (self.json_schema, self.regex, self.ebnf))
        if n_set > 1:
            raise ValueError("Only one of regex, json_schema, or ebnf can be set.")
        for name, types in (("json_schema", (str, dict)), ("regex", str), ("ebnf", str)):
            v = getattr(self, name)
            if v is not None and not isinstance(v, types):
                raise ValueError(f"{name} must be a string{' or an object' if name == 'json_schema' else ''}, "
                                 f"got {type(v).__name__}")
