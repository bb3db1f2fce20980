"""The Responses request body: a JSON object -> `ResponsesRequest`, or a `Refusal`.

The policy (what is accepted, ignored, refused) is in `protocol.decode`.
`decode_request` checks the fields in a fixed order, so that the first mistake is
the one refused, with one helper per field or group of fields; input items
(`protocol.decode.items`) and tools (`protocol.decode.tools`) have modules of their
own, and the sampling fields are `protocol.sampling`'s.
"""

from __future__ import annotations

from typing import Any, Literal, Mapping

from protocol.checks import (
    check_array,
    check_body,
    check_known_keys,
    check_object,
    check_str,
    invalid_choice,
    opt_bool,
    opt_enum,
    opt_str,
    path,
    refuse_missing,
    refuse_unsupported_parameter,
    require,
    unsupported_value,
)
from protocol.decode.items import decode_input
from protocol.decode.tools import decode_tool_choice, decode_tools
from protocol.errors import Refusal
from protocol.request import (
    INCLUDE_ENCRYPTED_REASONING,
    INCLUDE_LOGPROBS,
    ReasoningConfig,
    ResponsesRequest,
    TextConfig,
)
from protocol.responses_conversation import check_call_outputs
from protocol.sampling import RESPONSES_NAMES, extract_sampling
from protocol.structured import TextFormat, decode_text_format

__all__ = ["decode_request", "Transport", "KNOWN_INCLUDES", "ACTIVE_INCLUDES", "REQUEST_FIELDS"]

Transport = Literal["http", "socket"]

# --- field tables -------------------------------------------------------------------

ACTIVE_INCLUDES = frozenset({INCLUDE_ENCRYPTED_REASONING, INCLUDE_LOGPROBS})
KNOWN_INCLUDES = ACTIVE_INCLUDES | {
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
}

# Known to OpenAI, not implemented by ignis: refused when set (not null).
UNSUPPORTED_FIELDS = frozenset(
    {
        "conversation",
        "prompt",
        "max_tool_calls",
        "context_management",
        "moderation",
        "image",
        "access_programs",
        "background_options",
        "prompt_cache_options",
    }
)

_OWN_FIELDS = frozenset(
    {
        "model",
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "reasoning",
        "text",
        "stream",
        "include",
        "stream_options",
        "truncation",
        "previous_response_id",
        "background",
        "store",
        "metadata",
        "user",
        "prompt_cache_key",
        "service_tier",
        "safety_identifier",
        "client_metadata",
        "prompt_cache_retention",
    }
)
REQUEST_FIELDS = _OWN_FIELDS | frozenset(RESPONSES_NAMES) | UNSUPPORTED_FIELDS

SERVICE_TIERS = ("auto", "default", "flex", "scale", "priority")
SUMMARIES = ("auto", "concise", "detailed")
VERBOSITIES = ("low", "medium", "high")


def decode_request(
    body: Mapping[str, Any],
    *,
    transport: Transport = "http",
    reasoning_key: bytes | None = None,
    strict_encrypted: bool = False,
    default_model: str | None = None,
    accept_previous_response_id: bool | None = None,
    extra_fields: frozenset[str] = frozenset(),
) -> ResponsesRequest:
    """Check a Responses request body and build a `ResponsesRequest`, or raise `Refusal`.

    - `transport`: "http" refuses ``previous_response_id`` (ignis stores no
      responses: 400 ``previous_response_not_found``); "socket" carries it in the
      result for the session to resolve. `accept_previous_response_id` overrides.
    - `reasoning_key`: the server's key for `encrypted_content` (see
      `protocol.encrypted`); None = unsigned tokens.
    - `strict_encrypted`: refuse an unreadable `encrypted_content` instead of dropping it.
    - `default_model`: used when ``model`` is absent (else missing_required_parameter).
    - `extra_fields`: keys the caller consumed itself (the socket's type, stream_id,
      generate) and that must not count as unknown.
    """
    check_body(body)
    check_known_keys(body, "", REQUEST_FIELDS | extra_fields if extra_fields else REQUEST_FIELDS)
    for key in body:  # in the client's order: the first one sent is the one refused
        if key in UNSUPPORTED_FIELDS and body[key] is not None:
            refuse_unsupported_parameter(key)
    model = _model(body.get("model"), default_model)
    # `text` before the rest: an unsupported output format is the most telling refusal.
    text = _text_config(body.get("text"))
    items = decode_input(require(body, "input", ""), reasoning_key=reasoning_key, strict_encrypted=strict_encrypted)
    instructions = opt_str(body, "instructions")
    tools, namespaces = decode_tools(body.get("tools"))
    tool_choice = decode_tool_choice(body.get("tool_choice"), tools)
    parallel = opt_bool(body, "parallel_tool_calls")
    reasoning = _reasoning_config(body.get("reasoning"))
    stream = opt_bool(body, "stream")
    include = _include(body.get("include"))
    obfuscation = _stream_options(body.get("stream_options"))
    truncation = opt_enum(body, "truncation", "", ("auto", "disabled")) or "disabled"
    if opt_bool(body, "background"):
        raise Refusal("Background mode is not supported by ignis.", param="background", code="unsupported_value")
    previous = _previous_response_id(body, transport, accept_previous_response_id)
    if previous is None:  # else the history is the session's: it checks the new items against it
        check_call_outputs(items)
    echoed = _echoed_fields(body)
    return ResponsesRequest(
        model=model,
        input=items,
        instructions=instructions,
        tools=tools,
        namespaces=namespaces,
        tool_choice=tool_choice,
        parallel_tool_calls=True if parallel is None else parallel,
        sampling=extract_sampling(body),
        reasoning=reasoning,
        text=text,
        stream=bool(stream),
        include=include,
        include_obfuscation=obfuscation,
        truncation=truncation,
        previous_response_id=previous,
        **echoed,
    )


# --- one helper per field (None: the field is absent or null) -----------------------


def _model(value: Any, default_model: str | None) -> str:
    if value is None:
        if default_model is None:
            refuse_missing("model")
        return default_model
    return check_str(value, "model", min_len=1)


def _text_config(value: Any) -> TextConfig:
    if value is None:
        return TextConfig()
    check_object(value, "text")
    check_known_keys(value, "text", frozenset({"format", "verbosity"}))
    fmt = value.get("format")
    text_format = TextFormat() if fmt is None else decode_text_format(fmt, "text.format")
    return TextConfig(opt_enum(value, "verbosity", "text", VERBOSITIES), text_format)


def _reasoning_config(value: Any) -> ReasoningConfig | None:
    if value is None:
        return None
    param = "reasoning"
    check_object(value, param)
    check_known_keys(value, param, frozenset({"effort", "summary", "generate_summary", "context", "mode"}))
    effort = value.get("effort")  # range-checked by extract_sampling
    summary = opt_enum(value, "summary", param, SUMMARIES)
    alias = opt_enum(value, "generate_summary", param, SUMMARIES)  # deprecated alias of summary
    for key, only in (("context", "auto"), ("mode", "standard")):
        given = value.get(key)
        if given is not None and check_str(given, path(param, key)) != only:
            raise unsupported_value(path(param, key), given, f"{path(param, key)} (only '{only}' is)")
    return ReasoningConfig(effort if isinstance(effort, str) else None, summary or alias)


def _include(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    out: list[str] = []
    for i, v in enumerate(check_array(value, "include")):
        p = path("include", i)
        check_str(v, p)
        if v not in KNOWN_INCLUDES:
            raise invalid_choice(p, v, tuple(sorted(KNOWN_INCLUDES)))
        if v not in out:
            out.append(v)
    return tuple(out)


def _stream_options(value: Any) -> bool | None:
    """``stream_options.include_obfuscation``: accepted, changing nothing."""
    if value is None:
        return None
    check_object(value, "stream_options")
    check_known_keys(value, "stream_options", frozenset({"include_obfuscation"}))
    return opt_bool(value, "include_obfuscation", "stream_options")


def _previous_response_id(body: Mapping[str, Any], transport: Transport, accept: bool | None) -> str | None:
    previous = opt_str(body, "previous_response_id")
    if previous is None:
        return None
    if not ((transport == "socket") if accept is None else accept):
        raise Refusal(
            f"Previous response with id '{previous}' not found: ignis stores no responses over HTTP. "
            "Send the whole conversation as `input` (or use the WebSocket mode, where a connection "
            "keeps the latest response of each stream).",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    return previous


def _echoed_fields(body: Mapping[str, Any]) -> dict[str, Any]:
    """The fields that are checked and change nothing (the response echoes most)."""
    client_metadata = body.get("client_metadata")
    return {
        "store": opt_bool(body, "store"),
        "metadata": None if body.get("metadata") is None else _metadata(body["metadata"]),
        "user": opt_str(body, "user"),
        "prompt_cache_key": opt_str(body, "prompt_cache_key"),
        "service_tier": opt_enum(body, "service_tier", "", SERVICE_TIERS),
        "safety_identifier": opt_str(body, "safety_identifier"),
        "prompt_cache_retention": opt_enum(body, "prompt_cache_retention", "", ("in_memory", "24h")),
        "client_metadata": None if client_metadata is None else check_object(client_metadata, "client_metadata"),
    }


def _metadata(value: Any) -> dict[str, str]:
    check_object(value, "metadata")
    if len(value) > 16:
        raise Refusal(
            f"Invalid 'metadata': too many properties. Expected an object with at most 16 properties, but got an object with {len(value)} properties instead.",
            param="metadata",
            code="object_above_max_properties",
        )
    for k, v in value.items():
        p = f"metadata.{k}"
        if len(k) > 64:
            raise Refusal(
                f"Invalid 'metadata': key '{k[:16]}...' is longer than 64 characters.",
                param=p,
                code="invalid_value",
            )
        check_str(v, p, max_len=512)
    return dict(value)
