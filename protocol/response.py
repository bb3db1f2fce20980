"""The response object: its skeleton (echoing the request), usage, and status.

`new_response(request, ...)` builds the dict that `response.created` carries and
that `protocol.stream.ResponseStream` then fills in (output items, usage, status,
error, incomplete_details). A non-streaming request returns the stream's final
state, so both paths share this one builder.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from protocol.request import ResponsesRequest

__all__ = ["Usage", "new_response", "echo_fields", "RESPONSE_ERROR_CODES"]

# `Response.error.code` is a closed set in the SDK; anything else is sent as server_error.
RESPONSE_ERROR_CODES = frozenset(
    {
        "server_error",
        "rate_limit_exceeded",
        "invalid_prompt",
        "data_residency_mismatch",
        "bio_policy",
        "misalignment_policy_violation",
        "vector_store_timeout",
        "invalid_image",
        "invalid_image_format",
        "invalid_base64_image",
        "invalid_image_url",
        "image_too_large",
        "image_too_small",
        "image_parse_error",
        "image_content_policy_violation",
        "invalid_image_mode",
        "image_file_too_large",
        "unsupported_image_media_type",
        "empty_image_file",
        "failed_to_download_image",
        "image_file_not_found",
    }
)


@dataclass(slots=True)
class Usage:
    """Token counts of one response.

    `output_tokens` counts every generated token that was kept (reasoning included);
    `reasoning_tokens` is the reasoning part of it. `rewound_tokens` (ignis
    extension) counts tokens generated and then dropped, e.g. the tail matched by
    a stop sequence; they are not in `output_tokens`. `cached_tokens`: prompt
    tokens served from the prefix cache; `cache_write_tokens`: prompt tokens
    newly written to it (the SDK requires the field). `accepted_prediction_tokens` /
    `rejected_prediction_tokens`: speculative draft tokens kept and dropped (chat
    completions' names for them; in a response's `output_tokens_details` an ignis
    extension).
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    rewound_tokens: int = 0
    cache_write_tokens: int = 0
    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def to_dict(self) -> dict[str, Any]:
        return {
            "input_tokens": self.input_tokens,
            "input_tokens_details": {
                "cached_tokens": self.cached_tokens,
                "cache_write_tokens": self.cache_write_tokens,
            },
            "output_tokens": self.output_tokens,
            "output_tokens_details": {
                "reasoning_tokens": self.reasoning_tokens,
                "rewound_tokens": self.rewound_tokens,
                "accepted_prediction_tokens": self.accepted_prediction_tokens,
                "rejected_prediction_tokens": self.rejected_prediction_tokens,
            },
            "total_tokens": self.total_tokens,
        }


def echo_fields(request: ResponsesRequest) -> dict[str, Any]:
    """The request parameters a response echoes, as OpenAI echoes them: every field of
    OpenAI's response object, the sampling ones with the values used (a field the
    request left out has the engine's value for "off": temperature and top_p 1, the
    penalties 0; a server fills the served model's defaults in before this)."""
    s = request.sampling
    return {
        "conversation": None,
        "frequency_penalty": _number(s.frequency_penalty, 0.0),
        "instructions": request.instructions,
        "max_output_tokens": request.max_output_tokens,
        "max_tool_calls": None,
        "model": request.model,
        "parallel_tool_calls": request.parallel_tool_calls,
        "previous_response_id": request.previous_response_id,
        "presence_penalty": _number(s.presence_penalty, 0.0),
        "prompt": None,
        "prompt_cache_key": request.prompt_cache_key,
        "prompt_cache_retention": request.prompt_cache_retention,
        "reasoning": (request.reasoning.to_wire() if request.reasoning else {"effort": None, "summary": None}),
        "safety_identifier": request.safety_identifier,
        "service_tier": request.service_tier or "default",
        "store": request.store if request.store is not None else False,
        "temperature": _number(request.temperature, 1.0),
        "text": request.text.to_wire(),
        "tool_choice": request.tool_choice.to_wire(),
        "tools": request.tools_to_wire(),
        "top_logprobs": request.top_logprobs if request.top_logprobs is not None else 0,
        "top_p": _number(request.top_p, 1.0),
        "truncation": request.truncation,
        "user": request.user,
        "metadata": dict(request.metadata) if request.metadata else {},
    }


def _number(value: float | None, off: float) -> float:
    return off if value is None else float(value)


def new_response(
    request: ResponsesRequest,
    *,
    response_id: str,
    created_at: int | None = None,
    status: str = "in_progress",
) -> dict[str, Any]:
    """A fresh response dict (no output yet, usage None)."""
    resp: dict[str, Any] = {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()) if created_at is None else created_at,
        "status": status,
        "background": False,
        "completed_at": None,
        "error": None,
        "incomplete_details": None,
        "output": [],
        "usage": None,
    }
    resp.update(echo_fields(request))
    return resp
