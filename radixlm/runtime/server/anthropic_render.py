"""Anthropic Messages API: response shapes (content blocks, their stream deltas, stop reasons, usage)."""
from __future__ import annotations

import json
import uuid
from typing import Any

from radixlm.runtime.server.output_blocks import Block, BlockKind


def new_message_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


def tool_use_id(call_id: str) -> str:
    return "toolu_" + call_id.removeprefix("call_")


def _input(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


# Anthropic signs its thinking so that it can check the blocks sent back; they are not read here, so nothing is signed.
SIGNATURE = ""


def content_block(block: Block, streaming: bool = False, omit_thinking: bool = False) -> dict[str, Any]:
    """A block as Anthropic's content block (streaming: as content_block_start opens it, empty)."""
    if block.kind is BlockKind.REASONING:
        return {"type": "thinking", "thinking": "" if streaming or omit_thinking else block.text,
                "signature": SIGNATURE}
    if block.kind is BlockKind.TOOL_CALL:
        return {"type": "tool_use", "id": tool_use_id(block.call_id), "name": block.name,
                "input": {} if streaming else _input(block.text)}
    return {"type": "text", "text": "" if streaming else block.text}


def block_delta(block: Block) -> dict[str, str]:
    if block.kind is BlockKind.REASONING:
        return {"type": "thinking_delta", "thinking": block.text}
    if block.kind is BlockKind.TOOL_CALL:
        return {"type": "input_json_delta", "partial_json": block.text}
    return {"type": "text_delta", "text": block.text}


def stop_info(finish_reason: dict, stop_sequences: list[str] | None, called: bool = False) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) for a finished request's finish_reason (called: the output has tool_use blocks)."""
    if finish_reason["type"] == "length":
        return "max_tokens", None
    if finish_reason["type"] == "abort":
        return "abort", None
    if called:
        return "tool_use", None
    matched = finish_reason.get("matched")
    if isinstance(matched, str) and matched in (stop_sequences or []):
        return "stop_sequence", matched
    return "end_turn", None


def usage(meta: dict) -> dict[str, int]:
    # As Anthropic counts: input_tokens excludes the prompt tokens read from the (radix) cache.
    cached = meta.get("cached_tokens", 0) or 0
    return {"input_tokens": meta["prompt_tokens"] - cached, "output_tokens": meta["completion_tokens"],
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}


def message_body(msg_id: str, model: str, content: list[dict], stop_reason: str | None, stop_sequence: str | None,
                 usage_: dict[str, int]) -> dict[str, Any]:
    return {"id": msg_id, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": stop_reason, "stop_sequence": stop_sequence, "usage": usage_}
