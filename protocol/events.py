"""Event encoding: JSON text, SSE framing, token logprobs, the stream `error` event.

Events are plain dicts, built by `protocol.stream.ResponseStream`, ready for
`json.dumps`. These helpers turn them into wire text without copying them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from protocol.errors import Refusal

__all__ = [
    "TokenLogprob",
    "LOGPROB_FLOOR",
    "wire_logprob",
    "dumps",
    "sse",
    "SSE_DONE",
    "stream_error_event",
    "refusal_stream_error",
]

_encoder = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def dumps(event: dict[str, Any]) -> str:
    """Compact JSON text of an event (UTF-8 left as is; no NaN)."""
    return _encoder.encode(event)


def sse(event: dict[str, Any]) -> str:
    """One server-sent event: ``event: <type>`` + ``data: <json>`` + blank line."""
    return f"event: {event['type']}\ndata: {_encoder.encode(event)}\n\n"


# OpenAI's Responses stream ends when the terminal event is sent; no [DONE] line is
# needed (that is chat completions). Kept for transports that want it.
SSE_DONE = "data: [DONE]\n\n"


# OpenAI's stand-in for "very unlikely": JSON has no -inf (nor NaN), and the encoder
# refuses both, so every logprob on the wire goes through `wire_logprob`.
LOGPROB_FLOOR = -9999.0


def wire_logprob(value: float) -> float:
    """A logprob fit for JSON: NaN, -inf and anything below `LOGPROB_FLOOR` become the
    floor; +inf and positive values (impossible for a log-probability) are capped at 0."""
    value = float(value)
    if math.isnan(value) or value < LOGPROB_FLOOR:
        return LOGPROB_FLOOR
    return min(value, 0.0)


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One token (sampled, or an alternative) with its logprob.

    `token_bytes`: the token's own bytes when known (a byte-level token may hold part of
    a UTF-8 character, whose text alone reads U+FFFD); None: the UTF-8 of `token`.
    `top_logprobs`: the step's most likely tokens, themselves `TokenLogprob`s (without
    alternatives of their own)."""

    token: str
    logprob: float
    top_logprobs: tuple[TokenLogprob, ...] = ()
    token_bytes: bytes | None = None

    def wire_bytes(self) -> list[int]:
        """OpenAI's ``bytes`` field: the token's bytes as a list of ints."""
        if self.token_bytes is not None:
            return list(self.token_bytes)
        return list(self.token.encode("utf-8", errors="surrogatepass"))

    def delta_dict(self) -> dict[str, Any]:
        """The form inside ``response.output_text.delta`` / ``.done`` events (with ``bytes``,
        which Open Responses' schema requires there and the SDK's type admits)."""
        return {
            "token": self.token,
            "bytes": self.wire_bytes(),
            "logprob": wire_logprob(self.logprob),
            "top_logprobs": [{"token": a.token, "bytes": a.wire_bytes(), "logprob": wire_logprob(a.logprob)}
                             for a in self.top_logprobs],
        }

    def output_dict(self) -> dict[str, Any]:
        """The form inside a final ``output_text`` part and in chat's ``logprobs.content``
        (with ``bytes``)."""
        return {
            "token": self.token,
            "bytes": self.wire_bytes(),
            "logprob": wire_logprob(self.logprob),
            "top_logprobs": [
                {"token": a.token, "bytes": a.wire_bytes(), "logprob": wire_logprob(a.logprob)}
                for a in self.top_logprobs
            ],
        }


def stream_error_event(
    message: str, *, code: str | None = None, param: str | None = None, sequence_number: int = 0
) -> dict[str, Any]:
    """The SSE ``error`` event (`ResponseErrorEvent`): a stream that cannot go on.

    Prefer ``response.failed`` (`ResponseStream.fail`) once ``response.created`` was
    sent; this is for errors outside a response's life.
    """
    # OpenAI's SDK reads the fields flat; Open Responses' schema wants them in ``error``.
    error = {"type": "invalid_request_error" if param else "server_error", "code": code, "message": message,
             "param": param}
    return {"type": "error", "code": code, "message": message, "param": param, "error": error,
            "sequence_number": sequence_number}


def refusal_stream_error(refusal: Refusal, sequence_number: int = 0) -> dict[str, Any]:
    return stream_error_event(refusal.message, code=refusal.code, param=refusal.param, sequence_number=sequence_number)
