"""Event encoding: JSON text, SSE framing, token logprobs, the stream `error` event.

Events are plain dicts, built by `protocol.stream.ResponseStream`, ready for
`json.dumps`. These helpers turn them into wire text without copying them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from protocol.errors import Refusal

__all__ = ["TokenLogprob", "dumps", "sse", "SSE_DONE", "stream_error_event", "refusal_stream_error"]

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


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One sampled token's logprob and its top alternatives ((token, logprob) pairs)."""

    token: str
    logprob: float
    top_logprobs: tuple[tuple[str, float], ...] = ()

    def delta_dict(self) -> dict[str, Any]:
        """The form inside ``response.output_text.delta`` / ``.done`` events."""
        return {
            "token": self.token,
            "logprob": self.logprob,
            "top_logprobs": [{"token": t, "logprob": lp} for t, lp in self.top_logprobs],
        }

    def output_dict(self) -> dict[str, Any]:
        """The form inside a final ``output_text`` part (with UTF-8 ``bytes``)."""
        return {
            "token": self.token,
            "bytes": list(self.token.encode("utf-8")),
            "logprob": self.logprob,
            "top_logprobs": [
                {"token": t, "bytes": list(t.encode("utf-8")), "logprob": lp} for t, lp in self.top_logprobs
            ],
        }


def stream_error_event(
    message: str, *, code: str | None = None, param: str | None = None, sequence_number: int = 0
) -> dict[str, Any]:
    """The SSE ``error`` event (`ResponseErrorEvent`): a stream that cannot go on.

    Prefer ``response.failed`` (`ResponseStream.fail`) once ``response.created`` was
    sent; this is for errors outside a response's life.
    """
    return {"type": "error", "code": code, "message": message, "param": param, "sequence_number": sequence_number}


def refusal_stream_error(refusal: Refusal, sequence_number: int = 0) -> dict[str, Any]:
    return stream_error_event(refusal.message, code=refusal.code, param=refusal.param, sequence_number=sequence_number)
