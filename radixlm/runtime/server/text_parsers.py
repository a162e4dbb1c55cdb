"""POST /separate_reasoning and /parse_function_call: SGLang's routes that run the server's reasoning and tool-call
parsers over a text a client already has (no model involved)."""
from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, StrictBool, StrictStr

from radixlm.runtime.parsers.reasoning import REASONING_PARSERS, ReasoningParser
from radixlm.runtime.parsers.tool_calls import TOOL_CALL_PARSERS, parse, resolve_parser
from radixlm.runtime.server.errors import BadRequest, parse as parse_body
from radixlm.runtime.server.native import json_response, read_json_object
from radixlm.runtime.server.openai.protocol import Tool
from radixlm.runtime.server.openapi import request_body

router = APIRouter()


class SeparateReasoningReqInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: StrictStr
    reasoning_parser: StrictStr
    return_blocks: StrictBool = False


class ParseFunctionCallReq(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: StrictStr
    tool_call_parser: StrictStr
    tools: list[Tool]


@router.post("/separate_reasoning", openapi_extra=request_body(SeparateReasoningReqInput))
async def separate_reasoning(request: Request) -> Response:
    """{"text": the content, "reasoning_text": the reasoning} of a whole output."""
    req: SeparateReasoningReqInput = parse_body(SeparateReasoningReqInput, await read_json_object(request))
    if req.return_blocks:
        raise BadRequest("return_blocks: only false (one reasoning and one content text) is supported")
    if req.reasoning_parser not in REASONING_PARSERS:
        raise BadRequest(f"reasoning_parser {req.reasoning_parser!r}: choose from {', '.join(REASONING_PARSERS)}")
    split = ReasoningParser(req.reasoning_parser).split(req.text)
    return json_response({"text": split.content, "reasoning_text": split.reasoning})


@router.post("/parse_function_call", openapi_extra=request_body(ParseFunctionCallReq))
async def parse_function_call(request: Request) -> Response:
    """{"normal_text": the text outside the calls, "calls": [{"tool_index", "name", "parameters"}]}: calls in the
    text's order (tool_index), of the given tools only, parameters as JSON text."""
    req: ParseFunctionCallReq = parse_body(ParseFunctionCallReq, await read_json_object(request))
    if req.tool_call_parser not in TOOL_CALL_PARSERS:
        raise BadRequest(f"tool_call_parser {req.tool_call_parser!r}: choose from {', '.join(TOOL_CALL_PARSERS)}")
    template = getattr(request.app.state.tokenizer_manager.tokenizer, "chat_template", None)
    fmt = resolve_parser(req.tool_call_parser, str(template or ""))
    tools = {t.function.name: t.function.parameters for t in req.tools}
    parsed = parse(fmt, req.text, tools)
    calls = [{"tool_index": i, "name": c.name, "parameters": c.arguments} for i, c in enumerate(parsed.calls)]
    return json_response({"normal_text": parsed.content or "", "calls": calls})
