"""gpt-oss (harmony): calls on the commentary channel to `functions.NAME`; the final channel is the content."""
from __future__ import annotations

import pytest

from radixlm.runtime.parsers.tool_calls import parse
from radixlm.runtime.parsers.tool_calls.gpt_oss import harmony_text
from tests.runtime.parsers.tool_calls.helpers import assert_never_raises, assert_streams_add_up, calls

TWO = ('<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary '
       'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris", "days": 3}<|call|>'
       '<|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{}<|call|>')
FINAL = "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>It is 4.<|return|>"


def test_documented_outputs():
    assert calls(TWO, "gpt-oss") == [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {})]
    assert parse("gpt-oss", TWO, {"get_weather": None, "get_time": None}).content is None
    p = parse("gpt-oss", FINAL, {"get_time": None})
    assert p.calls == [] and p.content == "It is 4."
    assert parse("gpt-oss", "no harmony at all", {"get_time": None}).content == "no harmony at all"


def test_harmony_text_holds_a_partial_marker():
    assert harmony_text("<|channel|>final<|message|>Hi <|ret", complete=False) == "Hi "
    assert harmony_text("<|channel|>analysis<|message|>thinking", complete=False) == ""


@pytest.mark.parametrize("text", [TWO, FINAL])
def test_streamed_in_pieces_of_every_size(text):
    assert_streams_add_up("gpt-oss", text)


def test_malformed_text_never_raises():
    assert_never_raises("gpt-oss", TWO)
