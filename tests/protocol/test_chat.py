"""/v1/chat/completions in `protocol`: request decoding, the shared conversation,
and the response/stream encoder, checked against the OpenAI SDK's own types."""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from pydantic import TypeAdapter

from protocol.chat_request import TOP_LEVEL_KEYS, decode_chat_request, decode_chat_request_bytes
from protocol.chat_response import ChatStream, build_completion, chat_logprob
from protocol.checks import decode_json
from protocol.conversation import (
    ChatMessage,
    FunctionTool,
    ToolCall,
    ToolChoice,
    to_template_messages,
    to_template_tools,
)
from protocol.deltas import (
    Failure,
    Finish,
    ReasoningDelta,
    TextDelta,
    ToolCallArguments,
    ToolCallEnd,
    ToolCallStart,
)
from protocol.errors import Refusal
from protocol.events import LOGPROB_FLOOR, TokenLogprob
from protocol.sampling import SamplingFields
from protocol.stream import StreamStateError
from tests import fuzz
from tests.protocol.chat_turns import TEXT_TURN, TOOL_TURN, USAGE

COMPLETION = TypeAdapter(ChatCompletion)
CHUNK = TypeAdapter(ChatCompletionChunk)


def strict_completion(d: dict[str, Any]) -> ChatCompletion:
    json.dumps(d, allow_nan=False)  # JSON-able, no NaN/inf
    return COMPLETION.validate_python(d, strict=True)


def strict_chunk(d: dict[str, Any]) -> ChatCompletionChunk:
    json.dumps(d, allow_nan=False)
    return CHUNK.validate_python(d, strict=True)


# ============================================================================ requests


def good_body() -> dict[str, Any]:
    """A body using every field ignis accepts."""
    return {
        "model": "smollm2",
        "messages": [
            {"role": "system", "content": "Be brief.", "name": "ops"},
            {"role": "developer", "content": [{"type": "text", "text": "Use tools."}]},
            {"role": "user", "content": [{"type": "text", "text": "Weather in "}, {"type": "text", "text": "Paris?"}]},
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "Need the tool.",
                "refusal": None,
                "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
                    {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
            {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "noon"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "18C at noon."}], "annotations": []},
            {"role": "user", "content": "Thanks", "name": "ann"},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "Weather now",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                   "required": ["city"], "additionalProperties": False},
                    "strict": True,
                },
            },
            {"type": "function", "function": {"name": "get_time"}},
        ],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "parallel_tool_calls": False,
        "max_completion_tokens": 128,
        "temperature": 0.7,
        "top_p": 0.9,
        "n": 1,
        "stream": True,
        "stream_options": {"include_usage": True, "include_obfuscation": False},
        "stop": ["\n\n", "END"],
        "seed": 7,
        "presence_penalty": 0.5,
        "frequency_penalty": -0.5,
        "logprobs": True,
        "top_logprobs": 3,
        "response_format": {"type": "text"},
        "reasoning_effort": "low",
        "top_k": 40,
        "min_p": 0.05,
        "repetition_penalty": 1.1,
        "user": "u-1",
        "store": False,
        "metadata": {"k": "v"},
        "service_tier": "auto",
        "prompt_cache_key": "pck",
        "prompt_cache_retention": "in_memory",
        "safety_identifier": "sid",
        "logit_bias": {},
        "modalities": ["text"],
        "verbosity": "low",
        "audio": None,
        "functions": None,
    }


def minimal_body(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}


def test_good_body_decodes_fully():
    req = decode_chat_request(good_body())
    assert req.model == "smollm2"
    assert req.stream and req.include_usage and req.logprobs and req.top_logprobs == 3
    assert req.parallel_tool_calls is False
    assert req.tools == (
        FunctionTool("get_weather", "Weather now", {"type": "object", "properties": {"city": {"type": "string"}},
                                                    "required": ["city"], "additionalProperties": False}, True),
        FunctionTool("get_time"),
    )
    assert req.tool_choice == ToolChoice("required", "get_weather")
    assert req.sampling == SamplingFields(
        temperature=0.7,
        top_p=0.9,
        top_k=40,
        min_p=0.05,
        repetition_penalty=1.1,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        seed=7,
        stop=("\n\n", "END"),
        max_output_tokens=128,
        top_logprobs=3,
        thinking=True,
        thinking_budget=1024,
    )
    assert req.user == "u-1" and req.metadata == {"k": "v"} and req.prompt_cache_key == "pck"
    assert set(good_body()) <= TOP_LEVEL_KEYS


def test_conversation_round_trip():
    req = decode_chat_request(good_body())
    assert req.messages == (
        ChatMessage("system", "Be brief.", name="ops"),
        ChatMessage("developer", "Use tools."),
        ChatMessage("user", "Weather in Paris?"),
        ChatMessage(
            "assistant",
            "",
            reasoning="Need the tool.",
            tool_calls=(
                ToolCall("call_1", "get_weather", '{"city":"Paris"}'),
                ToolCall("call_2", "get_time", "{}"),
            ),
        ),
        ChatMessage("tool", "18C", tool_call_id="call_1", name="get_weather"),
        ChatMessage("tool", "noon", tool_call_id="call_2", name="get_time"),
        ChatMessage("assistant", "18C at noon."),
        ChatMessage("user", "Thanks", name="ann"),
    )
    rendered = to_template_messages(req.messages, arguments_as_object=True)
    assert rendered[3] == {
        "role": "assistant",
        "content": "",
        "reasoning_content": "Need the tool.",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": {}}},
        ],
    }
    assert rendered[4] == {"role": "tool", "content": "18C", "tool_call_id": "call_1", "name": "get_weather"}
    assert to_template_messages(req.messages)[3]["tool_calls"][0]["function"]["arguments"] == '{"city":"Paris"}'
    assert to_template_tools(req.tools)[1] == {
        "type": "function",
        "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
    }


def test_defaults_and_mappings():
    req = decode_chat_request(minimal_body())
    assert req.messages == (ChatMessage("user", "hi"),)
    assert req.sampling == SamplingFields()
    assert req.tools == () and req.tool_choice == ToolChoice("none")
    assert not req.stream and not req.include_usage and not req.logprobs and req.top_logprobs == 0
    tool = {"type": "function", "function": {"name": "f"}}
    assert decode_chat_request(minimal_body(tools=[tool])).tool_choice == ToolChoice("auto")
    assert decode_chat_request(minimal_body(tools=[])).tools == ()
    assert decode_chat_request(minimal_body(max_tokens=9)).sampling.max_output_tokens == 9
    assert decode_chat_request(minimal_body(max_tokens=9, max_completion_tokens=9)).sampling.max_output_tokens == 9
    s = decode_chat_request(minimal_body(reasoning_effort="none")).sampling
    assert (s.thinking, s.thinking_budget) == (False, None)
    s = decode_chat_request(minimal_body(reasoning_effort="high", thinking={"type": "disabled"})).sampling
    assert (s.thinking, s.thinking_budget) == (False, None)  # the explicit knob wins
    s = decode_chat_request(minimal_body(thinking={"type": "enabled", "budget_tokens": 64})).sampling
    assert (s.thinking, s.thinking_budget) == (True, 64)
    assert decode_chat_request(minimal_body(stop="x", top_k=-1)).sampling.stop == ("x",)
    assert decode_chat_request(minimal_body(logprobs=True)).top_logprobs == 0
    # Reasoning under vLLM's newer name; content may be null when there is reasoning.
    req = decode_chat_request(
        {"model": "m", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "reasoning": "r"}]}
    )
    assert req.messages[1] == ChatMessage("assistant", "", reasoning="r")
    # A message-level refusal is what the assistant said.
    req = decode_chat_request(
        {"model": "m", "messages": [{"role": "assistant", "refusal": "No."}, {"role": "user", "content": "ok"}]}
    )
    assert req.messages[0] == ChatMessage("assistant", "No.")
    req = decode_chat_request(
        {"model": "m", "messages": [{"role": "assistant", "content": [{"type": "refusal", "refusal": "No."}]}]}
    )
    assert req.messages[0] == ChatMessage("assistant", "No.")


def test_json_bytes():
    req = decode_chat_request_bytes(json.dumps(minimal_body()).encode())
    assert req.model == "m"
    assert decode_chat_request_bytes("\ufeff" + json.dumps(minimal_body())).model == "m"
    for raw in [b"", b"{", b"\xff\xfe", b"NaN", b'{"model": NaN}', b"[1,]", "{'a': 1}"]:
        with pytest.raises(Refusal) as e:
            decode_chat_request_bytes(raw)
        assert (e.value.code, e.value.param, e.value.status) == ("invalid_json", None, 400)
    for body in [[], "x", 1, None, True]:
        with pytest.raises(Refusal) as e:
            decode_chat_request(body)
        assert e.value.code == "invalid_json"
    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(Refusal) as e:
        decode_json(deep)
    assert e.value.code == "invalid_json"


def _msgs(*extra: dict[str, Any]) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}, *extra]}


_CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
_TOOL = {"type": "function", "function": {"name": "f"}}

# (body, param, code)
BAD_BODIES: list[tuple[dict[str, Any], str | None, str]] = [
    ({"messages": [{"role": "user", "content": "x"}]}, "model", "missing_required_parameter"),
    ({"model": None, "messages": [{"role": "user", "content": "x"}]}, "model", "missing_required_parameter"),
    ({"model": "m"}, "messages", "missing_required_parameter"),
    ({"model": "", "messages": [{"role": "user", "content": "x"}]}, "model", "empty_string"),
    ({"model": 3, "messages": [{"role": "user", "content": "x"}]}, "model", "invalid_type"),
    ({"model": "m", "messages": []}, "messages", "empty_array"),
    ({"model": "m", "messages": {}}, "messages", "invalid_type"),
    (minimal_body(foo=1), "foo", "unknown_parameter"),
    ({"model": "m", "messages": ["hi"]}, "messages[0]", "invalid_type"),
    ({"model": "m", "messages": [{"content": "x"}]}, "messages[0].role", "missing_required_parameter"),
    ({"model": "m", "messages": [{"role": "bot", "content": "x"}]}, "messages[0].role", "invalid_value"),
    ({"model": "m", "messages": [{"role": "function", "name": "f", "content": "x"}]}, "messages[0].role", "unsupported_value"),
    ({"model": "m", "messages": [{"role": "user"}]}, "messages[0].content", "missing_required_parameter"),
    ({"model": "m", "messages": [{"role": "system", "content": None}]}, "messages[0].content", "missing_required_parameter"),
    ({"model": "m", "messages": [{"role": "user", "content": 5}]}, "messages[0].content", "invalid_type"),
    ({"model": "m", "messages": [{"role": "user", "content": []}]}, "messages[0].content", "empty_array"),
    ({"model": "m", "messages": [{"role": "user", "content": "x", "foo": 1}]}, "messages[0].foo", "unknown_parameter"),
    ({"model": "m", "messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "messages[0].tool_calls", "unknown_parameter"),
    ({"model": "m", "messages": [{"role": "user", "content": "x", "name": 1}]}, "messages[0].name", "invalid_type"),
    (
        _msgs({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "u"}}]}),
        "messages[1].content[1].type",
        "unsupported_value",
    ),
    (_msgs({"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}), "messages[1].content[0].type", "unsupported_value"),
    (_msgs({"role": "user", "content": [{"type": "file", "file": {}}]}), "messages[1].content[0].type", "unsupported_value"),
    (_msgs({"role": "user", "content": [{"type": "video"}]}), "messages[1].content[0].type", "invalid_value"),
    (_msgs({"role": "user", "content": [{"type": "refusal", "refusal": "x"}]}), "messages[1].content[0].type", "invalid_value"),
    (_msgs({"role": "user", "content": [{"text": "a"}]}), "messages[1].content[0].type", "missing_required_parameter"),
    (_msgs({"role": "user", "content": [{"type": "text"}]}), "messages[1].content[0].text", "missing_required_parameter"),
    (_msgs({"role": "user", "content": [{"type": "text", "text": 1}]}), "messages[1].content[0].text", "invalid_type"),
    (
        _msgs({"role": "user", "content": [{"type": "text", "text": "a", "cache_control": {}}]}),
        "messages[1].content[0].cache_control",
        "unknown_parameter",
    ),
    (_msgs({"role": "user", "content": ["a"]}), "messages[1].content[0]", "invalid_type"),
    (_msgs({"role": "assistant"}), "messages[1].content", "missing_required_parameter"),
    (_msgs({"role": "assistant", "content": None, "tool_calls": []}), "messages[1].content", "missing_required_parameter"),
    (_msgs({"role": "assistant", "content": "x", "tool_calls": {}}), "messages[1].tool_calls", "invalid_type"),
    (_msgs({"role": "assistant", "tool_calls": [{**_CALL, "type": "custom"}]}), "messages[1].tool_calls[0].type", "unsupported_value"),
    (_msgs({"role": "assistant", "tool_calls": [{**_CALL, "type": "x"}]}), "messages[1].tool_calls[0].type", "invalid_value"),
    (
        _msgs({"role": "assistant", "tool_calls": [{k: v for k, v in _CALL.items() if k != "type"}]}),
        "messages[1].tool_calls[0].type",
        "missing_required_parameter",
    ),
    (_msgs({"role": "assistant", "tool_calls": [{**_CALL, "id": None}]}), "messages[1].tool_calls[0].id", "missing_required_parameter"),
    (
        _msgs({"role": "assistant", "tool_calls": [{**_CALL, "function": {"name": "f"}}]}),
        "messages[1].tool_calls[0].function.arguments",
        "missing_required_parameter",
    ),
    (
        _msgs({"role": "assistant", "tool_calls": [{**_CALL, "function": {"name": "f", "arguments": {}}}]}),
        "messages[1].tool_calls[0].function.arguments",
        "invalid_type",
    ),
    (
        _msgs({"role": "assistant", "tool_calls": [{**_CALL, "function": {"name": "", "arguments": "{}"}}]}),
        "messages[1].tool_calls[0].function.name",
        "empty_string",
    ),
    (
        _msgs({"role": "assistant", "tool_calls": [_CALL, _CALL]}),
        "messages[1].tool_calls[1].id",
        "invalid_value",
    ),
    (_msgs({"role": "assistant", "content": "x", "audio": {"id": "a"}}), "messages[1].audio", "unsupported_value"),
    (_msgs({"role": "assistant", "content": "x", "function_call": {"name": "f", "arguments": ""}}), "messages[1].function_call", "unsupported_value"),
    (_msgs({"role": "assistant", "content": "x", "reasoning_content": 1}), "messages[1].reasoning_content", "invalid_type"),
    (_msgs({"role": "tool", "tool_call_id": "c1", "content": "x"}), "messages[1].role", "invalid_value"),
    (_msgs({"role": "assistant", "tool_calls": [_CALL]}, {"role": "tool", "content": "x"}), "messages[2].tool_call_id", "missing_required_parameter"),
    (_msgs({"role": "assistant", "tool_calls": [_CALL]}, {"role": "tool", "tool_call_id": "c1"}), "messages[2].content", "missing_required_parameter"),
    (
        _msgs({"role": "assistant", "tool_calls": [_CALL]}, {"role": "tool", "tool_call_id": "c9", "content": "x"}),
        "messages[2].tool_call_id",
        "invalid_value",
    ),
    (
        _msgs(
            {"role": "assistant", "tool_calls": [_CALL]},
            {"role": "tool", "tool_call_id": "c1", "content": "x"},
            {"role": "tool", "tool_call_id": "c1", "content": "x"},
        ),
        "messages[3].tool_call_id",
        "invalid_value",
    ),
    (_msgs({"role": "assistant", "tool_calls": [_CALL]}, {"role": "user", "content": "x"}), "messages[1].role", "invalid_value"),
    (_msgs({"role": "assistant", "tool_calls": [_CALL]}), "messages[1].role", "invalid_value"),
    (
        _msgs({"role": "assistant", "tool_calls": [_CALL]}, {"role": "tool", "tool_call_id": "c1", "content": "x", "foo": 1}),
        "messages[2].foo",
        "unknown_parameter",
    ),
    # tools
    (minimal_body(tools={}), "tools", "invalid_type"),
    (minimal_body(tools=[{"type": "custom", "custom": {"name": "x"}}]), "tools[0].type", "unsupported_value"),
    (minimal_body(tools=[{"type": "web_search"}]), "tools[0].type", "invalid_value"),
    (minimal_body(tools=[{"function": {"name": "f"}}]), "tools[0].type", "missing_required_parameter"),
    (minimal_body(tools=[{"type": "function"}]), "tools[0].function", "missing_required_parameter"),
    (minimal_body(tools=[{"type": "function", "function": {}}]), "tools[0].function.name", "missing_required_parameter"),
    (minimal_body(tools=[{"type": "function", "function": {"name": "a b"}}]), "tools[0].function.name", "invalid_value"),
    (minimal_body(tools=[{"type": "function", "function": {"name": "a" * 65}}]), "tools[0].function.name", "string_above_max_length"),
    (minimal_body(tools=[_TOOL, _TOOL]), "tools[1].function.name", "invalid_value"),
    (minimal_body(tools=[{"type": "function", "function": {"name": "f", "parameters": []}}]), "tools[0].function.parameters", "invalid_type"),
    (minimal_body(tools=[{"type": "function", "function": {"name": "f", "strict": "yes"}}]), "tools[0].function.strict", "invalid_type"),
    (minimal_body(tools=[{"type": "function", "function": {"name": "f", "x": 1}}]), "tools[0].function.x", "unknown_parameter"),
    (minimal_body(tools=[{**_TOOL, "name": "f"}]), "tools[0].name", "unknown_parameter"),
    # tool_choice
    (minimal_body(tool_choice="any"), "tool_choice", "invalid_value"),
    (minimal_body(tool_choice="required"), "tool_choice", "invalid_value"),
    (minimal_body(tool_choice=1), "tool_choice", "invalid_type"),
    (minimal_body(tools=[_TOOL], tool_choice={"type": "function", "function": {"name": "g"}}), "tool_choice.function.name", "invalid_value"),
    (minimal_body(tools=[_TOOL], tool_choice={"type": "function"}), "tool_choice.function", "missing_required_parameter"),
    (minimal_body(tools=[_TOOL], tool_choice={"type": "allowed_tools", "allowed_tools": {}}), "tool_choice.type", "unsupported_value"),
    (minimal_body(tools=[_TOOL], tool_choice={"type": "custom", "custom": {"name": "f"}}), "tool_choice.type", "unsupported_value"),
    (minimal_body(tools=[_TOOL], tool_choice={"type": "x"}), "tool_choice.type", "invalid_value"),
    (minimal_body(tools=[_TOOL], tool_choice={"function": {"name": "f"}}), "tool_choice.type", "missing_required_parameter"),
    (minimal_body(tool_choice={"type": "function", "function": {"name": "f"}}), "tool_choice", "invalid_value"),
    (minimal_body(parallel_tool_calls="yes"), "parallel_tool_calls", "invalid_type"),
    # n, stream, logprobs
    (minimal_body(n=2), "n", "unsupported_value"),
    (minimal_body(n=0), "n", "integer_below_min_value"),
    (minimal_body(n=1.5), "n", "invalid_type"),
    (minimal_body(stream="true"), "stream", "invalid_type"),
    (minimal_body(stream_options={"include_usage": True}), "stream_options", "invalid_value"),
    (minimal_body(stream=True, stream_options={"include_usage": 1}), "stream_options.include_usage", "invalid_type"),
    (minimal_body(stream=True, stream_options={"x": 1}), "stream_options.x", "unknown_parameter"),
    (minimal_body(stream=True, stream_options=[]), "stream_options", "invalid_type"),
    (minimal_body(logprobs="yes"), "logprobs", "invalid_type"),
    (minimal_body(top_logprobs=2), "top_logprobs", "invalid_value"),
    (minimal_body(logprobs=True, top_logprobs=21), "top_logprobs", "integer_above_max_value"),
    (minimal_body(logprobs=True, top_logprobs=-1), "top_logprobs", "integer_below_min_value"),
    # sampling (shared contract with the Responses side)
    (minimal_body(temperature=3), "temperature", "decimal_above_max_value"),
    (minimal_body(temperature="hot"), "temperature", "invalid_type"),
    (minimal_body(top_p=-0.1), "top_p", "decimal_below_min_value"),
    (minimal_body(presence_penalty=2.5), "presence_penalty", "decimal_above_max_value"),
    (minimal_body(frequency_penalty=-3), "frequency_penalty", "decimal_below_min_value"),
    (minimal_body(max_tokens=0), "max_tokens", "integer_below_min_value"),
    (minimal_body(max_completion_tokens="9"), "max_completion_tokens", "invalid_type"),
    (minimal_body(max_tokens=5, max_completion_tokens=6), "max_completion_tokens", "invalid_value"),
    (minimal_body(stop=["a", "b", "c", "d", "e"]), "stop", "array_above_max_length"),
    (minimal_body(stop=["a", 1]), "stop[1]", "invalid_type"),
    (minimal_body(seed=1.5), "seed", "invalid_type"),
    (minimal_body(top_k=-2), "top_k", "integer_below_min_value"),
    (minimal_body(min_p=2), "min_p", "decimal_above_max_value"),
    (minimal_body(repetition_penalty=0), "repetition_penalty", "decimal_below_min_value"),
    (minimal_body(thinking={"type": "maybe"}), "thinking.type", "invalid_value"),
    (minimal_body(reasoning_effort="extreme"), "reasoning_effort", "invalid_value"),
    (minimal_body(reasoning_effort="extreme", thinking=True), "reasoning_effort", "invalid_value"),
    # formats and the rest
    (minimal_body(response_format={"type": "json_schema"}), "response_format.json_schema", "missing_required_parameter"),
    (minimal_body(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": True}}),
     "response_format.json_schema.schema", "invalid_json_schema"),
    (minimal_body(response_format={"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}),
     "response_format.json_schema.name", "invalid_value"),
    (minimal_body(response_format={"type": "xml"}), "response_format.type", "invalid_value"),
    (minimal_body(tools=[{"type": "function", "function": {"name": "f", "strict": True, "parameters": {
        "type": "object", "properties": {"s": {"type": "string", "uniqueItems": True}}, "required": ["s"],
        "additionalProperties": False}}}]), "tools[0].function.parameters", "invalid_function_parameters"),
    (minimal_body(response_format={"type": "yaml"}), "response_format.type", "invalid_value"),
    (minimal_body(response_format={}), "response_format.type", "missing_required_parameter"),
    (minimal_body(response_format="text"), "response_format", "invalid_type"),
    (minimal_body(logit_bias={"50256": -100}), "logit_bias", "unsupported_value"),
    (minimal_body(logit_bias=[]), "logit_bias", "invalid_type"),
    (minimal_body(modalities=["text", "audio"]), "modalities[1]", "unsupported_value"),
    (minimal_body(modalities=["smell"]), "modalities[0]", "invalid_value"),
    (minimal_body(audio={"voice": "alloy", "format": "wav"}), "audio", "unsupported_parameter"),
    (minimal_body(prediction={"type": "content", "content": "x"}), "prediction", "unsupported_parameter"),
    (minimal_body(web_search_options={}), "web_search_options", "unsupported_parameter"),
    (minimal_body(functions=[{"name": "f"}]), "functions", "unsupported_parameter"),
    (minimal_body(function_call="auto"), "function_call", "unsupported_parameter"),
    (minimal_body(user=1), "user", "invalid_type"),
    (minimal_body(store="no"), "store", "invalid_type"),
    (minimal_body(metadata={"k": 1}), "metadata.k", "invalid_type"),
    (minimal_body(service_tier="gold"), "service_tier", "invalid_value"),
    (minimal_body(verbosity="loud"), "verbosity", "invalid_value"),
]


@pytest.mark.parametrize("body,param,code", BAD_BODIES, ids=[f"{p}:{c}" for _, p, c in BAD_BODIES])
def test_bad_bodies(body, param, code):
    with pytest.raises(Refusal) as e:
        decode_chat_request(copy.deepcopy(body))
    r = e.value
    assert (r.param, r.code) == (param, code), r.message
    assert r.status == 400 and r.type == "invalid_request_error"
    assert r.envelope() == {"error": {"message": r.message, "type": r.type, "param": param, "code": code}}
    assert r.message


def test_same_conversation_as_responses():
    """DESIGN: the same turns through /v1/responses and /v1/chat/completions give one
    internal conversation (so one prompt, one set of token ids, shared prefix cache)."""
    from protocol.decode import decode_request
    from protocol.responses_conversation import to_conversation

    params = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
              "additionalProperties": False}
    chat = {
        "model": "smollm2",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "developer", "content": [{"type": "text", "text": "Use tools."}]},
            {"role": "user", "content": [{"type": "text", "text": "Weather in "}, {"type": "text", "text": "Paris?"}]},
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "Need the tool.",
                "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
                    {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
            {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "noon"}]},
            {"role": "assistant", "content": "18C at noon."},
            {"role": "user", "content": "Thanks"},
        ],
        "tools": [
            {"type": "function", "function": {"name": "get_weather", "description": "Weather now", "parameters": params, "strict": True}},
            {"type": "function", "function": {"name": "get_time"}},
        ],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    }
    resp = {
        "model": "smollm2",
        "instructions": "Be brief.",
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Use tools."}]},
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Weather in "}, {"type": "input_text", "text": "Paris?"}],
            },
            {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Need the tool."}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
            {"type": "function_call", "call_id": "call_2", "name": "get_time", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
            {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "noon"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "18C at noon.", "annotations": []}]},
            {"role": "user", "content": "Thanks"},
        ],
        "tools": [
            {"type": "function", "name": "get_weather", "description": "Weather now", "parameters": params, "strict": True},
            {"type": "function", "name": "get_time"},
        ],
        "tool_choice": {"type": "function", "name": "get_weather"},
    }
    chat_req = decode_chat_request(chat)
    conv = to_conversation(decode_request(resp))
    assert chat_req.messages == conv.messages
    assert chat_req.tools == conv.tools
    assert chat_req.tool_choice == conv.tool_choice


# ---------------------------------------------------------------------------- fuzzing

json_values = fuzz.json_values(max_leaves=20, text=8, keys=8, width=4, huge=True)

_FIELD_NAMES = sorted(TOP_LEVEL_KEYS) + [
    "role", "content", "type", "text", "tool_calls", "tool_call_id", "function", "name", "arguments", "id",
    "parameters", "include_usage", "reasoning_content", "budget_tokens",
]  # fmt: skip


def _check_refusal(r: Refusal) -> None:
    fuzz.check_refusal(r, empty_param_ok=True)  # "" only for an unknown key named ""


def _decode_or_refuse(body: Any) -> None:
    try:
        req = decode_chat_request(body)
    except Refusal as r:
        _check_refusal(r)
    else:
        assert req.messages and isinstance(req.model, str)


FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(json_values)
def test_fuzz_any_json_value(value):
    _decode_or_refuse(value)


@FUZZ
@given(st.binary(max_size=64) | st.text(max_size=64).map(str.encode))
def test_fuzz_raw_bytes(raw):
    try:
        decode_chat_request_bytes(raw)
    except Refusal as r:
        _check_refusal(r)


_GOOD_PATHS = fuzz.paths(good_body())
mutated_bodies = fuzz.mutated_bodies(st.builds(good_body), values=json_values,
                                     keys=st.sampled_from(_FIELD_NAMES) | st.text(max_size=6))


@FUZZ
@given(mutated_bodies)
def test_fuzz_mutated_good_bodies(body):
    _decode_or_refuse(body)


@FUZZ
@given(st.lists(st.sampled_from(_GOOD_PATHS[1:]), min_size=1, max_size=2), json_values)
def test_fuzz_mutated_bytes(where, value):
    body = good_body()
    parent: Any = body
    for k in where[0][:-1]:
        parent = parent[k]
    parent[where[0][-1]] = value
    try:
        decode_chat_request_bytes(json.dumps(body))
    except Refusal as r:
        _check_refusal(r)


def test_huge_integer_number():
    with pytest.raises(Refusal) as e:
        decode_chat_request_bytes(b'{"model":"m","messages":[{"role":"user","content":"x"}],"temperature":1' + b"0" * 400 + b"}")
    assert e.value.param == "temperature"


# ============================================================================ responses

SCENARIOS: dict[str, list[Any]] = {
    "text": [TextDelta("Hello"), TextDelta(", world"), Finish("stop", USAGE)],
    "reasoning_then_text": TEXT_TURN,
    "tool_calls": TOOL_TURN,
    "tool_call_only": [ToolCallStart("f", "call_x"), ToolCallArguments("{}"), Finish("stop", USAGE)],
    "length": [TextDelta("trunc"), Finish("length", USAGE)],
    "length_in_reasoning": [ReasoningDelta("hmm"), Finish("length", USAGE)],
    "length_in_tool_call": [ToolCallStart("f", "call_y"), ToolCallArguments('{"a'), Finish("length", USAGE)],
    "empty": [Finish("stop", USAGE)],
    "empty_text": [TextDelta(""), ReasoningDelta(""), Finish("stop", USAGE)],
    "logprobs": [
        TextDelta(
            "Hi",
            (
                TokenLogprob("Hi", -0.25, top_logprobs=(TokenLogprob("Hi", -0.25), TokenLogprob("Hey", -1.5))),
            ),
        ),
        TextDelta(
            " \u00e9",
            (
                TokenLogprob(" \u00e9", -math.inf, top_logprobs=(TokenLogprob(" \u00e9", -math.inf), TokenLogprob("e", math.nan))),
                TokenLogprob("", -0.0),
            ),
        ),
        ToolCallStart("f", "call_z"),
        ToolCallArguments("{}"),
        Finish("stop", USAGE),
    ],
}


def _stream(deltas, *, include_usage=True, logprobs=True):
    enc = ChatStream(model="smollm2", id="chatcmpl-test", created=1_700_000_000, include_usage=include_usage, logprobs=logprobs)
    chunks = enc.feed_all(deltas)
    return enc, chunks


def _accumulate(chunks: list[dict[str, Any]]) -> ChatCompletion:
    state = ChatCompletionStreamState()
    for c in chunks:
        state.handle_chunk(strict_chunk(c))
    # The snapshot, not get_final_completion(): that one raises on finish_reason "length".
    return COMPLETION.validate_python(state.current_completion_snapshot.to_dict(), strict=True)


def _comparable(c: ChatCompletion) -> dict[str, Any]:
    choice = c.choices[0]
    m = choice.message
    return {
        "id": c.id,
        "created": c.created,
        "model": c.model,
        "object": c.object,
        "finish_reason": choice.finish_reason,
        "role": m.role,
        "content": m.content,
        "refusal": m.refusal,
        "reasoning_content": (m.model_extra or {}).get("reasoning_content"),
        "tool_calls": [
            {"id": t.id, "type": t.type, "name": t.function.name, "arguments": t.function.arguments} for t in m.tool_calls or []
        ]
        or None,
        "logprobs": choice.logprobs.model_dump() if choice.logprobs is not None else None,
        "usage": c.usage.model_dump() if c.usage is not None else None,
    }


@pytest.mark.parametrize("name", SCENARIOS)
@pytest.mark.parametrize("include_usage", [True, False])
def test_chunks_and_completion_validate(name, include_usage):
    enc, chunks = _stream(SCENARIOS[name], include_usage=include_usage)
    parsed = [strict_chunk(c) for c in chunks]
    assert {p.id for p in parsed} == {"chatcmpl-test"} and {p.created for p in parsed} == {1_700_000_000}
    assert parsed[0].choices[0].delta.role == "assistant"
    assert all(len(p.choices) == 1 for p in parsed[:-1] if not (include_usage and p is parsed[-1]))
    finishes = [p.choices[0].finish_reason for p in parsed if p.choices]
    assert all(f is None for f in finishes[:-1]) and finishes[-1] is not None
    if include_usage:
        assert parsed[-1].choices == [] and parsed[-1].usage is not None
        assert all(p.usage is None for p in parsed[:-1]) and all("usage" in c for c in chunks)
    else:
        assert all("usage" not in c for c in chunks)
    completion = strict_completion(enc.completion())
    assert completion.usage.model_dump(exclude_none=True) == {
        "prompt_tokens": 12,
        "completion_tokens": 30,
        "total_tokens": 42,
        "prompt_tokens_details": {"cached_tokens": 8},
        "completion_tokens_details": {"reasoning_tokens": 10, "accepted_prediction_tokens": 0,
                                      "rejected_prediction_tokens": 0},
    }
    # the non-streaming path gives the same object
    assert build_completion(SCENARIOS[name], model="smollm2", id="chatcmpl-test", created=1_700_000_000, logprobs=True) == enc.completion()


@pytest.mark.parametrize("name", SCENARIOS)
def test_stream_accumulates_to_completion(name):
    enc, chunks = _stream(SCENARIOS[name])
    assert _comparable(_accumulate(chunks)) == _comparable(strict_completion(enc.completion()))


def test_completion_shapes():
    c = build_completion(SCENARIOS["tool_calls"], model="m", id="chatcmpl-1", created=1)
    choice = c["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["logprobs"] is None
    msg = choice["message"]
    assert msg["content"] == "Checking." and msg["reasoning_content"] == "Two lookups."
    assert [t["function"] for t in msg["tool_calls"]] == [
        {"name": "get_weather", "arguments": '{"city":"Paris"}'},
        {"name": "get_time", "arguments": "{}"},
    ]
    assert [t["id"] for t in msg["tool_calls"]] == ["call_a", "call_b"]
    made = build_completion([ToolCallStart("f"), ToolCallStart("g"), Finish("stop", USAGE)], model="m")
    ids = [t["id"] for t in made["choices"][0]["message"]["tool_calls"]]
    assert all(i.startswith("call_") and len(i) > 20 for i in ids) and ids[0] != ids[1]
    c = build_completion(SCENARIOS["tool_call_only"], model="m")
    assert c["id"].startswith("chatcmpl-") and c["choices"][0]["message"]["content"] is None
    assert "reasoning_content" not in c["choices"][0]["message"]
    for name, reason in [("length", "length"), ("length_in_tool_call", "length"), ("empty", "stop"), ("text", "stop")]:
        c = build_completion(SCENARIOS[name], model="m")
        assert c["choices"][0]["finish_reason"] == reason
    assert build_completion(SCENARIOS["empty"], model="m")["choices"][0]["message"]["content"] == ""
    lp = build_completion(SCENARIOS["logprobs"], model="m", logprobs=True)["choices"][0]["logprobs"]["content"]
    assert [t["logprob"] for t in lp] == [-0.25, -9999.0, 0.0]
    assert [t["logprob"] for t in lp[1]["top_logprobs"]] == [-9999.0, -9999.0]
    assert lp[1]["bytes"] == [32, 0xC3, 0xA9] and lp[0]["bytes"] == [72, 105] and lp[2]["bytes"] == []
    assert lp[0]["top_logprobs"][1] == {"token": "Hey", "logprob": -1.5, "bytes": [72, 101, 121]}


def test_logprobs_not_finite_are_floored_and_capped():
    """NaN / -inf / +inf on the token and on every alternative: valid JSON (the floor
    -9999.0, the cap 0.0), in the chunks and in the completion."""
    bad = TokenLogprob("a", math.nan, (TokenLogprob("a", math.inf), TokenLogprob("b", -math.inf), TokenLogprob("c", math.nan)))
    worse = TokenLogprob("d", math.inf, (TokenLogprob("d", -1e300),))
    deltas = [TextDelta("ad", (bad, worse)), Finish("stop", USAGE)]
    enc, chunks = _stream(deltas)
    for c in chunks:
        strict_chunk(c)  # json.dumps(allow_nan=False) inside
    streamed = [t for c in chunks for t in ((c["choices"] or [{}])[0].get("logprobs") or {}).get("content") or ()]
    content = strict_completion(enc.completion()).choices[0].logprobs.content
    assert [t.model_dump() for t in content] == streamed
    assert [t["logprob"] for t in streamed] == [LOGPROB_FLOOR, 0.0]
    assert [a["logprob"] for a in streamed[0]["top_logprobs"]] == [0.0, LOGPROB_FLOOR, LOGPROB_FLOOR]
    assert [a["logprob"] for a in streamed[1]["top_logprobs"]] == [LOGPROB_FLOOR]
    assert chat_logprob(bad)["logprob"] == -9999.0 == LOGPROB_FLOOR


def test_logprob_bytes_are_the_tokens_own():
    """A token holding part of a UTF-8 character carries its own bytes (its text alone
    reads U+FFFD); without bytes, the text's UTF-8."""
    first = TokenLogprob("\ufffd", -0.5, (TokenLogprob("\ufffd", -0.5, token_bytes=b"\xe2\x98"), TokenLogprob("x", -2.0)),
                         token_bytes=b"\xe2\x98")
    second = TokenLogprob("\ufffd", -0.1, token_bytes=b"\x80")
    enc, chunks = _stream([TextDelta("\u2600", (first, second)), Finish("stop", USAGE)])
    strict_completion(enc.completion())
    content = enc.completion()["choices"][0]["logprobs"]["content"]
    streamed = [t for c in chunks for t in ((c["choices"] or [{}])[0].get("logprobs") or {}).get("content") or ()]
    assert streamed == content
    assert [t["bytes"] for t in content] == [[0xE2, 0x98], [0x80]]
    assert bytes(b for t in content for b in t["bytes"]).decode() == "\u2600"
    assert [a["bytes"] for a in content[0]["top_logprobs"]] == [[0xE2, 0x98], [120]]


FINISH_REASONS = {
    "stop": ("stop", "tool_calls"),
    "tool_calls": ("stop", "tool_calls"),
    "cancelled": ("stop", "tool_calls"),
    "length": ("length", "length"),
    "max_output_tokens": ("length", "length"),
    "content_filter": ("content_filter", "content_filter"),
}


@pytest.mark.parametrize("engine", FINISH_REASONS)
def test_finish_reasons(engine):
    no_call, with_call = FINISH_REASONS[engine]
    c = build_completion([TextDelta("a"), Finish(engine, USAGE)], model="m")
    assert c["choices"][0]["finish_reason"] == no_call
    c = build_completion([ToolCallStart("f", "call_1"), Finish(engine)], model="m")
    assert c["choices"][0]["finish_reason"] == with_call
    strict_completion(c)
    assert c["usage"]["total_tokens"] == 0  # no usage given: zeros


def test_tool_call_chunks():
    _, chunks = _stream(SCENARIOS["tool_calls"], include_usage=False)
    calls = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks if "tool_calls" in c["choices"][0]["delta"]]
    assert calls[0] == {"index": 0, "id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
    assert calls[1] == {"index": 0, "function": {"arguments": '{"city":'}}
    assert calls[3]["index"] == 1 and calls[3]["function"]["name"] == "get_time"
    first = chunks[0]["choices"][0]["delta"]
    assert first == {"role": "assistant", "content": None, "refusal": None}
    _, chunks = _stream(SCENARIOS["text"], include_usage=False)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "", "refusal": None}
    assert [c["choices"][0]["delta"].get("content") for c in chunks[1:]] == ["Hello", ", world", None]


def test_failure():
    enc = ChatStream(model="m")
    out = enc.feed(TextDelta("part"))
    assert len(out) == 2
    (err,) = enc.feed(Failure("engine crashed", code="server_error"))
    assert err == {"error": {"message": "engine crashed", "type": "server_error", "param": None, "code": "server_error"}}
    assert enc.done
    with pytest.raises(Refusal) as e:
        enc.completion()
    assert e.value.status == 500
    assert enc.feed(TextDelta("more")) == [] and enc.feed(Finish("stop", USAGE)) == []  # late: dropped
    enc = ChatStream(model="m", emit=False)
    assert enc.feed(Failure("boom")) == []
    with pytest.raises(Refusal) as e:
        enc.completion()
    assert (e.value.code, e.value.type) == ("server_error", "server_error")


def test_a_failure_of_the_requests_own_grammar_is_a_400():
    """The grammar engine gave up on the request's schema mid-answer (the fuzzer's case: an
    llguidance item limit): the client's to fix, not a 500."""
    for emit in (True, False):
        enc = ChatStream(model="m", emit=emit)
        out = enc.fail("The engine failed this request: the output grammar allows no token here", "invalid_grammar")
        assert out == ([{"error": {"message": "The engine failed this request: the output grammar allows no token here",
                                   "type": "invalid_request_error", "param": None, "code": "invalid_grammar"}}]
                       if emit else [])
        with pytest.raises(Refusal) as e:
            enc.completion()
        assert (e.value.status, e.value.type, e.value.code) == (400, "invalid_request_error", "invalid_grammar")


def test_misuse_is_a_programming_error():
    with pytest.raises(StreamStateError):
        ChatStream(model="m").feed(ToolCallArguments("{}"))
    with pytest.raises(StreamStateError):
        ChatStream(model="m").feed(ToolCallEnd())
    with pytest.raises(StreamStateError):
        ChatStream(model="m").completion()
    with pytest.raises(ValueError):
        ChatStream(model="m").feed(Finish("tired", USAGE))
    with pytest.raises(TypeError):
        ChatStream(model="m").feed("text")
    enc = ChatStream(model="m", emit=False)
    assert enc.feed(TextDelta("x")) == [] and enc.feed(Finish("stop", USAGE)) == []
    assert enc.completion()["choices"][0]["message"]["content"] == "x"


# Random delta sequences: every chunk validates, and the stream accumulates to the completion.
_text = st.text(max_size=6)
_logprob = st.floats(max_value=0.0) | st.just(math.nan) | st.just(-math.inf) | st.just(math.inf)
_delta = st.one_of(
    _text.map(ReasoningDelta),
    st.builds(
        TextDelta,
        _text,
        st.lists(
            st.builds(
                TokenLogprob,
                _text,
                _logprob,
                st.lists(st.builds(TokenLogprob, _text, _logprob), max_size=2).map(tuple),
                st.none() | st.binary(max_size=4),
            ),
            max_size=2,
        ).map(tuple),
    ),
    st.builds(lambda n, a: [ToolCallStart(n), *[ToolCallArguments(x) for x in a], ToolCallEnd()], st.sampled_from(["f", "g_2"]), st.lists(_text, max_size=3)),
)


@FUZZ
@given(
    st.lists(_delta, max_size=8),
    st.sampled_from(list(FINISH_REASONS)),
    st.booleans(),
    st.booleans(),
)
def test_fuzz_stream_equals_completion(parts, reason, include_usage, logprobs):
    deltas: list[Any] = []
    for p in parts:
        deltas.extend(p if isinstance(p, list) else [p])
    deltas.append(Finish(reason, USAGE))
    enc, chunks = _stream(deltas, include_usage=include_usage, logprobs=logprobs)
    completion = strict_completion(enc.completion())
    got = _comparable(_accumulate(chunks))
    want = _comparable(completion)
    if not include_usage:
        want["usage"] = None
    assert got == want

