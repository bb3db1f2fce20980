"""What Open Responses' schema asks of the protocol package: every field of the response
object with the values used, tool outputs that answer a call, compaction (its body, its
sealed item, the item coming back as input), and the vendored schema itself."""

from __future__ import annotations

import json

import pytest
from openai.types.responses.response_compaction_item import ResponseCompactionItem
from pydantic import TypeAdapter

from protocol.compaction import SUMMARY_PROMPT, compacted, decode_compact_request, summary_request
from protocol.decode import decode_item, decode_request
from protocol.encrypted import open_compaction, open_reasoning, seal_compaction, seal_reasoning
from protocol.errors import Refusal
from protocol.items import Compaction, Message
from protocol.response import Usage
from protocol.responses_conversation import COMPACTION_PREFIX, check_call_outputs, to_conversation
from protocol.stream import ResponseStream
from tests import openresponses
from tests.protocol.responses_sdk import check_grammar, validate_response

KEY = b"k" * 32
CALL = {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"}
OUTPUT = {"type": "function_call_output", "call_id": "call_1", "output": "ok"}


def refused(fn, *args, **kw) -> Refusal:
    with pytest.raises(Refusal) as info:
        fn(*args, **kw)
    return info.value


def test_the_vendored_schema_is_the_one_its_note_names():
    import hashlib

    raw = openresponses.SCHEMA_PATH.read_bytes()
    note = (openresponses.SCHEMA_PATH.parent / "SOURCE.md").read_text()
    assert hashlib.sha256(raw).hexdigest() in note
    assert json.loads(raw)["info"]["version"] == "2026-04-24"
    assert {"response.created", "response.completed", "response.output_text.delta"} <= set(openresponses.event_schemas())


def test_the_checker_fails_what_the_schema_refuses():
    """The checks can fail: a response without the two penalty fields (what ignis sent
    before), a socket error frame without a code, an event type the schema lacks."""
    resp = ResponseStream(decode_request({"model": "m", "input": "hi"})).finish("stop", Usage())[-1]["response"]
    openresponses.check_response(resp)
    for field in ("presence_penalty", "frequency_penalty"):
        with pytest.raises(AssertionError, match=field):
            openresponses.check_response({k: v for k, v in resp.items() if k != field})
    with pytest.raises(AssertionError, match="code"):
        openresponses.check_event({"type": "error", "status": 400, "error": {"message": "m", "code": None}},
                                  socket=True)
    with pytest.raises(AssertionError, match="not in the Open Responses schema"):
        openresponses.check_event({"type": "response.steered", "sequence_number": 0})


def test_every_reasoning_effort_openai_accepts_validates():
    """OpenAI's efforts include ``minimal``, which the peer schema describes but leaves
    out of its enum (found by the fuzzer in CI); the echoed value must still validate."""
    for effort in ("none", "minimal", "low", "medium", "high", "xhigh"):
        req = decode_request({"model": "m", "input": "", "reasoning": {"effort": effort}})
        resp = ResponseStream(req).finish("length", Usage())[-1]["response"]
        assert resp["reasoning"]["effort"] == effort
        openresponses.check_response(resp)
        validate_response(resp)


def test_every_field_of_the_response_object_with_the_values_used():
    req = decode_request({"model": "m", "input": "hi", "presence_penalty": 0.25})
    resp = ResponseStream(req).finish("stop", Usage(3, 2))[-1]["response"]
    validate_response(resp)  # SDK types + Open Responses' schema
    assert (resp["temperature"], resp["top_p"]) == (1.0, 1.0)  # none given: the engine's 1 and 1
    assert (resp["presence_penalty"], resp["frequency_penalty"]) == (0.25, 0.0)
    assert resp["conversation"] is None and resp["prompt"] is None and resp["max_tool_calls"] is None
    assert resp["top_logprobs"] == 0 and resp["store"] is False and resp["metadata"] == {}


@pytest.mark.parametrize("output", [OUTPUT, {"type": "custom_tool_call_output", "call_id": "call_1", "output": "ok"}])
def test_an_output_must_answer_a_call_in_the_conversation(output):
    r = refused(decode_request, {"model": "m", "input": [{"role": "user", "content": "hi"}, output]})
    assert (r.status, r.code, r.param) == (400, "invalid_value", "input[1].call_id")
    assert "call_1" in r.message
    # The call before it: accepted (a function or a custom call; the kinds need not match).
    decode_request({"model": "m", "input": [CALL, output]})
    custom = {"type": "custom_tool_call", "call_id": "call_1", "name": "t", "input": "x"}
    decode_request({"model": "m", "input": [custom, output]})
    # After it is too late.
    assert refused(decode_request, {"model": "m", "input": [output, CALL]}).param == "input[0].call_id"
    # Over the socket with previous_response_id the session checks (the calls are behind it).
    decode_request({"model": "m", "input": [output], "previous_response_id": "resp_1"}, transport="socket")


def test_check_call_outputs_counts_only_the_new_items():
    history = decode_request({"model": "m", "input": [CALL, OUTPUT]}).input
    new = decode_request({"model": "m", "input": [{**OUTPUT, "call_id": "call_2"}],
                          "previous_response_id": "r"}, transport="socket").input
    check_call_outputs(history + new[:0], first=len(history))
    r = refused(check_call_outputs, history + new, first=len(history))
    assert r.param == "input[0].call_id"  # the index in the request's own input


def test_compaction_tokens_are_their_own_kind():
    assert open_compaction(seal_compaction("sum", KEY), KEY) == "sum"
    assert open_compaction(seal_reasoning("sum", KEY), KEY) is None  # reasoning cannot pass for a summary
    assert open_reasoning(seal_compaction("sum", KEY), KEY) is None  # nor the reverse
    assert open_compaction(seal_compaction("sum", KEY), b"other" * 8) is None


def test_the_compaction_body():
    body = {"model": "m", "prompt_cache_key": "k", "input": [
        {"type": "message", "role": "user", "content": "We launch on Tuesday."},
        {"type": "message", "role": "assistant", "content": "Noted: Tuesday."},
        {"role": "user", "content": [{"type": "input_text", "text": "Tell support."}]}]}
    compact = decode_compact_request(body, reasoning_key=KEY)
    req = summary_request(compact, cap=300)
    assert req.input[-1] == Message("user", SUMMARY_PROMPT) and req.sampling.max_output_tokens == 300
    assert req.sampling.thinking is False and not req.stream and not req.tools
    out = compacted(compact, " Launch Tuesday; support told. ", Usage(40, 9), key=KEY)
    openresponses.check_compaction(out)
    assert out["object"] == "response.compaction" and out["usage"]["total_tokens"] == 49
    kept, item = out["output"][:-1], out["output"][-1]
    assert [m["content"][0]["text"] for m in kept] == ["We launch on Tuesday.", "Tell support."]
    assert all(m["role"] == "user" and m["status"] == "completed" and m["id"].startswith("msg_") for m in kept)
    TypeAdapter(ResponseCompactionItem).validate_python(item, strict=True)
    assert item["id"].startswith("cmp_") and "Tuesday" not in item["encrypted_content"][:3]
    # Back in as input: the summary is restored and rendered as an earlier assistant turn.
    again = decode_request({"model": "m", "input": [*kept, item, {"role": "user", "content": "Go on."}]},
                           reasoning_key=KEY)
    back = again.input[len(kept)]
    assert isinstance(back, Compaction) and back.summary == "Launch Tuesday; support told."
    assert decode_item(back.to_dict(), reasoning_key=KEY) == back
    messages = to_conversation(again).messages
    assert [m.role for m in messages] == ["user", "user", "assistant", "user"]
    assert messages[2].content == COMPACTION_PREFIX + "Launch Tuesday; support told."


@pytest.mark.parametrize("body, param, code", [
    ({"input": "hi"}, "model", "missing_required_parameter"),
    ({"model": "m", "input": "hi", "tools": []}, "tools", "unknown_parameter"),
    ({"model": "m", "input": "hi", "image": {"context_compression": "auto"}}, "image", "unsupported_parameter"),
    ({"model": "m", "input": "hi", "previous_response_id": "resp_1"}, "previous_response_id",
     "previous_response_not_found"),
    ({"model": "m", "input": [{"type": "compaction", "encrypted_content": "ig1.forged"}]},
     "input[0].encrypted_content", "invalid_encrypted_content"),
    ({"model": "m", "input": [OUTPUT]}, "input[0].call_id", "invalid_value"),
])
def test_compaction_refusals(body, param, code):
    r = refused(decode_compact_request, body, reasoning_key=KEY)
    assert (r.status, r.param, r.code) == (400, param, code)


def test_an_unreadable_compaction_item_is_refused_on_any_request():
    item = {"type": "compaction", "encrypted_content": seal_compaction("s", b"another server" * 3)}
    r = refused(decode_request, {"model": "m", "input": [item]}, reasoning_key=KEY)
    assert (r.param, r.code) == ("input[0].encrypted_content", "invalid_encrypted_content")


def test_sse_error_event_has_both_shapes():
    from protocol.events import stream_error_event
    from tests.protocol.responses_sdk import validate_event

    ev = stream_error_event("Timed out.", code="server_error", sequence_number=3)
    validate_event(ev)  # the SDK's flat fields and the schema's nested error object
    assert ev["error"]["message"] == ev["message"] == "Timed out."


def test_logprob_deltas_carry_bytes_for_the_schema():
    from protocol.events import TokenLogprob

    stream = ResponseStream(decode_request({"model": "m", "input": "hi", "include": ["message.output_text.logprobs"],
                                            "top_logprobs": 1}))
    lp = TokenLogprob("é", -0.5, (TokenLogprob("é", -0.5),))
    events = stream.text("é", [lp]) + stream.finish("stop", Usage())
    check_grammar(events)
    delta = next(e for e in events if e["type"] == "response.output_text.delta")
    assert delta["logprobs"][0]["bytes"] == list("é".encode())
