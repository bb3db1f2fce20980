"""/v1/chat/completions against the real clients: the OpenAI SDK (requests it builds,
its chunk parser and stream accumulator, the assistant message it re-sends) and the
Agents SDK's chat-completions model, over an in-process mock transport."""

from __future__ import annotations

import json
from typing import Any

import pytest

from protocol.chat_request import decode_chat_request, decode_chat_request_bytes
from protocol.chat_response import ChatStream
from protocol.conversation import ChatMessage, ToolCall
from protocol.deltas import Finish, ReasoningDelta, TextDelta, ToolCallArguments, ToolCallEnd, ToolCallStart
from protocol.errors import Refusal
from tests.protocol.chat_turns import TEXT_TURN, TOOL_TURN, USAGE


def _client(handler):
    import httpx2 as httpx
    from openai import OpenAI

    return OpenAI(api_key="sk-test", base_url="http://ignis.test/v1", http_client=httpx.Client(transport=httpx.MockTransport(handler)), max_retries=0)


def _serve(request) -> Any:
    """A stand-in server: decode the body as ignis would, answer with the encoder."""
    import httpx2 as httpx

    try:
        req = decode_chat_request_bytes(request.content)
    except Refusal as r:
        return httpx.Response(r.status, json=r.envelope())
    deltas = TOOL_TURN if req.tools else TEXT_TURN
    enc = ChatStream(model=req.model, include_usage=req.include_usage, logprobs=req.logprobs, emit=req.stream)
    chunks = enc.feed_all(deltas)
    if not req.stream:
        return httpx.Response(200, json=enc.completion())
    sse = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    return httpx.Response(200, text=sse, headers={"content-type": "text/event-stream"})


def test_openai_sdk_round_trip():
    """The OpenAI SDK's own request bodies decode, its parsers read our answers, and the
    assistant message it hands back goes into the next request unchanged."""
    import openai

    seen: list[dict[str, Any]] = []

    def handler(request):
        seen.append(json.loads(request.content))
        return _serve(request)

    client = _client(handler)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
             {"type": "function", "function": {"name": "get_time"}}]  # fmt: skip
    history: list[Any] = [{"role": "user", "content": "Weather?"}]
    first = client.chat.completions.create(model="smollm2", messages=history, tools=tools, max_completion_tokens=64)
    assert first.choices[0].finish_reason == "tool_calls"
    msg = first.choices[0].message
    assert [t.function.name for t in msg.tool_calls] == ["get_weather", "get_time"]
    assert msg.model_extra["reasoning_content"] == "Two lookups."
    history.append(msg)  # the pydantic object itself, as SDK users do
    history += [{"role": "tool", "tool_call_id": t.id, "content": "ok"} for t in msg.tool_calls]

    stream = client.chat.completions.create(
        model="smollm2", messages=history, stream=True, stream_options={"include_usage": True}, logprobs=True, top_logprobs=2
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "42"
    assert chunks[-1].usage.total_tokens == 42

    with client.chat.completions.stream(model="smollm2", messages=history) as s:
        final = s.get_final_completion()
    assert final.choices[0].message.content == "42"

    req = decode_chat_request(seen[1])
    assert req.messages[1] == ChatMessage(
        "assistant",
        "Checking.",
        reasoning="Two lookups.",
        tool_calls=(ToolCall("call_a", "get_weather", '{"city":"Paris"}'), ToolCall("call_b", "get_time", "{}")),
    )
    assert req.messages[2].name == "get_weather" and req.logprobs and req.top_logprobs == 2

    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smollm2", messages=history, n=3)
    assert e.value.param == "n" and e.value.code == "unsupported_value"


def test_agents_sdk_chat_model_tool_loop():
    """The Agents SDK's chat-completions model runs a tool loop against the encoder, both
    non-streaming and streaming, and every body it sends decodes."""
    agents = pytest.importorskip("agents")
    import asyncio

    import httpx2
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)
    seen: list[Any] = []

    def handler(request):
        req = decode_chat_request_bytes(request.content)
        seen.append(req)
        if req.messages[-1].role == "tool":
            deltas = [ReasoningDelta("done"), TextDelta("It is 18C."), Finish("stop", USAGE)]
        else:
            deltas = [ToolCallStart("get_weather", "call_w"), ToolCallArguments('{"city": "Paris"}'), ToolCallEnd(), Finish("stop", USAGE)]
        enc = ChatStream(model=req.model, include_usage=req.include_usage, logprobs=req.logprobs, emit=req.stream)
        chunks = enc.feed_all(deltas)
        if not req.stream:
            return httpx2.Response(200, json=enc.completion())
        sse = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return httpx2.Response(200, text=sse, headers={"content-type": "text/event-stream"})

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Weather now."""
        return f"18C in {city}"

    async def run(stream: bool) -> str:
        client = AsyncOpenAI(
            api_key="sk-test",
            base_url="http://ignis.test/v1",
            http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(handler)),
            max_retries=0,
        )
        model = agents.OpenAIChatCompletionsModel(model="smollm2", openai_client=client)
        agent = agents.Agent(name="a", instructions="Be brief.", tools=[get_weather], model=model)
        if stream:
            result = agents.Runner.run_streamed(agent, "Weather in Paris?")
            async for _ in result.stream_events():
                pass
        else:
            result = await agents.Runner.run(agent, "Weather in Paris?")
        return result.final_output

    assert asyncio.run(run(False)) == "It is 18C."
    assert asyncio.run(run(True)) == "It is 18C."
    assert len(seen) == 4 and [r.stream for r in seen] == [False, False, True, True]
    assert seen[1].messages[-2:] == (
        ChatMessage("assistant", "", tool_calls=(ToolCall("call_w", "get_weather", '{"city": "Paris"}'),)),
        ChatMessage("tool", "18C in Paris", tool_call_id="call_w", name="get_weather"),
    )
    assert seen[0].tools[0].name == "get_weather" and seen[0].messages[0] == ChatMessage("system", "Be brief.")
