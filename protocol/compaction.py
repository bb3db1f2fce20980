"""``POST /v1/responses/compact``: a conversation in, a shorter item list out.

OpenAI's compaction endpoint returns the conversation's user messages followed by one
``compaction`` item whose ``encrypted_content`` is opaque; a client sends that list back
(plus its new items) as the next request's ``input``, on either transport, as it sends
back ``reasoning.encrypted_content``. Here the served model writes the summary, and the
compaction item seals it (`protocol.encrypted.seal_compaction`): what it stands for is
restored on the way back in (`protocol.decode.items`), rendered as an earlier assistant
turn (`protocol.responses_conversation`).

- The body: ``model`` (required), ``input`` (a string or items; a ``compaction`` item
  from an earlier compaction is summarised again with the rest), ``instructions``
  (shown to the model while it summarises; not kept: send them again with the next
  request), and the fields that change nothing here (``prompt_cache_key``,
  ``prompt_cache_retention``, ``service_tier``). ``previous_response_id`` is refused as
  over HTTP (ignis stores no responses); other fields OpenAI defines for this endpoint
  (``image``, ``prompt_cache_options``) are refused when set; unknown ones too.
- `summary_request` is the generation that writes the summary: the conversation, then
  `SUMMARY_PROMPT` as a last user message, thinking off, at most `SUMMARY_MAX_TOKENS`
  tokens (or the request's output limit, the served default once filled in, or the
  server's cap, when smaller).
- `compacted` builds the response object: ``{"id", "object": "response.compaction",
  "created_at", "output", "usage"}``; ``output`` is each user message of the input (as
  ``input_text`` parts, with an id and ``status: completed``) and the compaction item.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Mapping

from protocol import ids
from protocol.checks import check_body, check_known_keys, refuse_unsupported_parameter
from protocol.decode.request import decode_request
from protocol.encrypted import seal_compaction
from protocol.items import InputText, Message
from protocol.request import ResponsesRequest
from protocol.response import Usage

__all__ = ["CompactRequest", "decode_compact_request", "summary_request", "compacted", "SUMMARY_PROMPT",
           "SUMMARY_MAX_TOKENS", "COMPACT_FIELDS"]

SUMMARY_PROMPT = (
    "Write a summary of the conversation above that can stand in for it: the user's goal, the facts, "
    "names, numbers and decisions stated so far, what was done (tool calls and their results) and what "
    "is left to do. Write only the summary."
)
SUMMARY_MAX_TOKENS = 1024
COMPACT_FIELDS = frozenset({"model", "input", "instructions", "previous_response_id", "prompt_cache_key",
                            "prompt_cache_retention", "service_tier", "image", "prompt_cache_options"})
_UNSUPPORTED = ("image", "prompt_cache_options")


@dataclass(frozen=True, slots=True)
class CompactRequest:
    request: ResponsesRequest  # the conversation, decoded and checked as a Responses request's


def decode_compact_request(body: Mapping[str, Any], *, reasoning_key: bytes | None = None) -> CompactRequest:
    """Check a compaction body (the module docstring), or raise `Refusal`."""
    check_body(body)
    check_known_keys(body, "", COMPACT_FIELDS)
    for key in _UNSUPPORTED:
        if body.get(key) is not None:
            refuse_unsupported_parameter(key)
    fields = {k: v for k, v in body.items() if k not in _UNSUPPORTED}
    if fields.get("input") is None:
        fields["input"] = []
    return CompactRequest(decode_request(fields, transport="http", reasoning_key=reasoning_key,
                                         strict_encrypted=True))


def summary_request(compact: CompactRequest, cap: int | None = None) -> ResponsesRequest:
    """The request whose answer is the summary (`cap`: the server's output limit)."""
    req = compact.request
    limit = min(n for n in (SUMMARY_MAX_TOKENS, req.sampling.max_output_tokens, cap) if n is not None)
    sampling = replace(req.sampling, max_output_tokens=limit, thinking=False, thinking_budget=None)
    return replace(req, input=req.input + (Message("user", SUMMARY_PROMPT),), sampling=sampling, stream=False,
                   include=(), tools=(), namespaces=())


def _kept(request: ResponsesRequest) -> list[dict[str, Any]]:
    out = []
    for item in request.input:
        if isinstance(item, Message) and item.role == "user":
            parts = (InputText(item.content),) if isinstance(item.content, str) else tuple(
                InputText(p.text) for p in item.content)
            out.append(Message("user", parts, item.id or ids.message_id(), "completed").to_dict())
    return out


def compacted(compact: CompactRequest, summary: str, usage: Usage, *, key: bytes | None,
              created_at: int | None = None, response_id: str | None = None) -> dict[str, Any]:
    """The ``response.compaction`` object for `summary` (the model's text)."""
    item = {"id": ids.new_id("cmp"), "type": "compaction", "encrypted_content": seal_compaction(summary.strip(), key)}
    return {
        "id": response_id or ids.response_id(),
        "object": "response.compaction",
        "created_at": int(time.time()) if created_at is None else created_at,
        "output": [*_kept(compact.request), item],
        "usage": usage.to_dict(),
    }
