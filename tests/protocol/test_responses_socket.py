"""WebSocket client frames and the socket error event."""

from __future__ import annotations

import json

import pytest

from protocol.errors import Refusal
from protocol.socket_events import CancelEvent, CreateEvent, SocketError, decode_frame, error_event
from protocol.stream import ResponseStream
from tests.protocol.responses_sdk import WS_EVENT, check_grammar, validate_event, wire


def frame(**kw):
    base = {"type": "response.create", "model": "m", "input": "hi"}
    base.update(kw)
    return json.dumps(base)


def test_create():
    ev = decode_frame(frame(stream=True, stream_id="lane.1-a_B", generate=False, previous_response_id="resp_1"))
    assert isinstance(ev, CreateEvent)
    assert ev.generate is False and ev.stream_id == "lane.1-a_B" and ev.request.stream is True
    assert ev.request.previous_response_id == "resp_1"
    ev = decode_frame(frame().encode())
    assert ev.generate is True and ev.stream_id is None


def test_cancel():
    assert decode_frame('{"type":"response.cancel"}') == CancelEvent(None, None)
    assert decode_frame('{"type":"response.cancel","response_id":"resp_1","stream_id":"s"}') == CancelEvent("resp_1", "s")
    err = decode_frame('{"type":"response.cancel","response_id":1,"stream_id":"s"}')
    assert isinstance(err, SocketError) and err.refusal.param == "response_id" and err.stream_id == "s"


CASES = [
    ("{not json", None, "invalid_json", None),
    ("[1,2]", None, "invalid_json", None),
    ('{"model":"m"}', "type", "missing_required_parameter", None),
    ('{"type":"session.update"}', "type", "invalid_value", None),
    ('{"type":"response.steer","stream_id":"s1","input":[]}', "type", "steering_not_supported", "s1"),
    ('{"type":5}', "type", "invalid_type", None),
    (frame(stream_id=""), "stream_id", "invalid_stream_id", None),
    (frame(stream_id="has space"), "stream_id", "invalid_stream_id", None),
    (frame(stream_id="x" * 257), "stream_id", "invalid_stream_id", None),
    (frame(stream_id=7), "stream_id", "invalid_stream_id", None),
    (frame(stream_id="ok", generate="no"), "generate", "invalid_type", "ok"),
    (frame(stream_id="ok", stream="yes"), "stream", "invalid_type", "ok"),
    (frame(stream_id="ok", tools=[{"type": "web_search"}]), "tools[0].type", "unsupported_value", "ok"),
    (frame(stream_id="ok", background=True), "background", "unsupported_value", "ok"),
    (frame(foo=1), "foo", "unknown_parameter", None),
    ('{"type":"response.cancel","extra":1}', "extra", "unknown_parameter", None),
]


@pytest.mark.parametrize("text,param,code,sid", CASES)
def test_errors(text, param, code, sid):
    ev = decode_frame(text)
    assert isinstance(ev, SocketError)
    d = ev.to_dict()
    assert d["type"] == "error" and d["status"] == 400
    assert d["error"]["param"] == param and d["error"]["code"] == code and d["error"]["type"] == "invalid_request_error"
    assert d.get("stream_id") == sid
    assert ("stream_id" in d) == (sid is not None)
    model = WS_EVENT.validate_python(wire(d), strict=True)
    assert model.type == "error" and model.status == 400 and model.error.code == code


def test_error_event_encoder():
    r = Refusal("Previous response with id 'resp_x' not found.", "previous_response_id", "previous_response_not_found")
    d = error_event(r, "lane", sequence_number=3)
    assert d == {
        "type": "error",
        "status": 400,
        "error": {"message": r.message, "type": "invalid_request_error", "param": "previous_response_id", "code": "previous_response_not_found"},
        "sequence_number": 3,
        "stream_id": "lane",
    }
    WS_EVENT.validate_python(wire(d), strict=True)


def test_socket_response_stream_events_validate_as_ws_events():
    ev = decode_frame(frame(stream_id="lane", include=["reasoning.encrypted_content"]))
    s = ResponseStream(ev.request, stream_id=ev.stream_id)
    events = s.reasoning("r") + s.text("t") + s.finish()
    for e in events:
        assert e["stream_id"] == "lane"
        validate_event(e)
    check_grammar(events)
