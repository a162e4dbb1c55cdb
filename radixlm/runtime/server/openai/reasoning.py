"""The reasoning stage of /v1/chat/completions: with --reasoning-parser (and the request's separate_reasoning), the
model's text is split into reasoning_content and content before anything else (tool calls are parsed from the
content only)."""
from __future__ import annotations

from typing import Any, Mapping

from radixlm.runtime.parsers.reasoning import ReasoningParser, family
from radixlm.runtime.server.errors import BadRequest


def request_parser(name: str | None, separate: bool, template_kwargs: Mapping[str, Any] | None
                   ) -> ReasoningParser | None:
    """The parser for one request (None: no split); a 400 for a chat_template_kwargs toggle it cannot read."""
    if name is None or not separate:
        return None
    try:
        return ReasoningParser.for_request(name, template_kwargs)
    except ValueError as e:
        raise BadRequest(str(e)) from None


def starts_in_reasoning(name: str | None, template_kwargs: Mapping[str, Any] | None) -> bool | None:
    """Whether the parser reads the output as starting in reasoning (a thinking budget counts from there); None
    without a parser. A 400 for a toggle it cannot read."""
    if name is None:
        return None
    try:
        return family(name).starts_in_reasoning(template_kwargs if template_kwargs is not None else {})
    except ValueError as e:
        raise BadRequest(str(e)) from None


def keeps_special_tokens(name: str | None) -> bool:
    """Whether the parser's markers are special tokens, which the detokenizer must then keep in the text."""
    return name is not None and family(name).keeps_special_tokens


def split_text(parser: ReasoningParser | None, text: str) -> tuple[str | None, str]:
    """(reasoning_content, content) of a finished sample; reasoning_content None when there is none."""
    if parser is None:
        return None, text
    split = parser.split(text)
    return split.reasoning or None, split.content


def reasoning_token_count(tokenizer, reasoning: list[str | None]) -> int:
    """The tokens of the samples' reasoning text (usage's reasoning_tokens): the text re-encoded, without the markers."""
    return sum(len(tokenizer.encode(r, add_special_tokens=False)) for r in reasoning if r)


class StreamedReasoning:
    """One sample's stream: each cumulative snapshot of the model's text in, the new reasoning and the content so far
    out (a possible partial tag is held until the next snapshot or the end)."""

    def __init__(self, parser: ReasoningParser | None):
        self.parser = None if parser is None else ReasoningParser(parser.name, parser.starts_in_reasoning)
        self._seen = 0
        self._content = ""
        self.reasoning = ""  # all the reasoning split off so far

    def feed(self, text: str, final: bool) -> tuple[str, str]:
        if self.parser is None:
            return "", text
        split = self.parser.stream(text[self._seen:])
        self._seen = len(text)
        if final:
            split = split + self.parser.finish()
        self._content += split.content
        self.reasoning += split.reasoning
        return split.reasoning, self._content
