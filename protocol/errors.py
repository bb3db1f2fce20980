"""Refusals: a client's mistake, shaped exactly as OpenAI's error envelope.

Decoders raise `Refusal`; transports turn it into an HTTP status + JSON body, an SSE
error, or a socket `error` event. Nothing here knows about any transport.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Refusal(Exception):
    message: str
    # Path of the offending value in the request, e.g. "input[3].content[0].type".
    param: str | None = None
    code: str | None = None
    type: str = "invalid_request_error"
    status: int = 400

    def __post_init__(self) -> None:
        super().__init__(self.message)

    def error(self) -> dict[str, Any]:
        """The inner `error` object."""
        return {"message": self.message, "type": self.type, "param": self.param, "code": self.code}

    def envelope(self) -> dict[str, Any]:
        """The body OpenAI sends with a 4xx/5xx: {"error": {...}}."""
        return {"error": self.error()}
