"""gpt-oss's harmony channels: analysis is reasoning, final and preambles are content, tool calls pass through raw."""
from __future__ import annotations

import random

import pytest

from radixlm.runtime.parsers.reasoning import ReasoningParser
from radixlm.runtime.parsers.reasoning.harmony import MAX_HEADER_CHARS
from tests.runtime.parsers.reasoning.streaming import assert_split, streamed

GPT_OSS = ReasoningParser("gpt-oss")
CALL = ("<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
        "{\"location\":\"SF\"}<|call|>")


@pytest.mark.parametrize("text,reasoning,content", [
    ("<|channel|>analysis<|message|>User asks 2 + 2. Simple.<|end|><|start|>assistant<|channel|>final<|message|>"
     "2 + 2 = 4.<|return|>", "User asks 2 + 2. Simple.", "2 + 2 = 4."),
    ("<|channel|>analysis<|message|>Need the weather tool.<|end|>" + CALL, "Need the weather tool.", CALL),
    ("<|channel|>analysis<|message|>Use the tool.<|end|><|start|>assistant to=functions.f<|channel|>commentary json"
     "<|message|>{}<|call|>", "Use the tool.", "<|start|>assistant to=functions.f<|channel|>commentary json"
                                              "<|message|>{}<|call|>"),
    ("<|channel|>commentary<|message|>Let me check.<|end|><|start|>assistant<|channel|>final<|message|>Done.",
     "", "Let me check.Done."),  # a preamble is for the user; the final message is cut (no <|return|>)
    ("<|channel|>final<|message|>Hi", "", "Hi"),
    ("<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>analysis<|message|>b<|end|>", "ab", ""),
])
def test_documented_format_whole_and_streamed(text, reasoning, content):
    assert_split(GPT_OSS, text, reasoning, content)


@pytest.mark.parametrize("text,reasoning,content", [
    ("plain text, no markup", "", "plain text, no markup"),
    ("", "", ""),
    ("<|channel|>analysis<|message|>cut mid-thought", "cut mid-thought", ""),
    ("<|channel|>analysis<|message|>cut at a marker <|en", "cut at a marker <|en", ""),
    ("<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>fin", "x", ""),  # a header cut off
    ("<|channel|>analysis<|message|>no end<|start|>assistant<|channel|>final<|message|>y", "no end", "y"),
    ("<|return|><|channel|>final<|message|>z<|end|>", "", "z"),  # stray terminators
    ("<|channel|>" + "x" * MAX_HEADER_CHARS + "<|message|>m", "",
     "<|channel|>" + "x" * MAX_HEADER_CHARS + "<|message|>m"),  # too far for a header
    ("<|channel|>final<|message|>a <|message|> b", "", "a <|message|> b"),
])
def test_malformed_or_cut_output(text, reasoning, content):
    assert_split(GPT_OSS, text, reasoning, content)


def test_random_markup_never_raises_and_streams_exactly():
    pieces = ["<|channel|>", "analysis", "final", "commentary", " to=functions.f", "<|message|>", "<|end|>",
              "<|start|>assistant", "<|call|>", "<|return|>", "<|", "|>", "a", " "]
    rng = random.Random(0)
    for _ in range(150):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 14)))
        whole = GPT_OSS.split(text)
        for size in (1, 2, 3, 7):
            assert streamed(GPT_OSS, text, size) == whole, (text, size)


def test_keeps_special_tokens():
    assert GPT_OSS.keeps_special_tokens and not ReasoningParser("qwen3").keeps_special_tokens
