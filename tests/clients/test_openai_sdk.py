"""The OpenAI Python SDK, unmodified, through a tool loop against the scripted model:
`responses.create` (JSON and stream), the `responses.stream()` helper,
`responses.connect()` (prewarm, continuation with only new items, stream_id lanes,
cancel) and chat completions (JSON and stream). Each answer is the SDK's own parsed
object; the script (script.yaml) fixes what the model says."""

from __future__ import annotations

import json

from tests.server.server_harness import Frames, client

EXEC = {
    "type": "function", "name": "exec_command", "description": "Run a shell command.",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
}
ASK = "Please run echo hello"
ANSWER = "The command printed hello."


def _check_call(call) -> None:
    assert call.type == "function_call" and call.name == "exec_command"
    assert json.loads(call.arguments) == {"cmd": "echo hello"}
    assert call.call_id


def _result(call, output: str = "hello\n") -> dict:
    return {"type": "function_call_output", "call_id": call.call_id, "output": output}


def test_create_json_then_tool_result(scripted_server):
    c = client(scripted_server)
    first = c.responses.create(model="scripted", input=ASK, tools=[EXEC], include=["reasoning.encrypted_content"])
    assert first.status == "completed"
    reasoning, call = first.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text == "The user wants me to run a shell command."
    assert reasoning.encrypted_content
    _check_call(call)
    assert first.usage.output_tokens_details.reasoning_tokens > 0
    # Stateless (store is not kept): send the whole conversation back with the result.
    second = c.responses.create(model="scripted", tools=[EXEC],
                                input=[{"role": "user", "content": ASK}, *[o.to_dict() for o in first.output],
                                       _result(call)])
    assert second.output_text == ANSWER
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 16


def test_create_stream_and_the_stream_helper(scripted_server):
    c = client(scripted_server)
    events = list(c.responses.create(model="scripted", input=ASK, tools=[EXEC], stream=True))
    types = [e.type for e in events]
    assert types[0] == "response.created" and types[-1] == "response.completed"
    assert "response.reasoning_text.delta" in types and "response.function_call_arguments.done" in types
    call = events[-1].response.output[-1]
    _check_call(call)

    with c.responses.stream(model="scripted", tools=[EXEC],
                            input=[{"role": "user", "content": ASK}, call.to_dict(), _result(call)]) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == ANSWER == final.output_text


def test_socket_prewarm_continuation_lanes_and_cancel(scripted_server):
    c = client(scripted_server)
    with c.responses.connect() as conn:
        f = Frames(conn)
        conn.response.create(model="scripted", input=[{"role": "developer", "content": "You run commands."}],
                             tools=[EXEC], generate=False)
        warm = f.terminal()[-1]["response"]
        assert warm["status"] == "completed" and warm["output"] == []
        conn.response.create(model="scripted", previous_response_id=warm["id"], input=ASK, tools=[EXEC])
        turn = f.terminal()[-1]["response"]
        assert turn["usage"]["input_tokens_details"]["cached_tokens"] >= warm["usage"]["input_tokens"] - 16
        call = turn["output"][-1]
        assert call["type"] == "function_call" and call["name"] == "exec_command"
        # Only the new item: the tool's output.
        conn.response.create(model="scripted", previous_response_id=turn["id"], tools=[EXEC],
                             input=[{"type": "function_call_output", "call_id": call["call_id"], "output": "hello"}])
        done = f.terminal()[-1]["response"]
        assert done["output"][0]["content"][0]["text"] == ANSWER
        assert done["usage"]["input_tokens_details"]["cached_tokens"] >= turn["usage"]["input_tokens"] - 16

        # Two lanes at once: a long answer on "long" (then cancelled), a short one on "short".
        conn.response.create(model="scripted", input="Count to one thousand", stream_id="long")
        conn.response.create(model="scripted", input="Say hi", stream_id="short")
        short = f.terminal(stream_id="short")
        assert short[-1]["response"]["output"][0]["content"][0]["text"] == "Hi!"
        long_id = next(e["response"]["id"] for e in f.seen if e.get("stream_id") == "long" and "response" in e)
        conn.send({"type": "response.cancel", "response_id": long_id, "stream_id": "long"})
        end = f.terminal(stream_id="long")[-1]
        assert end["type"] == "response.incomplete" and end["response"]["status"] == "cancelled"
        text = "".join(e["delta"] for e in f.seen if e.get("stream_id") == "long"
                       and e["type"] == "response.output_text.delta")
        assert "one hundred" not in text  # stopped before the end of its script


def test_chat_completions_json_and_stream(scripted_server):
    c = client(scripted_server)
    tools = [{"type": "function", "function": {k: EXEC[k] for k in ("name", "description", "parameters")}}]
    msgs = [{"role": "user", "content": ASK}]
    first = c.chat.completions.create(model="scripted", messages=msgs, tools=tools)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.function.name == "exec_command" and json.loads(call.function.arguments) == {"cmd": "echo hello"}
    msgs += [choice.message.to_dict(),
             {"role": "tool", "tool_call_id": call.id, "content": "hello"}]
    chunks = list(c.chat.completions.create(model="scripted", messages=msgs, tools=tools, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == ANSWER
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "stop"
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0
