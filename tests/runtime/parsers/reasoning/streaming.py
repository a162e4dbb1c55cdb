"""Streams a text through a parser in pieces of every size and checks each way adds up to the whole-text split."""
from __future__ import annotations

from radixlm.runtime.parsers.reasoning import ReasoningParser, Split


def streamed(parser: ReasoningParser, text: str, size: int) -> Split:
    fresh = ReasoningParser(parser.name, parser.starts_in_reasoning)
    out = Split()
    for i in range(0, len(text), size):
        out = out + fresh.stream(text[i:i + size])
    return out + fresh.finish()


def assert_split(parser: ReasoningParser, text: str, reasoning: str, content: str) -> None:
    """The whole text splits as expected, and so does every streaming of it (pieces of 1 .. len(text) characters)."""
    assert parser.split(text) == Split(reasoning, content)
    for size in range(1, max(len(text), 1) + 1):
        assert streamed(parser, text, size) == Split(reasoning, content), f"pieces of {size}"
