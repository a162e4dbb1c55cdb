"""API speculative execution (paper §5): fewer calls to black-box endpoints for multi-gen templates.

Completion models: a gen with a stop string is sent with a larger budget (`num_api_spec_tokens`) and no stop, so
the model goes on to write the program's next constant text and later gens too. The gen keeps the text up to its
first stop; the rest stays pending. Constant text the program appends next must match the pending text (and
consumes it); a later gen whose stop string occurs in the pending text is served from it without a call. Any
mismatch, or any other primitive, drops what is pending.

Chat models cannot continue a partial assistant message, so the whole assistant turn is buffered: its constant
text and gens are collected, one call is made at the end of the turn, and the reply is matched against the
turn's template to fill in every gen. A reply that does not follow the template is asked again (SGLang's three
tries in all); after that the gens that matched keep their values, the others are left empty, and the program
goes on."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional, Union

from radixlm.lang.backend.base_backend import BackendError
from radixlm.lang.ir import (SglConstantText, SglExpr, SglExprList, SglGen, SglRoleBegin, SglRoleEnd,
                             SglSamplingParams, SglSeparateReasoning, SglVariable, _as_list)

if TYPE_CHECKING:
    from radixlm.lang.interpreter import StreamExecutor

logger = logging.getLogger(__name__)

SPEC_MAX_NUM_TRIES = 3  # SGLang's spec_max_num_tries


def first_stop(text: str, stops: list[str], start: int = 0) -> int:
    """Index of the earliest stop string in text[start:], or -1."""
    hits = [i for i in (text.find(s, start) for s in stops if s) if i >= 0]
    return min(hits) if hits else -1


def match_turn_prefix(parts: list[Union[str, SglGen]], reply: str) -> tuple[list[str], bool]:
    """How far `reply` follows the template `parts` (constant strings and gens): the values of the gens matched
    before the first mismatch, and whether the whole template matched. A gen ends at its first stop string, else
    where the next constant begins, else at the end of the reply."""
    values: list[str] = []
    pos = 0
    for i, part in enumerate(parts):
        if isinstance(part, str):
            if pos == 0 and not reply.startswith(part):
                part = part.lstrip()  # chat replies come without the leading whitespace of the turn
            if not reply.startswith(part, pos):
                return values, False
            pos += len(part)
            continue
        nxt = parts[i + 1] if i + 1 < len(parts) else None
        ends = [first_stop(reply, _as_list(part.sampling_params.stop), pos)]
        if isinstance(nxt, str) and nxt:
            ends.append(reply.find(nxt, pos))
        found = [e for e in ends if e >= 0]
        if not found and isinstance(nxt, str) and nxt:
            return values, False
        end = min(found) if found else len(reply)
        values.append(reply[pos:end])
        pos = end
    return values, True


def match_turn(parts: list[Union[str, SglGen]], reply: str) -> Optional[list[str]]:
    """The gens' values if `reply` follows the template `parts` all through, else None."""
    values, complete = match_turn_prefix(parts, reply)
    return values if complete else None


@dataclass
class ApiSpeculation:
    """One stream's speculation state. `intercept` is called for every node the executor runs."""

    num_tokens: int
    is_chat: bool
    pending: str = ""  # completion models: speculated text not yet consumed by the program
    turn: Optional[list[Union[str, SglGen]]] = None  # chat models: the assistant turn being buffered
    max_tries: int = SPEC_MAX_NUM_TRIES  # chat models: calls per assistant turn until a reply follows its template
    served: int = 0  # gens served from speculated text (calls saved)
    dropped: int = 0  # pending texts thrown away on a mismatch
    unmatched: int = 0  # chat turns whose replies never followed the template
    log: list[str] = field(default_factory=list)

    def intercept(self, exe: "StreamExecutor", expr: SglExpr) -> bool:
        """True when this node was fully handled here; False lets the interpreter run it as usual."""
        if isinstance(expr, SglExprList) or exe.stream:
            return False
        if self.is_chat:
            return self._chat(exe, expr)
        if isinstance(expr, SglConstantText):
            self._consume(expr.value)
            return False
        if isinstance(expr, SglGen):
            return self._completion_gen(exe, expr)
        self._drop()
        return False

    # ---- completion models
    def _consume(self, text: str) -> None:
        if not self.pending:
            return
        if self.pending.startswith(text):
            self.pending = self.pending[len(text):]
        else:
            self._drop()

    def _drop(self) -> None:
        if self.pending:
            self.dropped += 1
            self.pending = ""

    def _completion_gen(self, exe: "StreamExecutor", expr: SglGen) -> bool:
        sp = exe._resolve_sampling_params(expr.sampling_params)
        stops = _as_list(sp.stop)
        if not stops or sp.n != 1 or sp.regex or sp.json_schema or sp.dtype:
            self._drop()
            return False
        if self.pending:
            end = first_stop(self.pending, stops)
            if end >= 0:
                value, self.pending = self.pending[:end], self.pending[end:]
                self.served += 1
                exe._append_text(value)
                exe._set_var_done(expr.name, value, {"speculative": True, "completion_tokens": 0})
                return True
            self._drop()  # the speculated text does not show where this gen ends
        over = sp.clone()
        over.max_new_tokens = max(self.num_tokens, sp.max_new_tokens)
        over.stop = []
        text, meta = exe.backend.generate(exe, sampling_params=over)
        end = first_stop(text, stops)
        value, self.pending = (text, "") if end < 0 else (text[:end], text[end:])
        exe._append_text(value)
        exe._set_var_done(expr.name, value, {**meta, "speculative": True})
        return True

    # ---- chat models
    def _chat(self, exe: "StreamExecutor", expr: SglExpr) -> bool:
        if self.turn is None:
            if isinstance(expr, SglRoleBegin) and expr.role == "assistant":
                exe._execute_role_begin(expr)
                self.turn = []
                return True
            return False
        if isinstance(expr, SglConstantText):
            self.turn.append(expr.value)
        elif isinstance(expr, SglVariable):
            self.turn.append(str(expr.source.get_var(expr.name)))
        elif isinstance(expr, SglGen):
            if expr.sampling_params.n not in (None, 1):
                raise BackendError("gen with n > 1 cannot be speculated in an assistant turn")
            self.turn.append(expr)
        elif isinstance(expr, SglRoleEnd) and expr.role == "assistant":
            turn, self.turn = self.turn, None
            self._finish_turn(exe, turn)
            return False
        elif isinstance(expr, SglSeparateReasoning):
            # As SGLang: what the turn holds so far is generated first, so that there is output to split.
            turn, self.turn = self.turn, []
            self._finish_turn(exe, turn)
            return False
        else:
            raise BackendError(f"{expr!r} cannot appear inside an assistant turn under API speculative "
                               f"execution (only text, variables, gen and separate_reasoning)")
        return True

    def _finish_turn(self, exe: "StreamExecutor", turn: list[Union[str, SglGen]]) -> None:
        gens = [p for p in turn if isinstance(p, SglGen)]
        if not gens:
            exe._append_text("".join(turn))  # type: ignore[arg-type]
            return
        sp: SglSamplingParams = exe._resolve_sampling_params(gens[0].sampling_params)
        if len(turn) > 1:  # a turn that is one gen is an ordinary call
            sp.max_new_tokens = max(self.num_tokens, sp.max_new_tokens)
            sp.stop = list(exe.chat_template.stop_str)
        values, meta = self._ask_turn(exe, turn, sp)
        self.served += len(gens) - 1
        # As SGLang: the turn's text follows its template; gens the replies did not reach are left empty.
        values += [""] * (len(gens) - len(values))
        it = iter(values)
        for p in turn:
            if isinstance(p, str):
                exe._append_text(p)
            else:
                value = next(it)
                exe._append_text(value)
                exe._set_var_done(p.name, value, {**meta, "speculative": True})

    def _ask_turn(self, exe: "StreamExecutor", turn: list[Union[str, SglGen]],
                  sp: SglSamplingParams) -> tuple[list[str], dict]:
        """Asks for the turn up to `max_tries` times until a reply follows its template; returns the values of
        the reply that matched furthest (the first such) and its meta_info."""
        best: tuple[list[str], dict] = ([], {})
        for attempt in range(self.max_tries):
            reply, meta = exe.backend.generate(exe, sampling_params=sp)
            values, complete = match_turn_prefix(turn, reply)
            if complete:
                return values, meta
            if attempt == 0 or len(values) > len(best[0]):
                best = (values, meta)
        self.unmatched += 1
        logger.warning("API speculative execution: after %d tries the assistant's replies do not follow the "
                       "turn's template; keeping the %d of %d gens that matched", self.max_tries, len(best[0]),
                       sum(isinstance(p, SglGen) for p in turn))
        return best
