"""langchain-openai's ChatOpenAI with bind_tools against the shared server (SmolLM2): a forced tool choice comes back
as a parsed tool call (streamed calls are the openai SDK's tests; langchain only reads them)."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    return "rain"


def test_bind_tools_with_a_forced_choice(server):
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model="default", base_url=f"{server.base_url}/v1", api_key="x", temperature=0, max_tokens=64,
                     max_retries=0, timeout=60)
    bound = llm.bind_tools([get_weather], tool_choice="get_weather")
    msg = bound.invoke("What is the weather in Paris?")
    [call] = msg.tool_calls
    assert call["name"] == "get_weather" and call["id"].startswith("call_") and "paris" in call["args"]["city"].lower()
    assert not msg.invalid_tool_calls and msg.response_metadata["finish_reason"] == "tool_calls"
