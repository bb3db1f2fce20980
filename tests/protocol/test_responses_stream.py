"""The Responses stream state machine: every event and response ignis can emit,
validated strictly against the OpenAI SDK's types, in OpenAI's order."""

from __future__ import annotations

import json
import math
import re
import time

import pytest

from protocol.decode import decode_request
from protocol.deltas import Failure, Finish, ReasoningDelta, TextDelta, ToolCallArguments, ToolCallEnd, ToolCallStart
from protocol.encrypted import open_reasoning
from protocol.errors import Refusal
from protocol.events import LOGPROB_FLOOR, TokenLogprob, dumps, refusal_stream_error, sse, stream_error_event, wire_logprob
from protocol.response import Usage
from protocol.stream import ResponseStream, StreamStateError
from tests.protocol.responses_sdk import check_grammar, validate_event, validate_response

TOOLS = [
    {"type": "function", "name": "exec_command", "description": "run", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}, "strict": False},
    {"type": "function", "name": "read_file", "parameters": {"type": "object"}},
]


def request(**extra):
    body = {"model": "m", "input": "hi", "tools": TOOLS}
    body.update(extra)
    return decode_request(body)


def run(stream: ResponseStream, script) -> list[dict]:
    events: list[dict] = []
    for step in script:
        events += stream.feed(step)
    return events


USAGE = Usage(input_tokens=12, output_tokens=7, cached_tokens=4, reasoning_tokens=3, rewound_tokens=2)

SCRIPTS = {
    "text": [TextDelta("Hel"), TextDelta("lo"), TextDelta(" world"), Finish("stop", USAGE)],
    "reasoning_text": [ReasoningDelta("Let me "), ReasoningDelta("think."), TextDelta("42"), Finish("stop", USAGE)],
    "tool_calls": [
        ToolCallStart("exec_command"),
        ToolCallArguments('{"cmd":'),
        ToolCallArguments(' "ls"}'),
        ToolCallEnd(),
        ToolCallStart("read_file", "call_given"),
        ToolCallArguments("{}"),
        ToolCallEnd(),
        Finish("tool_calls", USAGE),
    ],
    "reasoning_text_tools": [
        ReasoningDelta("plan"),
        TextDelta("Running it."),
        ToolCallStart("exec_command"),
        ToolCallArguments('{"cmd":"echo hello"}'),
        ToolCallEnd(),
        ReasoningDelta("again"),
        ToolCallStart("read_file"),
        ToolCallArguments("{}"),
        ToolCallEnd(),
        Finish("tool_calls", USAGE),
    ],
    "incomplete_text": [TextDelta("cut "), TextDelta("off"), Finish("length", USAGE)],
    "incomplete_call": [ToolCallStart("exec_command"), ToolCallArguments('{"cmd": "ec'), Finish("max_output_tokens", USAGE)],
    "incomplete_reasoning": [ReasoningDelta("hmm"), Finish("length", USAGE)],
    "content_filter": [TextDelta("x"), Finish("content_filter", USAGE)],
    "failed": [TextDelta("partial"), Failure("the engine fell over", "server_error")],
    "failed_odd_code": [Failure("context too long", "context_length_exceeded")],
    "empty": [Finish("stop", Usage(input_tokens=3))],
    "cancelled": [TextDelta("a"), Finish("cancelled", USAGE)],
    "unclosed_call_then_stop": [ToolCallStart("exec_command"), ToolCallArguments("{}"), Finish("tool_calls", USAGE)],
}

EXPECT = {
    "text": ("completed", None, ["message"]),
    "reasoning_text": ("completed", None, ["reasoning", "message"]),
    "tool_calls": ("completed", None, ["function_call", "function_call"]),
    "reasoning_text_tools": ("completed", None, ["reasoning", "message", "function_call", "reasoning", "function_call"]),
    "incomplete_text": ("incomplete", "max_output_tokens", ["message"]),
    "incomplete_call": ("incomplete", "max_output_tokens", ["function_call"]),
    "incomplete_reasoning": ("incomplete", "max_output_tokens", ["reasoning"]),
    "content_filter": ("incomplete", "content_filter", ["message"]),
    "failed": ("failed", None, ["message"]),
    "failed_odd_code": ("failed", None, []),
    "empty": ("completed", None, []),
    "cancelled": ("cancelled", None, ["message"]),
    "unclosed_call_then_stop": ("completed", None, ["function_call"]),
}

TERMINAL_TYPE = {"completed": "response.completed", "incomplete": "response.incomplete", "failed": "response.failed", "cancelled": "response.incomplete"}


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_scripts_emit_valid_ordered_events(name):
    stream = ResponseStream(request())
    events = stream.start() + run(stream, SCRIPTS[name])
    final = check_grammar(events)
    status, reason, kinds = EXPECT[name]
    assert events[-1]["type"] == TERMINAL_TYPE[status]
    assert final["status"] == status == stream.status
    assert (final["incomplete_details"] or {}).get("reason") == reason
    assert [o["type"] for o in final["output"]] == kinds
    assert stream.done
    if status == "failed":
        assert final["error"]["code"] == "server_error" and final["error"]["message"]
        assert final["usage"] is None
    else:
        assert final["error"] is None
    if status in ("incomplete", "cancelled", "failed") and kinds:
        assert final["output"][-1]["type"] == "reasoning" or final["output"][-1]["status"] == "incomplete"


def test_start_is_implicit():
    a = ResponseStream(request())
    events = a.text("x") + a.finish()
    check_grammar(events)


def test_queued_then_admitted():
    stream = ResponseStream(request(), queued=True)
    events = stream.start()
    assert [e["type"] for e in events] == ["response.created", "response.queued"]
    assert events[0]["response"]["status"] == "queued" and events[1]["response"]["status"] == "queued"
    events += stream.admitted()
    assert events[-1]["type"] == "response.in_progress" and events[-1]["response"]["status"] == "in_progress"
    events += stream.text("ok") + stream.finish("stop", USAGE)
    check_grammar(events, queued=True)


def test_queued_then_delta_admits_implicitly():
    stream = ResponseStream(request(), queued=True)
    events = stream.start() + stream.text("ok") + stream.finish("stop", USAGE)
    check_grammar(events, queued=True)


def test_snapshots_are_not_mutated_later():
    stream = ResponseStream(request())
    created = stream.start()
    text = json.dumps(created)
    stream.text("abc")
    stream.finish("stop", USAGE)
    assert json.dumps(created) == text
    assert created[0]["response"]["status"] == "in_progress" and created[0]["response"]["output"] == []


def test_usage_and_extension_fields_survive_strict_validation():
    stream = ResponseStream(request())
    events = stream.text("a") + stream.finish("stop", USAGE)
    model = validate_response(events[-1]["response"])
    assert model.usage.input_tokens == 12 and model.usage.output_tokens == 7 and model.usage.total_tokens == 19
    assert model.usage.input_tokens_details.cached_tokens == 4
    assert model.usage.output_tokens_details.reasoning_tokens == 3
    # ignis's extension field: the SDK models allow extra fields, strict or not.
    assert model.usage.output_tokens_details.rewound_tokens == 2
    assert model.completed_at is not None


def test_response_echoes_request():
    req = decode_request({
        "model": "tiny", "input": "hi", "instructions": "be brief", "tools": TOOLS,
        "tool_choice": {"type": "function", "name": "read_file"}, "parallel_tool_calls": False,
        "temperature": 0.5, "top_p": 0.9, "max_output_tokens": 64, "top_logprobs": 2,
        "reasoning": {"effort": "low", "summary": "auto"}, "text": {"format": {"type": "text"}, "verbosity": "low"},
        "truncation": "auto", "metadata": {"k": "v"}, "store": False, "user": "u", "service_tier": "auto",
        "prompt_cache_key": "pk", "safety_identifier": "sid", "prompt_cache_retention": "24h",
        "include": ["message.output_text.logprobs"],
    })
    stream = ResponseStream(req, response_id="resp_fixed", created_at=1700000000)
    r = stream.finish("stop", USAGE)[-1]["response"]
    m = validate_response(r)
    assert m.id == "resp_fixed" and m.created_at == 1700000000 and m.object == "response"
    assert m.model == "tiny" and m.instructions == "be brief"
    assert m.tool_choice.type == "function" and m.tool_choice.name == "read_file"
    assert [t.name for t in m.tools] == ["exec_command", "read_file"]
    assert m.parallel_tool_calls is False and m.temperature == 0.5 and m.top_p == 0.9
    assert m.max_output_tokens == 64 and m.top_logprobs == 2
    assert m.reasoning.effort == "low" and m.reasoning.summary == "auto"
    assert m.text.format.type == "text" and m.text.verbosity == "low"
    assert m.truncation == "auto" and m.metadata == {"k": "v"} and m.store is False and m.user == "u"
    assert m.prompt_cache_key == "pk" and m.safety_identifier == "sid" and m.prompt_cache_retention == "24h"
    assert m.previous_response_id is None


def test_allowed_tools_echo():
    req = request(tool_choice={"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "read_file"}]})
    r = ResponseStream(req).finish()[-1]["response"]
    m = validate_response(r)
    assert m.tool_choice.type == "allowed_tools" and m.tool_choice.mode == "required"
    assert r["tool_choice"]["tools"] == [{"type": "function", "name": "read_file"}]


def test_logprobs():
    stream = ResponseStream(request(include=["message.output_text.logprobs"], top_logprobs=2))
    lp1 = TokenLogprob("Hé", -0.25, (TokenLogprob("Hé", -0.25), TokenLogprob("Ha", -1.5)))
    lp2 = TokenLogprob("!", -0.01, (TokenLogprob("!", -0.01), TokenLogprob(".", -4.0)))
    events = stream.text("Hé", [lp1]) + stream.text("!", [lp2]) + stream.finish("stop", USAGE)
    final = check_grammar(events)
    delta = [e for e in events if e["type"] == "response.output_text.delta"]
    hé, ha = list("Hé".encode()), list(b"Ha")
    assert delta[0]["logprobs"] == [{"token": "Hé", "bytes": hé, "logprob": -0.25,
                                     "top_logprobs": [{"token": "Hé", "bytes": hé, "logprob": -0.25},
                                                      {"token": "Ha", "bytes": ha, "logprob": -1.5}]}]
    part = final["output"][0]["content"][0]
    assert part["logprobs"][0]["bytes"] == list("Hé".encode())
    assert [lp["token"] for lp in part["logprobs"]] == ["Hé", "!"]
    done = next(e for e in events if e["type"] == "response.output_text.done")
    assert len(done["logprobs"]) == 2


def test_logprobs_not_finite_serialize_floored_and_capped():
    """A model's NaN logits, an alternative at -inf, a +inf: every event still encodes
    (the encoder refuses NaN / inf), the token's logprob and each alternative's floored
    at -9999.0 (OpenAI's stand-in) or capped at 0."""
    stream = ResponseStream(request(include=["message.output_text.logprobs"], top_logprobs=3))
    nan = TokenLogprob("a", math.nan, (TokenLogprob("a", math.inf), TokenLogprob("b", -math.inf), TokenLogprob("c", math.nan)))
    inf = TokenLogprob("d", math.inf, (TokenLogprob("d", -1e300),))
    events = stream.text("a", [nan]) + stream.text("d", [inf]) + stream.finish("stop", USAGE)
    for e in events:
        json.loads(dumps(e))  # raised ValueError (allow_nan=False) before
        assert sse(e).startswith("event: ")
    final = check_grammar(events)
    deltas = [lp for e in events if e["type"] == "response.output_text.delta" for lp in e["logprobs"]]
    assert [lp["logprob"] for lp in deltas] == [LOGPROB_FLOOR, 0.0]
    assert [a["logprob"] for a in deltas[0]["top_logprobs"]] == [0.0, LOGPROB_FLOOR, LOGPROB_FLOOR]
    assert [a["logprob"] for a in deltas[1]["top_logprobs"]] == [LOGPROB_FLOOR]
    part = final["output"][0]["content"][0]
    assert [lp["logprob"] for lp in part["logprobs"]] == [LOGPROB_FLOOR, 0.0]
    assert [a["logprob"] for a in part["logprobs"][0]["top_logprobs"]] == [0.0, LOGPROB_FLOOR, LOGPROB_FLOOR]
    done = next(e for e in events if e["type"] == "response.output_text.done")
    assert done["logprobs"] == deltas
    assert [wire_logprob(x) for x in (math.nan, -math.inf, math.inf, -1e4, -0.5, 0.25)] == [-9999.0, -9999.0, 0.0, -9999.0, -0.5, 0.0]


def test_logprob_bytes_are_the_tokens_own():
    """☀ split over two byte-level tokens: each carries its own bytes (its text alone is
    U+FFFD), so a client can rebuild the character; no bytes known: the text's UTF-8."""
    stream = ResponseStream(request(include=["message.output_text.logprobs"], top_logprobs=2))
    first = TokenLogprob("\ufffd", -0.5, (TokenLogprob("\ufffd", -0.5, token_bytes=b"\xe2\x98"), TokenLogprob("é", -3.0)),
                         token_bytes=b"\xe2\x98")
    second = TokenLogprob("\ufffd", -0.1, token_bytes=b"\x80")
    events = stream.text("\u2600", [first, second]) + stream.text("!", [TokenLogprob("!", -0.2)]) + stream.finish("stop", USAGE)
    part = check_grammar(events)["output"][0]["content"][0]
    assert [lp["bytes"] for lp in part["logprobs"]] == [[0xE2, 0x98], [0x80], [33]]
    assert bytes(b for lp in part["logprobs"] for b in lp["bytes"]).decode() == part["text"] == "\u2600!"
    assert [a["bytes"] for a in part["logprobs"][0]["top_logprobs"]] == [[0xE2, 0x98], list("é".encode())]
    delta = next(e for e in events if e["type"] == "response.output_text.delta")
    assert delta["logprobs"][0]["bytes"] == [0xE2, 0x98]  # the same bytes in the delta form
    assert [a["token"] for a in delta["logprobs"][0]["top_logprobs"]] == ["\ufffd", "é"]


def test_encrypted_reasoning_included_and_readable():
    key = b"server-secret"
    stream = ResponseStream(request(include=["reasoning.encrypted_content"]), reasoning_key=key)
    events = stream.reasoning("step 1, ") + stream.reasoning("step 2") + stream.text("done") + stream.finish("stop", USAGE)
    final = check_grammar(events)
    item = final["output"][0]
    assert item["type"] == "reasoning" and item["summary"] == []
    assert item["content"] == [{"type": "reasoning_text", "text": "step 1, step 2"}]
    assert open_reasoning(item["encrypted_content"], key) == "step 1, step 2"
    assert open_reasoning(item["encrypted_content"], b"other") is None
    # and the SDK's item model carries it
    assert validate_response(final).output[0].encrypted_content == item["encrypted_content"]


def test_no_encrypted_content_unless_included():
    stream = ResponseStream(request())
    final = (stream.reasoning("x") + stream.finish())[-1]["response"]
    assert "encrypted_content" not in final["output"][0]


def test_stream_id_on_every_event():
    stream = ResponseStream(request(), stream_id="lane-1")
    events = stream.start() + run(stream, SCRIPTS["reasoning_text_tools"])
    assert all(e["stream_id"] == "lane-1" for e in events)
    for e in events:
        validate_event(e)


def _normalise(obj):
    text = json.dumps(obj, sort_keys=True)
    text = re.sub(r'"(msg|rs|fc|call)_[0-9a-f]{48}"', r'"\1_X"', text)
    text = re.sub(r'"completed_at": \d+', '"completed_at": 0', text)
    return json.loads(text)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_non_streaming_equals_final_stream_state(name):
    req = request()
    a = ResponseStream(req, response_id="resp_same", created_at=1)
    b = ResponseStream(req, response_id="resp_same", created_at=1, emit=False)
    events = a.start() + run(a, SCRIPTS[name])
    assert b.start() == [] and run(b, SCRIPTS[name]) == []
    assert _normalise(b.response) == _normalise(events[-1]["response"]) == _normalise(a.response)
    validate_response(b.response)


def test_closed_stream_drops_late_deltas():
    stream = ResponseStream(request())
    stream.text("a")
    stream.finish()
    assert stream.text("b") == [] and stream.reasoning("c") == [] and stream.finish() == []
    assert stream.fail("x") == [] and stream.tool_call_start("f") == [] and stream.cancel() == []
    assert stream.response["output"][0]["content"][0]["text"] == "a"


def test_misuse_is_loud():
    stream = ResponseStream(request())
    with pytest.raises(StreamStateError):
        stream.tool_call_arguments("{}")
    with pytest.raises(StreamStateError):
        stream.tool_call_end()
    with pytest.raises(ValueError):
        stream.finish("bogus")
    with pytest.raises(TypeError):
        stream.feed("text")


def test_empty_deltas_emit_nothing():
    stream = ResponseStream(request())
    stream.start()
    assert stream.text("") == [] and stream.reasoning("") == []
    stream.tool_call_start("f")
    assert stream.tool_call_arguments("") == []


def test_ids_are_openai_shaped():
    stream = ResponseStream(request())
    events = run(stream, SCRIPTS["reasoning_text_tools"])
    r = events[-1]["response"]
    assert re.fullmatch(r"resp_[0-9a-f]{48}", r["id"])
    calls = [o for o in r["output"] if o["type"] == "function_call"]
    assert re.fullmatch(r"call_[0-9a-f]{48}", calls[0]["call_id"])


def test_encoders():
    stream = ResponseStream(request())
    ev = stream.text("é\n")[-1]
    assert json.loads(dumps(ev)) == ev
    frame = sse(ev)
    assert frame.startswith("event: response.output_text.delta\ndata: {") and frame.endswith("}\n\n")
    assert "\n" not in frame[len("event: response.output_text.delta\ndata: ") : -2]


def test_hot_path_is_cheap():
    stream = ResponseStream(request())
    stream.text("x")
    n = 20000
    # This thread's CPU time: the cost of the code, not how often a loaded machine (or another
    # thread holding the GIL) left it waiting.
    t0 = time.thread_time()
    for _ in range(n):
        for e in stream.text("tok"):
            dumps(e)
    per = (time.thread_time() - t0) / n
    assert per < 50e-6, f"{per * 1e6:.1f} us per token event"
    assert len(stream.finish()[-1]["response"]["output"][0]["content"][0]["text"]) == 1 + 3 * n


def test_sse_error_event():
    ev = stream_error_event("overloaded", code="server_error", sequence_number=5)
    assert validate_event(ev).message == "overloaded"
    ev = refusal_stream_error(Refusal("bad", "input[0].type", "invalid_value"))
    m = validate_event(ev)
    assert (m.param, m.code, m.sequence_number) == ("input[0].type", "invalid_value", 0)
