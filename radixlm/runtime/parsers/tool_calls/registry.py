"""The tool-call formats by SGLang's `--tool-call-parser` values, and `auto`: the format the chat template writes."""
from __future__ import annotations

from radixlm.runtime.parsers.tool_calls.core import ToolCallFormat
from radixlm.runtime.parsers.tool_calls.gpt_oss import GPT_OSS
from radixlm.runtime.parsers.tool_calls.hermes import HERMES
from radixlm.runtime.parsers.tool_calls.json_array import JSON_ARRAY
from radixlm.runtime.parsers.tool_calls.llama3 import LLAMA3
from radixlm.runtime.parsers.tool_calls.mistral import MISTRAL
from radixlm.runtime.parsers.tool_calls.named_args import DEEPSEEK_V3, DEEPSEEK_V31, KIMI_K2
from radixlm.runtime.parsers.tool_calls.pythonic import PYTHONIC
from radixlm.runtime.parsers.tool_calls.xml_params import DEEPSEEK_V32, GLM45, GLM47, QWEN3_CODER

TOOL_CALL_FORMATS: dict[str, ToolCallFormat] = {
    "hermes": HERMES,
    "qwen25": HERMES,
    "qwen": HERMES,
    "llama3": LLAMA3,
    "pythonic": PYTHONIC,
    "mistral": MISTRAL,
    "deepseekv3": DEEPSEEK_V3,
    "deepseekv31": DEEPSEEK_V31,
    "deepseekv32": DEEPSEEK_V32,
    "qwen3_coder": QWEN3_CODER,
    "kimi_k2": KIMI_K2,
    "glm45": GLM45,
    "glm": GLM45,
    "glm47": GLM47,
    "gpt-oss": GPT_OSS,
}
# Not a --tool-call-parser value: what a constraint falls back to when the family's format has no structural tags.
JSON_ARRAY_FORMAT = "json_array"
TOOL_CALL_PARSERS = ("auto", *TOOL_CALL_FORMATS)

# Marks in a chat template that name its format (all of a row's marks present), most specific first.
_TEMPLATE_MARKS = (
    (("<tool_call>", "<function="), "qwen3_coder"),
    (("<tool_call>", "<arg_key>"), "glm45"),
    (("<tool_call>",), "hermes"),
    (("<|python_tag|>",), "llama3"),
    (("ipython",), "llama3"),
    (("<｜DSML｜",), "deepseekv32"),
    (("<｜tool▁calls▁begin｜>", "```json"), "deepseekv3"),
    (("<｜tool▁calls▁begin｜>",), "deepseekv31"),
    (("<|tool_calls_section_begin|>",), "kimi_k2"),
    (("[TOOL_CALLS]",), "mistral"),
    (("<|channel|>",), "gpt-oss"),
)


def get_format(name: str) -> ToolCallFormat:
    if name == JSON_ARRAY_FORMAT:
        return JSON_ARRAY
    try:
        return TOOL_CALL_FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown tool call parser {name!r}; choose from {TOOL_CALL_PARSERS}") from None


def resolve_parser(parser: str, chat_template: str | None) -> str:
    """The format name of `parser`; for `auto` the one the chat template writes (hermes when it says nothing)."""
    if parser != "auto":
        get_format(parser)
        return parser
    template = chat_template or ""
    return next((name for marks, name in _TEMPLATE_MARKS if all(m in template for m in marks)), "hermes")
