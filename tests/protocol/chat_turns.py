"""Chat turns as the engine's deltas, shared by test_chat.py and test_chat_clients.py."""

from __future__ import annotations

from protocol.deltas import Finish, ReasoningDelta, TextDelta, ToolCallArguments, ToolCallEnd, ToolCallStart
from protocol.response import Usage

USAGE = Usage(input_tokens=12, output_tokens=30, cached_tokens=8, reasoning_tokens=10)
# Reasoning, text, then two function calls.
TOOL_TURN = [
    ReasoningDelta("Two lookups."),
    TextDelta("Checking."),
    ToolCallStart("get_weather", "call_a"),
    ToolCallArguments('{"city":'),
    ToolCallArguments('"Paris"}'),
    ToolCallEnd(),
    ToolCallStart("get_time", "call_b"),
    ToolCallArguments("{}"),
    ToolCallEnd(),
    Finish("stop", USAGE),
]
# Reasoning, then the answer.
TEXT_TURN = [ReasoningDelta("Let me "), ReasoningDelta("think."), TextDelta("42"), Finish("stop", USAGE)]
