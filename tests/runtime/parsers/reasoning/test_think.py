"""The think-tag families on their documented output formats, whole and streamed, and on malformed output."""
from __future__ import annotations

import random

import pytest

from radixlm.runtime.parsers.reasoning import FAMILIES, ReasoningParser
from radixlm.runtime.parsers.reasoning.think import ThinkTags
from tests.runtime.parsers.reasoning.streaming import assert_split, streamed

R1 = ReasoningParser("deepseek-r1")

DOCUMENTED = [
    # DeepSeek-R1: the template opens <think>; R1-0528 writes the tag again
    ("deepseek-r1", None, "I need to think about this...</think>The answer is 42.",
     "I need to think about this...", "The answer is 42."),
    ("deepseek-r1", None, "<think>I need to think about this...</think>The answer is 42.",
     "I need to think about this...", "The answer is 42."),
    ("step3", None, "a</think>b", "a", "b"),
    # DeepSeek-V3.1: thinking only with chat_template_kwargs thinking=true
    ("deepseek-v3", {"thinking": True}, "Let me see.</think>Paris.", "Let me see.", "Paris."),
    ("deepseek-v3", {}, "Paris.", "", "Paris."),
    ("deepseek-v3", {"thinking": False}, "Paris.", "", "Paris."),
    # Qwen3: thinks unless enable_thinking=false (then the template closes an empty block itself)
    ("qwen3", {}, "<think>\nreasoning content\n</think>\n\nThe answer is 42.", "\nreasoning content\n",
     "\n\nThe answer is 42."),
    ("qwen3", {"enable_thinking": True}, "reasoning</think>42", "reasoning", "42"),
    ("qwen3", {"enable_thinking": False}, "The answer is 42.", "", "The answer is 42."),
    ("qwen3", {}, "<think>look it up\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
     "look it up\n", "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>"),
    ("qwen3-thinking", {"enable_thinking": False}, "hmm</think>\n\n4", "hmm", "\n\n4"),
    ("glm45", {}, "\n<think>Weather: call the tool.</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>",
     "Weather: call the tool.", "\n<tool_call>get_weather\n<arg_key>city</arg_key>"),
    ("glm45", {"enable_thinking": False}, "Hello!", "", "Hello!"),
    ("kimi", {}, "◁think▷The user greets me.◁/think▷Hello!", "The user greets me.", "Hello!"),
    ("kimi", {}, "Hello!", "", "Hello!"),
    ("kimi_k2", {}, "<think>need the tool</think><|tool_calls_section_begin|><|tool_call_begin|>",
     "need the tool", "<|tool_calls_section_begin|><|tool_call_begin|>"),
    ("kimi_k2", {}, "need the tool<|tool_calls_section_begin|>x", "need the tool", "<|tool_calls_section_begin|>x"),
    ("kimi_k2", {"thinking": False}, "Hi", "", "Hi"),
    ("minimax", None, "<think>m</think>n", "m", "n"),
]


@pytest.mark.parametrize("name,kwargs,text,reasoning,content", DOCUMENTED)
def test_documented_formats_whole_and_streamed(name, kwargs, text, reasoning, content):
    parser = ReasoningParser(name) if kwargs is None else ReasoningParser.for_request(name, kwargs)
    assert_split(parser, text, reasoning, content)


@pytest.mark.parametrize("name,kwargs,text,reasoning,content", [
    ("deepseek-r1", None, "still thinking about <thi", "still thinking about <thi", ""),  # cut before the end tag
    ("deepseek-r1", None, "", "", ""),
    ("deepseek-r1", None, "</think>", "", ""),
    ("deepseek-r1", None, "  \n", "  \n", ""),
    ("qwen3", None, "  \n", "", "  \n"),  # no template told: only a tag opens the block
    ("qwen3", None, "<thi", "", "<thi"),
    ("qwen3", None, "<think>", "", ""),
    ("qwen3", None, "no tags at all", "", "no tags at all"),
    ("qwen3", {}, "no tags at all", "no tags at all", ""),
    ("qwen3", None, "answer, then <think>late</think> tags", "", "answer, then <think>late</think> tags"),
    ("qwen3", None, "</think>stray end", "", "</think>stray end"),
    ("deepseek-r1", None, "a</think>b</think>c<think>d", "a", "b</think>c<think>d"),
    ("deepseek-r1", None, "<think><think>x</think>y", "<think>x", "y"),
    ("qwen3", {}, "<tool_call></think>", "", "<tool_call></think>"),  # the earlier closer wins
    ("kimi", None, "◁think▷unterminated ◁/thi", "unterminated ◁/thi", ""),
])
def test_unterminated_and_malformed(name, kwargs, text, reasoning, content):
    parser = ReasoningParser(name) if kwargs is None else ReasoningParser.for_request(name, kwargs)
    assert_split(parser, text, reasoning, content)


def test_streaming_holds_back_only_a_possible_tag():
    p = ReasoningParser("deepseek-r1")
    assert p.stream("abc</th").reasoning == "abc"  # "</th" may be the end tag
    assert p.stream("x").reasoning == "</thx"  # it was not
    out = p.stream("</think>")
    assert (out.reasoning, out.content) == ("", "")
    assert p.stream("done").content == "done"
    assert not p.finish()


def test_split_does_not_disturb_a_stream_in_progress():
    p = ReasoningParser("deepseek-r1")
    p.stream("half")
    assert R1.split("x</think>y") == p.split("x</think>y")
    assert p.stream("</think>rest").content == "rest"


@pytest.mark.parametrize("name", sorted(n for n, f in FAMILIES.items() if f.tags is not None))
def test_random_tag_soup_never_raises_and_streams_exactly(name):
    tags = FAMILIES[name].tags
    pieces = [tags.start, tags.end, tags.start[:3], tags.end[:4], tags.tool_start or "", " ", "\n", "a", "<", "/"]
    rng = random.Random(name)
    for starts in (False, True):
        parser = ReasoningParser(name, starts)
        for _ in range(40):
            text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
            whole = parser.split(text)
            for size in (1, 2, 3, 5):
                assert streamed(parser, text, size) == whole, (text, size)


def test_tags_are_checked():
    with pytest.raises(ValueError, match="non-empty"):
        ThinkTags("", "</think>")
