"""A chat sample's output as a sequence of blocks (reasoning, text, tool calls), whole or as streamed
start/delta/stop events: what /v1/responses (output items) and /v1/messages (content blocks) render in their own
shapes. Tool calls are read by the chat pipeline's `tool_message` / `StreamedTools`, so every API reads a model's calls
alike.

The reasoning stage, once for both APIs: with a request's ReasoningParser, `final_blocks` and `BlockStream.feed` split
the reasoning off the text first (`split_text` / `StreamedReasoning`, as chat does; tool calls are parsed from the
content only) into a REASONING block ahead of the others (none under a forced tool choice, whose constraint makes
the output calls from its first token); the renderers map it to a Responses `reasoning` item and an
Anthropic `thinking` block."""
from __future__ import annotations

import enum
from dataclasses import dataclass

from radixlm.runtime.parsers.reasoning import ReasoningParser
from radixlm.runtime.server.openai.reasoning import StreamedReasoning, split_text
from radixlm.runtime.server.openai.tool_calls import StreamedTools, ToolPlan, tool_message


class BlockKind(enum.Enum):
    REASONING = "reasoning"
    TEXT = "text"
    TOOL_CALL = "tool_call"


@dataclass(frozen=True)
class Block:
    kind: BlockKind
    text: str  # the text or reasoning, or a call's arguments (JSON text of an object)
    call_id: str | None = None
    name: str | None = None


def final_blocks(plan: ToolPlan, text: str, reasoning: ReasoningParser | None = None) -> list[Block]:
    """A finished sample's blocks: its reasoning (if any), its content (if any), then its calls; an output with none
    of them is one empty text block."""
    thought, text = split_text(None if plan.forced else reasoning, text)
    content, calls = tool_message(plan, text)
    blocks = [Block(BlockKind.REASONING, thought)] if thought else []
    blocks += [Block(BlockKind.TEXT, content)] if content else []
    blocks += [Block(BlockKind.TOOL_CALL, c["function"]["arguments"], c["id"], c["function"]["name"])
               for c in calls or []]
    return blocks or [Block(BlockKind.TEXT, "")]


class EventType(enum.Enum):
    START = "start"
    DELTA = "delta"
    STOP = "stop"


@dataclass(frozen=True)
class BlockEvent:
    type: EventType
    index: int  # the block's position in the output
    block: Block  # START: the block, empty; DELTA: the new piece in `text`; STOP: the whole block


class BlockStream:
    """One streamed sample's blocks: feed it the cumulative text; it returns the events of what is new. Blocks open
    when their first piece arrives (a text block only for non-empty text) and close when the next one opens or the
    sample ends; an empty output is one empty text block, as in final_blocks. The reasoning (with a parser) comes
    out of its own stage first, so its block precedes the content's."""

    def __init__(self, plan: ToolPlan, reasoning: ReasoningParser | None = None):
        self._reasoning = StreamedReasoning(None if plan.forced else reasoning)
        self._tools = StreamedTools(plan) if plan.fmt is not None else None
        self._sent = ""
        self._open: Block | None = None
        self._parts: list[str] = []
        self.blocks: list[Block] = []  # closed blocks, in order

    def feed(self, text: str, final: bool) -> list[BlockEvent]:
        events: list[BlockEvent] = []
        thought, text = self._reasoning.feed(text, final)
        if thought:
            events += self._piece(BlockKind.REASONING, thought)
        if self._tools is None:
            # Snapshots are cumulative; a text that does not extend what was sent cannot be taken back.
            if text.startswith(self._sent) and len(text) > len(self._sent):
                events += self._piece(BlockKind.TEXT, text[len(self._sent):])
                self._sent = text
        else:
            delta = self._tools.delta(text, final)
            if delta.get("content"):
                events += self._piece(BlockKind.TEXT, delta["content"])
            for call in delta.get("tool_calls", ()):
                fn = call["function"]
                if "id" in call:
                    events += self._start(Block(BlockKind.TOOL_CALL, "", call["id"], fn["name"]))
                if fn.get("arguments"):
                    events += self._piece(BlockKind.TOOL_CALL, fn["arguments"])
        if final:
            if self._open is None and not self.blocks:
                events += self._start(Block(BlockKind.TEXT, ""))
            events += self._close()
        return events

    @property
    def called(self) -> bool:
        return any(b.kind is BlockKind.TOOL_CALL for b in self.blocks) or (
            self._open is not None and self._open.kind is BlockKind.TOOL_CALL)

    def _piece(self, kind: BlockKind, piece: str) -> list[BlockEvent]:
        events = [] if self._open is not None and self._open.kind is kind else self._start(Block(kind, ""))
        self._parts.append(piece)
        events.append(BlockEvent(EventType.DELTA, len(self.blocks), Block(kind, piece, self._open.call_id,
                                                                          self._open.name)))
        return events

    def _start(self, block: Block) -> list[BlockEvent]:
        events = self._close()
        self._open, self._parts = block, []
        return events + [BlockEvent(EventType.START, len(self.blocks), block)]

    def _close(self) -> list[BlockEvent]:
        if self._open is None:
            return []
        o = self._open
        block = Block(o.kind, "".join(self._parts), o.call_id, o.name)
        self.blocks.append(block)
        self._open = None
        return [BlockEvent(EventType.STOP, len(self.blocks) - 1, block)]
