"""Tool calls in model text, one module per format family (pure text: no model, no server)."""
from radixlm.runtime.parsers.tool_calls.core import Call, Segment, ToolCallFormat, ToolSet, ToolSpec
from radixlm.runtime.parsers.tool_calls.registry import (
    JSON_ARRAY_FORMAT, TOOL_CALL_FORMATS, TOOL_CALL_PARSERS, get_format, resolve_parser,
)
from radixlm.runtime.parsers.tool_calls.stream import (
    Parsed, ParsedCall, StreamDelta, ToolCallStreamer, content_of, frame, parse,
)

__all__ = ["Call", "JSON_ARRAY_FORMAT", "Parsed", "ParsedCall", "Segment", "StreamDelta", "TOOL_CALL_FORMATS",
           "TOOL_CALL_PARSERS", "ToolCallFormat", "ToolCallStreamer", "ToolSet", "ToolSpec", "content_of", "frame",
           "get_format", "parse", "resolve_parser"]
