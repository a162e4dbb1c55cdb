"""The text a request is routed on. Whatever the API, a request that extends an earlier one (one more chat
turn, a longer prompt) must map to a string that extends the earlier string, so prefix affinity carries over."""
from __future__ import annotations

from typing import Any


def _ids_text(ids: list) -> str:
    # One character per token id: a prefix of ids is a prefix of the string. Invalid ids fall back to repr.
    try:
        return "".join(chr(int(i)) for i in ids)
    except (TypeError, ValueError, OverflowError):
        return repr(ids)


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts / Anthropic content blocks
        parts = []
        for p in content:
            if isinstance(p, dict):
                parts.append(str(p.get("text", p.get("content", "")) or ""))
            elif isinstance(p, str):
                parts.append(p)
        return "".join(parts)
    return "" if content is None else str(content)


def _messages_text(messages: Any) -> str:
    if not isinstance(messages, list):
        return ""
    out = []
    for m in messages:
        if isinstance(m, dict):
            out.append(f"<{m.get('role', '')}>{_content_text(m.get('content'))}\n")
    return "".join(out)


def _first(x: Any) -> Any:
    """A batch goes to one worker; its first member decides where."""
    return x[0] if isinstance(x, list) and x else x


def _adapter(path: str, body: dict[str, Any]) -> str | None:
    """The LoRA adapter a request names (workers keep each adapter's KV apart): lora_path on every API, else the
    OpenAI and Anthropic `model` (an adapter's name, base:adapter, or the base model's: one namespace per name)."""
    adapter = _first(body.get("lora_path"))
    if adapter is None and path.startswith("/v1/"):
        adapter = body.get("model")
    return adapter if isinstance(adapter, str) and adapter else None


def routing_text(path: str, body: dict[str, Any]) -> str:
    """Text for routing a request to `path` with JSON `body`; "" when the body carries none. Requests of another
    extra_key or LoRA adapter share no KV on a worker: their text starts with a namespace of its own."""
    namespace = body.get("extra_key")
    prefix = f"\x00{namespace}\x00" if isinstance(namespace, str) and namespace else ""
    adapter = _adapter(path, body)
    if adapter is not None:
        prefix = f"\x01{adapter}\x01" + prefix
    if path == "/generate":
        text = body.get("text")
        if text is not None:
            text = _first(text)
            return prefix + (text if isinstance(text, str) else "")
        ids = body.get("input_ids")
        if isinstance(ids, list) and ids and isinstance(ids[0], list):
            ids = ids[0]
        return prefix + (_ids_text(ids) if isinstance(ids, list) else "")
    if path == "/v1/completions":
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            prompt = prompt[0]
        if isinstance(prompt, str):
            return prefix + prompt
        return prefix + (_ids_text(prompt) if isinstance(prompt, list) else "")
    if path == "/v1/chat/completions":
        return prefix + _messages_text(body.get("messages"))
    if path == "/v1/responses":
        instructions, given = body.get("instructions"), body.get("input")
        head = f"<system>{instructions}\n" if isinstance(instructions, str) and instructions else ""
        return prefix + head + (given if isinstance(given, str) else _messages_text(given))
    if path == "/v1/messages":
        system = body.get("system")
        head = f"<system>{_content_text(system)}\n" if system else ""
        return prefix + head + _messages_text(body.get("messages"))
    return prefix
