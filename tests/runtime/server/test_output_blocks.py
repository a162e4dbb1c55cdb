"""Output blocks (what /v1/responses and /v1/messages render): streamed in pieces of any size, the events add up
to the blocks of the whole output."""
from __future__ import annotations

import json

import pytest

from radixlm.runtime.server.openai.tool_calls import ToolPlan
from radixlm.runtime.server.output_blocks import Block, BlockKind, BlockStream, EventType, final_blocks

NAMES = frozenset({"weather", "time"})
CONSTRAINED = ToolPlan(None, NAMES, "json_array", "{}")
HERMES = ToolPlan([], NAMES, "hermes", None)
PLAIN = ToolPlan(None, frozenset(), None, None)
TWO_CALLS = '[{"name": "weather", "arguments": {"city": "Paris"}}, {"name": "time", "arguments": {"tz": "CET"}}]'
TEXT_THEN_CALL = 'Let me look.\n<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>'


def streamed(plan: ToolPlan, text: str, step: int) -> tuple[list, list[Block]]:
    stream = BlockStream(plan)
    events = []
    for end in [*range(step, len(text), step), len(text)]:
        events += stream.feed(text[:end], end == len(text))
    return events, stream.blocks


@pytest.mark.parametrize("plan,text", [(CONSTRAINED, TWO_CALLS), (HERMES, TEXT_THEN_CALL), (PLAIN, "Hello there"),
                                       (CONSTRAINED, ""), (PLAIN, "")])
@pytest.mark.parametrize("step", [1, 3, 1000])
def test_streamed_events_add_up_to_the_final_blocks(plan, text, step):
    events, blocks = streamed(plan, text, step)
    final = final_blocks(plan, text)
    assert [(b.kind, b.text, b.name) for b in blocks] == [(b.kind, b.text, b.name) for b in final]
    for i, block in enumerate(blocks):
        mine = [e for e in events if e.index == i]
        assert mine[0].type is EventType.START and mine[0].block.text == ""
        assert mine[-1].type is EventType.STOP and mine[-1].block == block
        assert all(e.type is EventType.DELTA for e in mine[1:-1])
        assert "".join(e.block.text for e in mine[1:-1]) == block.text
        assert {e.block.call_id for e in mine} == {block.call_id}
    starts = [e.index for e in events if e.type is EventType.START]
    assert starts == list(range(len(blocks)))  # one block open at a time, in order


def test_blocks_of_calls_and_text():
    calls = final_blocks(CONSTRAINED, TWO_CALLS)
    assert [(b.kind, b.name, json.loads(b.text)) for b in calls] == [
        (BlockKind.TOOL_CALL, "weather", {"city": "Paris"}), (BlockKind.TOOL_CALL, "time", {"tz": "CET"})]
    assert len({b.call_id for b in calls}) == 2 and all(b.call_id.startswith("call_") for b in calls)
    text, call = final_blocks(HERMES, TEXT_THEN_CALL)
    assert (text.kind, text.text) == (BlockKind.TEXT, "Let me look.") and call.name == "weather"
    assert final_blocks(PLAIN, "") == [Block(BlockKind.TEXT, "")]
    # A call to an unknown tool is text, never an error.
    assert final_blocks(HERMES, '<tool_call>{"name": "nope", "arguments": {}}</tool_call>')[0].kind is BlockKind.TEXT
    stream = BlockStream(CONSTRAINED)
    stream.feed(TWO_CALLS[:45], False)  # inside the first call's arguments
    assert stream.called
    assert not BlockStream(PLAIN).called
