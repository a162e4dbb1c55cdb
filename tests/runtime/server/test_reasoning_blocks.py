"""The reasoning stage of the output blocks (what /v1/responses and /v1/messages render), without a server: the
reasoning split off first into a REASONING block, whole and streamed in pieces of any size; rendered as the openai
SDK's reasoning item and events and the anthropic SDK's thinking block and events; Anthropic's `thinking` field."""
from __future__ import annotations

import json

import pytest
from anthropic import types as asdk
from openai.types import responses as osdk

from radixlm.runtime.parsers.reasoning import ReasoningParser
from radixlm.runtime.server import anthropic_protocol as aproto
from radixlm.runtime.server import anthropic_render as render
from radixlm.runtime.server.anthropic import block_events
from radixlm.runtime.server.errors import BadRequest
from radixlm.runtime.server.openai.responses import EventRenderer
from radixlm.runtime.server.openai.responses_protocol import item_id, output_item
from radixlm.runtime.server.openai.tool_calls import ToolPlan
from radixlm.runtime.server.output_blocks import Block, BlockKind, BlockStream, EventType, final_blocks

HERMES = ToolPlan([], frozenset({"weather"}), "hermes", None)
PLAIN = ToolPlan(None, frozenset(), None, None)
CALL = '<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
QWEN3 = ReasoningParser("qwen3", starts_in_reasoning=True)  # the template opened <think>
R1 = ReasoningParser("deepseek-r1")

CASES = [
    (QWEN3, HERMES, "I should look it up.</think>Sure." + CALL,
     [(BlockKind.REASONING, "I should look it up."), (BlockKind.TEXT, "Sure."), (BlockKind.TOOL_CALL, "weather")]),
    (QWEN3, HERMES, "Oslo?</think>\n\n" + CALL, [(BlockKind.REASONING, "Oslo?"), (BlockKind.TOOL_CALL, "weather")]),
    (R1, PLAIN, "<think>hm</think>Paris", [(BlockKind.REASONING, "hm"), (BlockKind.TEXT, "Paris")]),
    (QWEN3, PLAIN, "cut off while thinking", [(BlockKind.REASONING, "cut off while thinking")]),
    (QWEN3, PLAIN, "", [(BlockKind.TEXT, "")]),
    (None, PLAIN, "<think>hm</think>Paris", [(BlockKind.TEXT, "<think>hm</think>Paris")]),
]


def kinds(blocks: list[Block]) -> list[tuple]:
    return [(b.kind, b.name if b.kind is BlockKind.TOOL_CALL else b.text.strip()) for b in blocks]


def streamed(reasoning, plan: ToolPlan, text: str, step: int):
    stream = BlockStream(plan, reasoning)
    events = [e for end in [*range(step, len(text), step), len(text)]
              for e in stream.feed(text[:end], end == len(text))]
    return events, stream.blocks


@pytest.mark.parametrize("reasoning,plan,text,expected", CASES)
def test_reasoning_comes_first_whole_and_streamed_in_pieces(reasoning, plan, text, expected):
    whole = final_blocks(plan, text, reasoning)
    assert kinds(whole) == expected
    for step in (1, 2, 5, 1000):
        events, blocks = streamed(reasoning, plan, text, step)
        assert [(b.kind, b.text, b.name) for b in blocks] == [(b.kind, b.text, b.name) for b in whole]
        for i, block in enumerate(blocks):
            mine = [e for e in events if e.index == i]
            assert mine[0].type is EventType.START and mine[-1].type is EventType.STOP and mine[-1].block == block
            assert "".join(e.block.text for e in mine[1:-1]) == block.text


def test_a_forced_tool_choice_has_no_reasoning():
    # The constraint makes the output calls from its first token, though the parser would start in the reasoning.
    forced = ToolPlan(None, frozenset({"weather"}), "json_array", "{}", forced=True)
    calls = '[{"name": "weather", "arguments": {"city": "Oslo"}}]'
    assert kinds(final_blocks(forced, calls, QWEN3)) == [(BlockKind.TOOL_CALL, "weather")]
    assert kinds(streamed(QWEN3, forced, calls, 7)[1]) == [(BlockKind.TOOL_CALL, "weather")]


def sse_data(chunks: list[bytes]) -> list[dict]:
    return [json.loads(c.split(b"\ndata: ", 1)[1]) for c in chunks]


def test_responses_reasoning_item_and_events_have_the_sdk_shapes():
    text = "I should look it up.</think>Sure." + CALL
    whole = final_blocks(HERMES, text, QWEN3)
    item = osdk.ResponseReasoningItem.model_validate(output_item(whole[0], item_id(BlockKind.REASONING), "completed"))
    assert item.id.startswith("rs_") and item.summary == [] and item.content[0].text == "I should look it up."

    renderer, (events, _) = EventRenderer(), streamed(QWEN3, HERMES, text, 3)
    datas = sse_data([c for e in events for c in renderer.render(e, "completed")])
    classes = {"response.output_item.added": osdk.ResponseOutputItemAddedEvent,
               "response.output_item.done": osdk.ResponseOutputItemDoneEvent,
               "response.content_part.added": osdk.ResponseContentPartAddedEvent,
               "response.content_part.done": osdk.ResponseContentPartDoneEvent,
               "response.reasoning_text.delta": osdk.ResponseReasoningTextDeltaEvent,
               "response.reasoning_text.done": osdk.ResponseReasoningTextDoneEvent}
    parsed = [classes[d["type"]].model_validate(d) for d in datas if d["type"] in classes]
    mine = [p for p in parsed if p.output_index == 0]
    assert [p.type for p in mine if not p.type.endswith("delta")] == [
        "response.output_item.added", "response.content_part.added", "response.reasoning_text.done",
        "response.content_part.done", "response.output_item.done"]
    assert mine[1].part.type == "reasoning_text" and mine[0].item.type == "reasoning"
    deltas = "".join(p.delta for p in mine if p.type == "response.reasoning_text.delta")
    assert deltas == mine[-1].item.content[0].text == "I should look it up."
    assert [it["type"] for it in renderer.items] == ["reasoning", "message", "function_call"]


def test_anthropic_thinking_block_and_events_have_the_sdk_shapes():
    text = "I should look it up.</think>Sure." + CALL
    content = [render.content_block(b) for b in final_blocks(HERMES, text, QWEN3)]
    msg = asdk.Message.model_validate(render.message_body(
        "msg_1", "m", content, "tool_use", None, render.usage({"prompt_tokens": 5, "completion_tokens": 9})))
    assert isinstance(msg.content[0], asdk.ThinkingBlock) and msg.content[0].thinking == "I should look it up."
    assert [b.type for b in msg.content] == ["thinking", "text", "tool_use"]

    events, _ = streamed(QWEN3, HERMES, text, 4)
    datas = sse_data([c for e in events for c in block_events(e)])
    parsed = [_event(d) for d in datas]
    first = [p for p in parsed if p.index == 0]
    assert first[0].type == "content_block_start" and first[0].content_block.type == "thinking"
    assert first[-2].delta.type == "signature_delta" and first[-1].type == "content_block_stop"
    assert "".join(p.delta.thinking for p in first[1:-2]) == "I should look it up."
    # display "omitted": the block comes back empty, its signature still sent.
    assert render.content_block(Block(BlockKind.REASONING, "x"), omit_thinking=True)["thinking"] == ""
    omitted = sse_data([c for e in events if e.index == 0 for c in block_events(e, omit_thinking=True)])
    assert [d["type"] for d in omitted] == ["content_block_start", "content_block_delta", "content_block_stop"]


def _event(d: dict):
    classes = {"content_block_start": asdk.RawContentBlockStartEvent,
               "content_block_delta": asdk.RawContentBlockDeltaEvent,
               "content_block_stop": asdk.RawContentBlockStopEvent}
    return classes[d["type"]].model_validate(d)


def request(**fields) -> aproto.MessagesRequest:
    body = {"model": "m", "max_tokens": 2048, "messages": [{"role": "user", "content": "Weather?"}], **fields}
    return aproto.parse(aproto.MessagesRequest, json.dumps(body).encode())


def test_the_thinking_field_sets_the_templates_toggle():
    on = {"type": "enabled", "budget_tokens": 1024}
    assert request(thinking=on).chat_request("m", "enable_thinking").chat_template_kwargs == {"enable_thinking": True}
    off = request(thinking={"type": "disabled"}).chat_request("m", "thinking")
    assert off.chat_template_kwargs == {"thinking": False}
    assert request(thinking={"type": "adaptive"}).template_kwargs("t") == {"t": True}
    assert request().chat_request("m", "enable_thinking").chat_template_kwargs is None
    assert request(thinking=on).chat_request("m", None).chat_template_kwargs is None  # a family with no toggle
    for bad in ({"type": "enabled", "budget_tokens": 1023}, {"type": "enabled"}, {"type": "sometimes"},
                {"type": "disabled", "budget_tokens": 2000}):
        with pytest.raises(BadRequest):
            request(thinking=bad)
    with pytest.raises(BadRequest, match="budget_tokens: must be less than max_tokens"):
        request(thinking={"type": "enabled", "budget_tokens": 4096}).chat_request("m")


def test_budget_tokens_becomes_the_thinking_budget_where_the_family_has_an_end_tag():
    on = {"type": "enabled", "budget_tokens": 1500}
    assert request(thinking=on).chat_request("m", "enable_thinking", True).thinking_token_budget == 1500
    assert request(thinking=on).chat_request("m", "enable_thinking").thinking_token_budget is None  # no parser
    assert request(thinking={"type": "adaptive"}).chat_request("m", None, True).thinking_token_budget is None


def test_thinking_blocks_sent_back_are_dropped_from_the_prompt():
    thought = {"type": "thinking", "thinking": "hm", "signature": ""}
    use = {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Oslo"}}
    messages = [{"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": [thought, {"type": "redacted_thinking", "data": "x"}, use]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "rain"}]}]
    chat = request(messages=messages).chat_request("m")
    assert [m.role for m in chat.messages] == ["user", "assistant", "tool"]
    assert "hm" not in json.dumps([m.model_dump() for m in chat.messages])
    with pytest.raises(BadRequest, match="thinking blocks belong in assistant messages"):
        request(messages=[{"role": "user", "content": [thought]}]).chat_request("m")
