"""`POST /v1/chat/completions`: request body -> `ChatRequest`, or a `Refusal`.

`decode_chat_request(body)` takes the parsed JSON (`protocol.checks.decode_json`
parses bytes and refuses bad JSON; `decode_chat_request_bytes` does both) and
returns a frozen `ChatRequest` whose ``messages`` are the internal conversation
(`protocol.conversation.ChatMessage`), the same list the Responses decoder
produces, so both endpoints render identical prompts. Every
mistake raises `protocol.errors.Refusal` (status 400, ``invalid_request_error``)
with ``param`` at the offending value in OpenAI's notation
(``messages[2].content[0].type``, ``tools[0].function.name``) and one of these codes:

=============================  ==============================================================
code                           when
=============================  ==============================================================
invalid_json                   the body is not JSON, or not a JSON object (param null)
missing_required_parameter     ``model``, ``messages``, a message's ``role``/``content``, ...
unknown_parameter              a key OpenAI does not define (top level, message, part, tool)
invalid_type                   a value of the wrong JSON type
invalid_value                  a value outside its enum or pattern; conversation-order errors
empty_array / empty_string     ``messages: []``, ``content: []``, ``model: ""``, ...
unsupported_value              a defined value ignis cannot honour: ``n`` > 1, image/audio/file
                               parts, non-function tools, non-empty ``logit_bias``, ``modalities: ["audio"]``,
                               the ``function`` role, ``allowed_tools``/custom tool choice
unsupported_parameter          a defined parameter ignis cannot honour when not null:
                               ``audio``, ``prediction``, ``web_search_options``,
                               ``moderation``, ``functions``, ``function_call``
(sampling codes)               from `protocol.sampling.extract_sampling`: ranges of
                               temperature, top_p, penalties, stop, max tokens, ...
=============================  ==============================================================

Accepted and ignored: ``user``, ``store``, ``metadata``, ``service_tier``,
``prompt_cache_key``, ``prompt_cache_retention``, ``prompt_cache_options``,
``safety_identifier``, ``verbosity``, ``stream_options.include_obfuscation``,
``logit_bias: {}``, ``modalities: ["text"]``,
``parallel_tool_calls`` (kept on the request for the engine), ``annotations`` on
an assistant message, ``name`` on any message.

ignis extensions: ``top_k``, ``min_p``, ``repetition_penalty``, ``thinking``
(see `protocol.sampling`), and on assistant messages ``reasoning_content`` (the
thinking text of that turn, as ignis streams it back; ``reasoning`` is read as an
alias, as some clients name it).

Pure stdlib: no ignis, sanic, torch or asyncio.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from protocol.checks import (
    a_type,
    check_array,
    check_body,
    check_enum,
    check_int,
    check_known_keys,
    check_object,
    check_str,
    decode_json,
    invalid_json,
    opt_bool,
    opt_enum,
    opt_str,
    path,
    refuse_missing,
    refuse_unsupported_parameter,
    req_str,
    require,
)
from protocol.conversation import (
    ChatMessage,
    FunctionTool,
    ToolCall,
    ToolChoice,
    join_text,
)
from protocol.errors import Refusal
from protocol.sampling import CHAT_NAMES, EFFORTS, SamplingFields, extract_sampling
from protocol.structured import TextFormat, check_strict_schema, decode_text_format

__all__ = [
    "ChatRequest",
    "decode_chat_request",
    "decode_chat_request_bytes",
    "TOP_LEVEL_KEYS",
    "TOOL_NAME_PATTERN",
]

# Every top-level key the decoder knows. Anything else: unknown_parameter.
_SAMPLING_KEYS = frozenset(CHAT_NAMES)  # temperature, top_p, top_k, ..., max_tokens, thinking
_OWN_KEYS = frozenset(
    {
        "model",
        "messages",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "n",
        "stream",
        "stream_options",
        "logprobs",
        "response_format",
        "reasoning_effort",
        "modalities",
        "logit_bias",
        # accepted and ignored
        "user",
        "store",
        "metadata",
        "service_tier",
        "prompt_cache_key",
        "prompt_cache_retention",
        "prompt_cache_options",
        "safety_identifier",
        "verbosity",
        # refused unless null
        "audio",
        "prediction",
        "web_search_options",
        "moderation",
        "functions",
        "function_call",
    }
)
TOP_LEVEL_KEYS: frozenset[str] = _SAMPLING_KEYS | _OWN_KEYS

_UNSUPPORTED_PARAMS: Mapping[str, str] = {
    "audio": "ignis produces text only.",
    "prediction": "ignis does not do predicted outputs.",
    "web_search_options": "ignis has no web search.",
    "moderation": "ignis does not moderate.",
    "functions": "Use 'tools' instead.",
    "function_call": "Use 'tool_choice' instead.",
}

# OpenAI's pattern for function names (and its 64-character limit).
TOOL_NAME_PATTERN = r"^[a-zA-Z0-9_-]+$"
_TOOL_NAME_RE = re.compile(r"[a-zA-Z0-9_-]+")
_TOOL_NAME_MAX = 64

_SERVICE_TIERS = ("auto", "default", "flex", "scale", "priority", "fast")
_MESSAGE_ROLES = ("system", "developer", "user", "assistant", "tool")
_MESSAGE_KEYS: Mapping[str, frozenset[str]] = {
    "system": frozenset({"role", "content", "name"}),
    "developer": frozenset({"role", "content", "name"}),
    "user": frozenset({"role", "content", "name"}),
    "assistant": frozenset(
        {
            "role",
            "content",
            "name",
            "tool_calls",
            "reasoning_content",
            "reasoning",
            "refusal",
            "annotations",
            "audio",
            "function_call",
        }
    ),
    "tool": frozenset({"role", "content", "tool_call_id", "name"}),
}
_UNSUPPORTED_PARTS = ("image_url", "input_audio", "file")


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A decoded chat-completions request.

    ``messages`` is the internal conversation (see `protocol.conversation`).
    ``sampling`` holds every sampling/thinking knob (None = default), including
    ``max_output_tokens`` (from ``max_completion_tokens`` or ``max_tokens``),
    ``stop``, ``seed`` and ``top_logprobs``; ``reasoning_effort`` is folded into
    ``sampling.thinking``/``thinking_budget``.
    ``logprobs``: return per-token logprobs of the answer text, with
    `top_logprobs` alternatives each.
    """

    model: str
    messages: tuple[ChatMessage, ...]
    sampling: SamplingFields = field(default_factory=SamplingFields)
    tools: tuple[FunctionTool, ...] = ()
    tool_choice: ToolChoice = field(default_factory=lambda: ToolChoice("none"))
    parallel_tool_calls: bool = True
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage
    logprobs: bool = False
    # accepted, not acted on; kept for logs
    user: str | None = None
    metadata: Mapping[str, str] | None = None
    prompt_cache_key: str | None = None
    service_tier: str | None = None
    # ``response_format``: text, or JSON that the engine's grammar enforces (protocol.structured)
    response_format: TextFormat = field(default_factory=TextFormat)

    @property
    def top_logprobs(self) -> int:
        """Alternatives per token when `logprobs` is on (0 when not asked)."""
        return self.sampling.top_logprobs or 0


# --------------------------------------------------------------------------- entry points


def decode_chat_request_bytes(raw: bytes | bytearray | memoryview | str) -> ChatRequest:
    """`protocol.checks.decode_json` then `decode_chat_request`."""
    return decode_chat_request(decode_json(raw))


def decode_chat_request(body: Any) -> ChatRequest:
    """Check a parsed chat-completions body and normalise it. Raises `Refusal`."""
    try:
        return _decode(body)
    except Refusal:
        raise
    except RecursionError:
        raise invalid_json("nested too deeply") from None


def _decode(body: Any) -> ChatRequest:
    check_body(body)
    check_known_keys(body, "", TOP_LEVEL_KEYS)
    for key, why in _UNSUPPORTED_PARAMS.items():
        if body.get(key) is not None:
            refuse_unsupported_parameter(key, why)
    # Checked in this order, so that the first mistake is the one refused.
    model = req_str(body, "model", min_len=1)
    messages = _decode_messages(body)
    tools = _decode_tools(body.get("tools"))
    tool_choice = _decode_tool_choice(body.get("tool_choice"), tools)
    parallel = opt_bool(body, "parallel_tool_calls")
    _check_n(body.get("n"))
    stream = bool(opt_bool(body, "stream"))
    include_usage = _decode_stream_options(body.get("stream_options"), stream)
    sampling = _decode_sampling(body)
    logprobs = _decode_logprobs(body, sampling)
    response_format = _decode_response_format(body.get("response_format"))
    _check_modalities(body.get("modalities"))
    _check_logit_bias(body.get("logit_bias"))
    return ChatRequest(
        model=model,
        messages=messages,
        sampling=sampling,
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=True if parallel is None else parallel,
        stream=stream,
        include_usage=include_usage,
        logprobs=logprobs,
        response_format=response_format,
        **_ignored_fields(body),
    )


# --------------------------------------------------------------------------- messages


def _decode_messages(body: Mapping[str, Any]) -> tuple[ChatMessage, ...]:
    raw = check_array(require(body, "messages", ""), "messages", nonempty=True)
    out: list[ChatMessage] = []
    # Tool calls of the latest assistant turn not yet answered: id -> name, and its index.
    pending: dict[str, str] = {}
    answered: set[str] = set()
    calls_at: int | None = None
    for i, item in enumerate(raw):
        p = path("messages", i)
        msg = _decode_message(item, p)
        if msg.role == "tool":
            if calls_at is None:
                raise Refusal(
                    f"Invalid parameter: messages with role 'tool' must be a response to a preceding message"
                    f" with 'tool_calls' ('{p}.role').",
                    param=path(p, "role"),
                    code="invalid_value",
                )
            name = pending.get(msg.tool_call_id or "")
            if name is None or msg.tool_call_id in answered:
                raise Refusal(
                    f"Invalid '{p}.tool_call_id': {msg.tool_call_id!r} does not answer a pending tool call of"
                    f" the assistant message at messages[{calls_at}].",
                    param=path(p, "tool_call_id"),
                    code="invalid_value",
                )
            answered.add(msg.tool_call_id or "")
            msg = ChatMessage("tool", msg.content, tool_call_id=msg.tool_call_id, name=name)
        else:
            _check_all_answered(pending, answered, calls_at)
            calls_at = None
            pending, answered = {}, set()
            if msg.tool_calls:
                calls_at = i
                pending = {c.id: c.name for c in msg.tool_calls}
        out.append(msg)
    _check_all_answered(pending, answered, calls_at)
    return tuple(out)


def _check_all_answered(pending: Mapping[str, str], answered: set[str], calls_at: int | None) -> None:
    missing = [cid for cid in pending if cid not in answered]
    if calls_at is not None and missing:
        p = path("messages", calls_at)
        raise Refusal(
            "An assistant message with 'tool_calls' must be followed by tool messages responding to each"
            f" 'tool_call_id'. The following tool_call_ids did not have response messages: {', '.join(missing)}",
            param=path(p, "role"),
            code="invalid_value",
        )


def _decode_message(item: Any, p: str) -> ChatMessage:
    obj = check_object(item, p)
    role = require(obj, "role", p)
    if role == "function":
        raise Refusal(
            f"Unsupported value: '{p}.role' does not support 'function'. Use 'tool' messages instead.",
            param=path(p, "role"),
            code="unsupported_value",
        )
    check_enum(role, path(p, "role"), _MESSAGE_ROLES)
    check_known_keys(obj, p, _MESSAGE_KEYS[role])
    name = opt_str(obj, "name", p)

    if role == "assistant":
        return _decode_assistant(obj, p, name)

    content = _decode_content(obj.get("content"), path(p, "content"), role)
    if content is None:
        refuse_missing(path(p, "content"))
    if role == "tool":
        return ChatMessage("tool", content, tool_call_id=req_str(obj, "tool_call_id", p))
    return ChatMessage(role, content, name=name)


def _decode_assistant(obj: Mapping[str, Any], p: str, name: str | None) -> ChatMessage:
    content = _decode_content(obj.get("content"), path(p, "content"), "assistant")
    refusal = opt_str(obj, "refusal", p)
    reasoning = opt_str(obj, "reasoning_content", p)
    alias = opt_str(obj, "reasoning", p)
    if reasoning is None:
        reasoning = alias
    for key in ("audio", "function_call"):
        if obj.get(key) is not None:
            raise Refusal(
                f"Unsupported value: '{p}.{key}' must be null with ignis.",
                param=path(p, key),
                code="unsupported_value",
            )
    if obj.get("annotations") is not None:
        check_array(obj["annotations"], path(p, "annotations"))
    calls = _decode_tool_calls(obj.get("tool_calls"), path(p, "tool_calls"))
    if refusal:
        content = (content or "") + refusal
    if content is None and not calls and reasoning is None:
        # OpenAI: content is required unless tool_calls is given.
        refuse_missing(path(p, "content"))
    return ChatMessage("assistant", content or "", reasoning=reasoning, tool_calls=calls, name=name)


def _decode_tool_calls(raw: Any, p: str) -> tuple[ToolCall, ...]:
    if raw is None:
        return ()
    calls: list[ToolCall] = []
    seen: set[str] = set()
    for j, entry in enumerate(check_array(raw, p)):
        call = _decode_tool_call(entry, path(p, j))
        if call.id in seen:
            raise Refusal(
                f"Invalid '{p}[{j}].id': duplicate tool call id {call.id!r}.",
                param=path(path(p, j), "id"),
                code="invalid_value",
            )
        seen.add(call.id)
        calls.append(call)
    return tuple(calls)


def _decode_tool_call(raw: Any, p: str) -> ToolCall:
    obj = _function_entry(raw, p, {"id", "type", "function"}, tail="; only 'function' tool calls")
    call_id = req_str(obj, "id", p, min_len=1)
    fn = _function_object(obj, p, {"name", "arguments"})
    fp = path(p, "function")
    return ToolCall(call_id, req_str(fn, "name", fp, min_len=1), req_str(fn, "arguments", fp))


def _decode_content(value: Any, p: str, role: str) -> str | None:
    """A message's content as one string; None when null/absent."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise Refusal(
            f"Invalid type for '{p}': expected one of a string or array of objects, but got"
            f" {a_type(value)} instead.",
            param=p,
            code="invalid_type",
        )
    check_array(value, p, nonempty=True)
    texts: list[str] = []
    allowed = ("text", "refusal") if role == "assistant" else ("text",)
    for j, part in enumerate(value):
        pp = path(p, j)
        obj, kind = _typed_object(part, pp, allowed, _UNSUPPORTED_PARTS, " (text only)")
        check_known_keys(obj, pp, {"type", kind})
        texts.append(req_str(obj, kind, pp))
    return join_text(texts)


# --------------------------------------------------------------------------- tools


def _typed_object(
    raw: Any, p: str, allowed: tuple[str, ...], refused: tuple[str, ...], tail: str
) -> tuple[Mapping[str, Any], str]:
    """An object and its ``type``, one of `allowed`: a type in `refused` is unsupported
    (`tail` ends the message), any other invalid."""
    obj = check_object(raw, p)
    kind = require(obj, "type", p)
    if kind in refused:
        raise Refusal(
            f"Unsupported value: '{p}.type' of '{kind}' is not supported by ignis{tail}.",
            param=path(p, "type"),
            code="unsupported_value",
        )
    check_enum(kind, path(p, "type"), allowed)
    return obj, kind


def _function_entry(
    raw: Any, p: str, keys: set[str], refused: tuple[str, ...] = ("custom",), tail: str = ""
) -> Mapping[str, Any]:
    """A ``{"type": "function", "function": {...}}`` object (a tool, a tool call, a
    named tool choice), checked up to its keys."""
    obj, _ = _typed_object(raw, p, ("function",), refused, tail)
    check_known_keys(obj, p, keys)
    return obj


def _function_object(obj: Mapping[str, Any], p: str, keys: set[str]) -> Mapping[str, Any]:
    """The entry's ``function`` object, with only `keys`."""
    where = path(p, "function")
    fn = check_object(require(obj, "function", p), where)
    check_known_keys(fn, where, keys)
    return fn


def _decode_tools(raw: Any) -> tuple[FunctionTool, ...]:
    if raw is None:
        return ()
    names: set[str] = set()
    return tuple(_decode_tool(item, path("tools", i), names) for i, item in enumerate(check_array(raw, "tools")))


def _decode_tool(item: Any, p: str, names: set[str]) -> FunctionTool:
    """One tool; `names` (the names so far) must not hold its name, and gets it."""
    obj = _function_entry(item, p, {"type", "function"}, tail="; only 'function' tools")
    fn = _function_object(obj, p, {"name", "description", "parameters", "strict"})
    fp = path(p, "function")
    np = path(fp, "name")
    name = req_str(fn, "name", fp, min_len=1, max_len=_TOOL_NAME_MAX)
    if not _TOOL_NAME_RE.fullmatch(name):
        raise Refusal(
            f"Invalid '{np}': string does not match pattern. Expected a string that matches the pattern"
            f" '{TOOL_NAME_PATTERN}'.",
            param=np,
            code="invalid_value",
        )
    if name in names:
        raise Refusal(
            f"Invalid '{np}': duplicate function name {name!r}; tool names must be unique.",
            param=np,
            code="invalid_value",
        )
    names.add(name)
    description = opt_str(fn, "description", fp)
    parameters = fn.get("parameters")
    if parameters is not None:
        parameters = check_object(parameters, path(fp, "parameters"))
    strict = opt_bool(fn, "strict", fp)
    if strict and parameters is not None:
        check_strict_schema(parameters, owner=f"function '{name}'", param=path(fp, "parameters"),
                            code="invalid_function_parameters")
    return FunctionTool(name, description, parameters, strict)


def _decode_tool_choice(raw: Any, tools: tuple[FunctionTool, ...]) -> ToolChoice:
    if raw is None:
        return ToolChoice("auto" if tools else "none")
    if isinstance(raw, str):
        choice = ToolChoice(check_enum(raw, "tool_choice", ("none", "auto", "required")))
    elif isinstance(raw, Mapping):
        choice = _named_tool_choice(raw, tools)
    else:
        raise Refusal(
            f"Invalid type for 'tool_choice': expected one of a string or an object, but got"
            f" {a_type(raw)} instead.",
            param="tool_choice",
            code="invalid_type",
        )
    if not tools and choice.mode == "required":
        raise Refusal(
            "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.",
            param="tool_choice",
            code="invalid_value",
        )
    return choice


def _named_tool_choice(raw: Mapping[str, Any], tools: tuple[FunctionTool, ...]) -> ToolChoice:
    """``{"type": "function", "function": {"name": N}}``: N must be called."""
    obj = _function_entry(raw, "tool_choice", {"type", "function"}, refused=("allowed_tools", "custom"))
    fn = _function_object(obj, "tool_choice", {"name"})
    name = req_str(fn, "name", "tool_choice.function", min_len=1)
    if tools and name not in {t.name for t in tools}:
        raise Refusal(
            f"Invalid value for 'tool_choice.function.name': no function named {name!r} in 'tools'.",
            param="tool_choice.function.name",
            code="invalid_value",
        )
    return ToolChoice("required", name)


# --------------------------------------------------------------------------- the rest


def _check_n(raw: Any) -> None:
    if raw is not None and check_int(raw, "n", ge=1) > 1:
        raise Refusal(
            f"Unsupported value: 'n' must be 1 with ignis (one choice per request), got {raw}.",
            param="n",
            code="unsupported_value",
        )


def _decode_stream_options(raw: Any, stream: bool) -> bool:
    if raw is None:
        return False
    obj = check_object(raw, "stream_options")
    if not stream:
        raise Refusal(
            "Invalid value for 'stream_options': 'stream_options' is only allowed when 'stream' is true.",
            param="stream_options",
            code="invalid_value",
        )
    check_known_keys(obj, "stream_options", {"include_usage", "include_obfuscation"})
    opt_bool(obj, "include_obfuscation", "stream_options")
    return bool(opt_bool(obj, "include_usage", "stream_options"))


def _decode_sampling(body: Mapping[str, Any]) -> SamplingFields:
    # reasoning_effort first: `extract_sampling` checks it only after the other fields.
    opt_enum(body, "reasoning_effort", "", EFFORTS)
    return extract_sampling(body, names=CHAT_NAMES, effort_param="reasoning_effort")


def _decode_logprobs(body: Mapping[str, Any], sampling: SamplingFields) -> bool:
    logprobs = bool(opt_bool(body, "logprobs"))
    if sampling.top_logprobs is not None and not logprobs:
        raise Refusal(
            "Invalid value for 'top_logprobs': 'logprobs' must be set to true when 'top_logprobs' is given.",
            param="top_logprobs",
            code="invalid_value",
        )
    return logprobs


def _decode_response_format(raw: Any) -> TextFormat:
    if raw is None:
        return TextFormat()
    return decode_text_format(raw, "response_format", nested="json_schema")


def _check_modalities(raw: Any) -> None:
    if raw is None:
        return
    for i, m in enumerate(check_array(raw, "modalities")):
        p = path("modalities", i)
        if m == "audio":
            raise Refusal(
                f"Unsupported value: '{p}' of 'audio' is not supported by ignis (text only).",
                param=p,
                code="unsupported_value",
            )
        check_enum(m, p, ("text",))


def _check_logit_bias(raw: Any) -> None:
    if raw is None:
        return
    if check_object(raw, "logit_bias"):
        # Refused rather than ignored: a caller who biases tokens expects it to happen.
        raise Refusal(
            "Unsupported value: 'logit_bias' is not supported by ignis; send null or {}.",
            param="logit_bias",
            code="unsupported_value",
        )


def _ignored_fields(body: Mapping[str, Any]) -> dict[str, Any]:
    """The fields accepted and ignored, checked all the same; some are kept for logs."""
    user = opt_str(body, "user")
    opt_str(body, "safety_identifier")
    prompt_cache_key = opt_str(body, "prompt_cache_key")
    opt_bool(body, "store")
    service_tier = opt_enum(body, "service_tier", "", _SERVICE_TIERS)
    opt_enum(body, "prompt_cache_retention", "", ("in_memory", "24h"))
    if body.get("prompt_cache_options") is not None:
        check_object(body["prompt_cache_options"], "prompt_cache_options")
    opt_enum(body, "verbosity", "", ("low", "medium", "high"))
    metadata = _decode_metadata(body.get("metadata"))
    return {"user": user, "prompt_cache_key": prompt_cache_key, "service_tier": service_tier, "metadata": metadata}


def _decode_metadata(raw: Any) -> Mapping[str, str] | None:
    if raw is None:
        return None
    obj = check_object(raw, "metadata")
    for key, value in obj.items():
        check_str(value, path("metadata", key))
    return dict(obj)
