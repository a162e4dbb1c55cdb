"""Parser names and whether a request's output starts inside the reasoning block."""
from __future__ import annotations

import pytest

from radixlm.runtime.args.choices import REASONING_PARSERS
from radixlm.runtime.parsers.reasoning import FAMILIES, ReasoningFamily, ReasoningParser, StartMode, ThinkTags

SGLANG_NAMES = {"deepseek-r1", "deepseek-v3", "qwen3", "qwen3-thinking", "kimi", "glm45", "gpt-oss"}


def test_sglang_names_are_served():
    assert SGLANG_NAMES <= set(REASONING_PARSERS) == set(FAMILIES)


@pytest.mark.parametrize("name,kwargs,starts", [
    ("deepseek-r1", {}, True), ("deepseek-r1", {"thinking": False}, True),
    ("qwen3-thinking", {"enable_thinking": False}, True),
    ("qwen3", {}, True), ("qwen3", {"enable_thinking": True}, True), ("qwen3", {"enable_thinking": False}, False),
    ("qwen3", {"thinking": False}, True),  # not Qwen3's key: its template ignores it
    ("glm45", {"enable_thinking": False}, False),
    ("deepseek-v3", {}, False), ("deepseek-v3", {"thinking": True}, True),
    ("deepseek-v3", {"enable_thinking": True}, False),
    ("kimi_k2", {}, True), ("kimi_k2", {"thinking": False}, False),
    ("kimi", {"enable_thinking": True}, False),
    ("mimo", {}, False), ("mimo", {"enable_thinking": True}, True),
    ("QWEN3", None, True),
])
def test_for_request_reads_the_template_toggle(name, kwargs, starts):
    assert ReasoningParser.for_request(name, kwargs).starts_in_reasoning is starts


def test_without_a_template_only_always_families_start_inside():
    assert ReasoningParser("deepseek-r1").starts_in_reasoning and not ReasoningParser("qwen3").starts_in_reasoning


def test_bad_names_and_toggles_raise_value_errors():
    with pytest.raises(ValueError, match="unknown reasoning parser 'nope'; choose from"):
        ReasoningParser("nope")
    with pytest.raises(ValueError, match="enable_thinking: must be a boolean"):
        ReasoningParser.for_request("qwen3", {"enable_thinking": "false"})
    with pytest.raises(ValueError, match="needs toggle"):
        ReasoningFamily(ThinkTags("<a>", "</a>"), StartMode.IF_ENABLED)
    with pytest.raises(ValueError, match="takes no toggle"):
        ReasoningFamily(ThinkTags("<a>", "</a>"), StartMode.ALWAYS, "thinking")
