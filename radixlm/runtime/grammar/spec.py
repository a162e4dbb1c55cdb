"""GrammarSpec: what a request constrains its output to, taken from its sampling params, and the API-layer check
that the spec compiles (so an invalid regex, schema or grammar never reaches the scheduler)."""
from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Literal

GrammarKind = Literal["regex", "json_schema", "ebnf"]

# xgrammar prefixes its messages with "[hh:mm:ss] /path/file.cc:line: "; the client needs only the rest.
_LOG_PREFIX = re.compile(r"^\[[\d:]+\]\s+\S+:\d+:\s*")


class InvalidGrammar(ValueError):
    """The spec does not compile; the message is the compiler's."""


@dataclass(frozen=True)
class GrammarSpec:
    kind: GrammarKind
    spec: str  # the regex, the JSON schema as a JSON string, or the EBNF grammar

    @classmethod
    def from_sampling_params(cls, sp) -> "GrammarSpec | None":
        """At most one of regex / json_schema / ebnf (SamplingParams.verify enforces it)."""
        if sp.regex is not None:
            return cls("regex", sp.regex)
        if sp.json_schema is not None:
            return cls("json_schema", sp.json_schema)
        if sp.ebnf is not None:
            return cls("ebnf", sp.ebnf)
        return None


def compiler_message(e: Exception) -> str:
    text = str(e).strip()
    return _LOG_PREFIX.sub("", text.splitlines()[0] if text else type(e).__name__)


def validate(spec: GrammarSpec) -> None:
    """Parse the spec without the tokenizer (a fraction of a millisecond for typical specs; remembered, since the
    requests of a workload tend to share one spec); raise InvalidGrammar naming the field and carrying the compiler's
    message."""
    error = _parse_error(spec)
    if error is not None:
        raise InvalidGrammar(error)


@functools.lru_cache(maxsize=1024)
def _parse_error(spec: GrammarSpec) -> str | None:
    import xgrammar as xgr

    try:
        if spec.kind == "regex":
            xgr.Grammar.from_regex(spec.spec)
        elif spec.kind == "json_schema":
            json.loads(spec.spec)
            xgr.Grammar.from_json_schema(spec.spec, any_whitespace=False)
        else:
            xgr.Grammar.from_ebnf(spec.spec)
    except json.JSONDecodeError as e:
        return f"json_schema is not valid JSON: {e}"
    except Exception as e:  # noqa: BLE001 - xgrammar raises RuntimeError / ValueError subclasses
        return f"invalid {spec.kind}: {compiler_message(e)}"
    return None
