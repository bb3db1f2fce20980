"""Client frames of the Responses WebSocket mode, and the socket ``error`` event.

`decode_frame(text)` turns one text frame into exactly one of:

- `CreateEvent`: ``response.create`` -- the request body's fields flat beside
  ``type``, plus ``stream_id`` (optional lane id, 1-256 chars of ``[A-Za-z0-9_.-]``;
  anything else is refused with code ``invalid_stream_id``, as OpenAI's socket does),
  ``generate`` (false = prewarm: load the prefix, generate nothing) and ``stream``
  (accepted, ignored: the socket always streams). ``previous_response_id`` is
  carried (the session resolves it or answers ``previous_response_not_found``).
- `CancelEvent`: ``response.cancel`` with optional ``response_id`` / ``stream_id``.
- `SocketError`: anything else (malformed JSON, unknown type, a refused request,
  ``response.steer`` -> code ``steering_not_supported``). Its `to_dict()` is the
  frame to send: ``{"type":"error","status":400,"error":{message,type,param,code}}``
  plus ``stream_id`` when the frame had a valid one.

`decode_frame` never raises for bad client input.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Union

from protocol.checks import check_known_keys, decode_json, invalid_choice, opt_bool, opt_str, req_str
from protocol.decode import decode_request
from protocol.errors import Refusal
from protocol.request import ResponsesRequest

__all__ = [
    "CreateEvent",
    "CancelEvent",
    "SocketError",
    "ClientEvent",
    "decode_frame",
    "error_event",
    "STREAM_ID_PATTERN",
]

STREAM_ID_PATTERN = re.compile(r"[A-Za-z0-9_.\-]{1,256}")
_SOCKET_ONLY = frozenset({"type", "stream_id", "generate", "stream"})
_CLIENT_TYPES = ("response.create", "response.cancel")


@dataclass(frozen=True, slots=True)
class CreateEvent:
    request: ResponsesRequest
    generate: bool = True
    stream_id: str | None = None


@dataclass(frozen=True, slots=True)
class CancelEvent:
    response_id: str | None = None
    stream_id: str | None = None


@dataclass(frozen=True, slots=True)
class SocketError:
    refusal: Refusal
    stream_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return error_event(self.refusal, self.stream_id)


ClientEvent = Union[CreateEvent, CancelEvent, SocketError]


def error_event(
    refusal: Refusal, stream_id: str | None = None, sequence_number: int | None = None
) -> dict[str, Any]:
    """The socket ``error`` frame for a refusal (the SDK's `ResponseWsError`)."""
    ev: dict[str, Any] = {"type": "error", "status": refusal.status, "error": refusal.error()}
    if sequence_number is not None:
        ev["sequence_number"] = sequence_number
    if stream_id is not None:
        ev["stream_id"] = stream_id
    return ev


def _stream_id(frame: dict[str, Any]) -> str | None:
    sid = frame.get("stream_id")
    if sid is None:
        return None
    if not isinstance(sid, str) or not STREAM_ID_PATTERN.fullmatch(sid):
        raise Refusal(
            "Invalid 'stream_id': expected a string of 1 to 256 characters of letters, digits, '_', '.' or '-'.",
            param="stream_id",
            code="invalid_stream_id",
        )
    return sid


def decode_frame(
    data: str | bytes,
    *,
    reasoning_key: bytes | None = None,
    strict_encrypted: bool = False,
    default_model: str | None = None,
) -> ClientEvent:
    """One client text frame -> `CreateEvent` | `CancelEvent` | `SocketError`."""
    try:
        frame = decode_json(data)
    except Refusal as r:
        return SocketError(r)
    try:
        sid = _stream_id(frame)
    except Refusal as r:
        return SocketError(r)
    try:
        return _decode(frame, sid, reasoning_key, strict_encrypted, default_model)
    except Refusal as r:
        return SocketError(r, sid)


def _decode(
    frame: dict[str, Any],
    sid: str | None,
    reasoning_key: bytes | None,
    strict_encrypted: bool,
    default_model: str | None,
) -> ClientEvent:
    t = req_str(frame, "type")
    if t == "response.create":
        generate = opt_bool(frame, "generate")
        opt_bool(frame, "stream")  # checked, then ignored: the socket always streams
        body = {k: v for k, v in frame.items() if k not in _SOCKET_ONLY}
        body["stream"] = True
        request = decode_request(
            body,
            transport="socket",
            reasoning_key=reasoning_key,
            strict_encrypted=strict_encrypted,
            default_model=default_model,
        )
        return CreateEvent(request, generate is not False, sid)
    if t == "response.cancel":
        check_known_keys(frame, "", {"type", "response_id", "stream_id"})
        return CancelEvent(opt_str(frame, "response_id"), sid)
    if t == "response.steer":
        raise Refusal(
            "Steering ('response.steer') is not supported by ignis.",
            param="type",
            code="steering_not_supported",
        )
    raise invalid_choice("type", t, _CLIENT_TYPES)
