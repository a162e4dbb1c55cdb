"""gpt-oss (the harmony format): a call is a message on the commentary channel addressed to `functions.NAME`;
the content is what the final channel says. The recipient may also stand in the role header.

    <|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary
    to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>"""
from __future__ import annotations

import re
from dataclasses import dataclass

from radixlm.runtime.parsers.tool_calls.core import held
from radixlm.runtime.parsers.tool_calls.named_args import NamedArgs

_MARKER = re.compile(r"(<\|(?:start|channel|constrain|message|end|return|call)\|>)")
_MARKERS = ("<|start|>", "<|channel|>", "<|constrain|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>")
_HEADERS = ("<|start|>", "<|channel|>", "<|constrain|>")
_ENDS = ("<|end|>", "<|return|>", "<|call|>")


def harmony_text(text: str, complete: bool) -> str:
    """What the final channel (or text outside any message) says; other channels (analysis, commentary) and
    headers are dropped."""
    if not complete:
        text = text[:len(text) - held(text, *_MARKERS, "to=functions.")]
    out: list[str] = []
    mode, channel, header = "free", None, ""
    for part in _MARKER.split(text):
        if part in _HEADERS:
            if part == "<|start|>":
                channel = None
            mode, header = "header", part
        elif part == "<|message|>":
            mode = "body"
        elif part in _ENDS:
            mode, channel = "free", None
        elif mode == "header":
            if header == "<|channel|>" and part.split():
                channel = part.split()[0]
        elif mode == "free" or channel in (None, "final"):
            out.append(part)
    return "".join(out)


@dataclass(frozen=True)
class GptOss(NamedArgs):
    def clean(self, content: str, complete: bool) -> str:
        return harmony_text(content, complete)


GPT_OSS = GptOss(
    call_open="to=functions.", name_end="<|message|>", call_close=("<|call|>",),
    name_pattern=r"([\w\-]+)(?:\s*<\|channel\|>\s*commentary)?(?:\s*<\|constrain\|>)?\s*(?:json)?\s*",
    write_open="<|channel|>commentary to=functions.", write_name="{name} <|constrain|>json<|message|>",
    write_close="<|call|>", separator="<|start|>assistant", special_markers=True)
