"""SGLang's --tool-call-parser names, and `auto` reading the chat template."""
from __future__ import annotations

import pytest

from radixlm.runtime.args import ServerArgs
from radixlm.runtime.parsers.tool_calls import TOOL_CALL_PARSERS, get_format, resolve_parser

SGLANG_NAMES = ("hermes", "qwen25", "qwen", "llama3", "pythonic", "mistral", "deepseekv3", "deepseekv31", "deepseekv32",
                "qwen3_coder", "kimi_k2", "glm45", "glm", "glm47", "gpt-oss")


def test_names():
    assert set(TOOL_CALL_PARSERS) == {"auto", *SGLANG_NAMES}
    assert get_format("qwen25") is get_format("hermes")
    with pytest.raises(ValueError, match="unknown tool call parser 'nope'"):
        get_format("nope")


@pytest.mark.parametrize("template,want", [
    ("{{ '<tool_call>' }} {{ tools }}", "hermes"),
    ("<tool_call>\n<function={{ name }}>", "qwen3_coder"),
    ("<tool_call>{{ name }}<arg_key>", "glm45"),
    ("{%- if builtin_tools %}<|python_tag|>", "llama3"),
    ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + name + '\\n```json", "deepseekv3"),
    ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + name + '<｜tool▁sep｜>", "deepseekv31"),
    ("{{ '<｜DSML｜function_calls>' }}", "deepseekv32"),
    ("<|tool_calls_section_begin|>", "kimi_k2"),
    ("[TOOL_CALLS]", "mistral"),
    ("<|start|>assistant<|channel|>", "gpt-oss"),
    (None, "hermes"),
])
def test_auto_reads_the_template(template, want):
    assert resolve_parser("auto", template) == want
    assert resolve_parser("llama3", template) == "llama3"  # a named parser wins


def test_server_args_validate_the_choice():
    assert ServerArgs(tool_call_parser="kimi_k2").tool_call_parser == "kimi_k2"
    with pytest.raises(ValueError, match="tool_call_parser"):
        ServerArgs(tool_call_parser="qwen2")
