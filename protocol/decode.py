"""Decode Responses API requests: JSON -> `ResponsesRequest`, or a `Refusal`.

Entry points the server calls:

- `decode_json(raw)`: bytes/str -> a JSON object (dict), or Refusal ``invalid_json``.
- `decode_request(body, transport="http" | "socket", ...)`: dict -> `ResponsesRequest`.
- `decode_item(obj, param)`: one input item -> `Item` (inverse of ``item.to_dict()``).

Every refusal is OpenAI's envelope with status 400 and ``param`` at the offending
value in OpenAI's notation (``input[3].content[0].text``, ``tools[1].parameters``).

Policy (what is accepted, ignored, refused):

- Accepted and acted on: model, input, instructions, tools (function only),
  tool_choice, parallel_tool_calls, max_output_tokens, temperature, top_p,
  top_logprobs, reasoning (effort -> thinking, see `protocol.sampling`; summary is
  echoed), text (format "text" only; verbosity echoed), stream, include,
  truncation, and ignis's extensions top_k, min_p, repetition_penalty,
  presence_penalty, frequency_penalty, seed, stop, thinking.
- Accepted, checked, changing nothing: store, metadata, user, prompt_cache_key,
  service_tier, safety_identifier, client_metadata, prompt_cache_retention,
  stream_options (include_obfuscation: ignis sends no obfuscation padding),
  ``background: false``.
- `truncation`: "disabled" (default) and "auto" are both accepted and carried;
  the server decides what "auto" does when the input does not fit (drop the
  oldest items, as OpenAI does, or refuse as "disabled" would).
- `include`: "reasoning.encrypted_content" and "message.output_text.logprobs" act;
  the other values OpenAI knows (file_search_call.results, web_search_call.*,
  message.input_image.image_url, computer_call_output.output.image_url,
  code_interpreter_call.outputs) name outputs of tools ignis refuses, so they
  are accepted and change nothing; anything else is refused (invalid_value).
- Refused (400): unknown fields (``unknown_parameter``); fields OpenAI knows but
  ignis does not implement, when set (``unsupported_parameter``: conversation,
  prompt, max_tool_calls, context_management, moderation, image,
  access_programs, background_options, prompt_cache_options); ``background:
  true``; non-function tools (``tools[i].type``, ``unsupported_value``);
  ``text.format`` other than text (``text.format.type``); input items and
  content parts that are not text (``input[i].type``,
  ``input[i].content[j].type``); wrong types, out-of-range values, missing
  required fields (``missing_required_parameter``); ``previous_response_id``
  over HTTP (``previous_response_not_found``; the socket carries it).
- An ``encrypted_content`` that ignis cannot read (another server's, or a bad
  signature) leaves ``Reasoning.recovered_text`` None: the past reasoning is
  dropped, as most chat templates drop past reasoning anyway. Pass
  ``strict_encrypted=True`` to refuse it instead (``invalid_encrypted_content``).
- Message parts: ``input_text`` and ``output_text`` are both accepted under any
  role (both are text to the model; OpenAI is stricter).
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal, Mapping

from protocol.checks import (
    check_array,
    check_bool,
    check_enum,
    check_object,
    check_str,
    check_unicode,
    path,
    refuse_missing,
    refuse_type,
)
from protocol.encrypted import open_reasoning
from protocol.errors import Refusal
from protocol.items import (
    ITEM_STATUSES,
    ROLES,
    FunctionCall,
    FunctionCallOutput,
    InputText,
    Item,
    Message,
    OutputText,
    Reasoning,
    ReasoningText,
    SummaryText,
)
from protocol.request import (
    FunctionTool,
    ReasoningConfig,
    ResponsesRequest,
    TextConfig,
    ToolChoice,
)
from protocol.sampling import RESPONSES_NAMES, extract_sampling

__all__ = [
    "decode_json",
    "decode_request",
    "decode_input",
    "decode_item",
    "Transport",
    "KNOWN_INCLUDES",
    "ACTIVE_INCLUDES",
    "REQUEST_FIELDS",
]

Transport = Literal["http", "socket"]

# --- field tables -------------------------------------------------------------------

ACTIVE_INCLUDES = frozenset({"reasoning.encrypted_content", "message.output_text.logprobs"})
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

# Input item types OpenAI knows but ignis does not accept (unsupported, not invalid).
_OPENAI_ITEM_TYPES = frozenset(
    {
        "item_reference",
        "file_search_call",
        "computer_call",
        "computer_call_output",
        "web_search_call",
        "tool_search_call",
        "tool_search_output",
        "additional_tools",
        "image_generation_call",
        "code_interpreter_call",
        "local_shell_call",
        "local_shell_call_output",
        "shell_call",
        "shell_call_output",
        "apply_patch_call",
        "apply_patch_call_output",
        "mcp_list_tools",
        "mcp_approval_request",
        "mcp_approval_response",
        "mcp_call",
        "custom_tool_call",
        "custom_tool_call_output",
        "compaction",
        "compaction_trigger",
        "program",
        "program_output",
    }
)
_ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")
_OPENAI_PART_TYPES = frozenset({"input_image", "input_file", "input_audio", "refusal"})
_OPENAI_TOOL_TYPES = frozenset(
    {
        "file_search",
        "computer",
        "computer_use",
        "computer_use_preview",
        "web_search",
        "web_search_preview",
        "web_search_2025_08_26",
        "web_search_preview_2025_03_11",
        "mcp",
        "code_interpreter",
        "image_generation",
        "local_shell",
        "shell",
        "custom",
        "namespace",
        "tool_search",
        "apply_patch",
    }
)
_OPENAI_TOOL_CHOICE_TYPES = frozenset(
    {
        "file_search",
        "web_search_preview",
        "web_search_preview_2025_03_11",
        "computer",
        "computer_use",
        "computer_use_preview",
        "code_interpreter",
        "image_generation",
        "mcp",
        "custom",
        "apply_patch",
        "shell",
        "programmatic_tool_calling",
    }
)
_FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


# --- helpers ------------------------------------------------------------------------


def _known(
    obj: Mapping[str, Any], param: str, known: frozenset[str], null_only: frozenset[str] = frozenset()
) -> None:
    """Refuse unknown keys; keys in `null_only` (OpenAI fields ignis does not
    implement) pass when null and are refused (``unsupported_parameter``) when set."""
    for key in obj:
        if key not in known:
            p = path(param, key)
            if key in null_only:
                if obj[key] is None:
                    continue
                raise Refusal(f"Unsupported parameter: '{p}' is not supported by ignis.", param=p, code="unsupported_parameter")
            raise Refusal(f"Unknown parameter: '{p}'.", param=p, code="unknown_parameter")


def _unsupported_value(param: str, value: str, what: str) -> Refusal:
    return Refusal(
        f"Unsupported value: '{value}' is not supported by ignis for {what}.",
        param=param,
        code="unsupported_value",
    )


def _opt_str(obj: Mapping[str, Any], key: str, param: str) -> str | None:
    v = obj.get(key)
    return None if v is None else check_str(v, path(param, key))


def _req_str(obj: Mapping[str, Any], key: str, param: str) -> str:
    v = obj.get(key)
    if v is None:
        refuse_missing(path(param, key))
    return check_str(v, path(param, key))


def _opt_bool(obj: Mapping[str, Any], key: str, param: str = "") -> bool | None:
    v = obj.get(key)
    return None if v is None else check_bool(v, path(param, key))


def _status(obj: Mapping[str, Any], param: str) -> Any:
    v = obj.get("status")
    return None if v is None else check_enum(v, path(param, "status"), ITEM_STATUSES)


def _type_of(obj: Mapping[str, Any], param: str) -> str:
    t = obj.get("type")
    if t is None:
        refuse_missing(path(param, "type"))
    return check_str(t, path(param, "type"))


# --- JSON ---------------------------------------------------------------------------


def _bad_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def decode_json(raw: bytes | bytearray | memoryview | str) -> dict[str, Any]:
    """Parse a request body / text frame. Refuses (code ``invalid_json``) anything that
    is not a JSON object: bad UTF-8, bad JSON, NaN/Infinity, nesting too deep."""
    try:
        if not isinstance(raw, str):
            raw = bytes(raw).decode("utf-8")
        value = json.loads(raw, parse_constant=_bad_constant)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise Refusal(
            "We could not parse the JSON body of your request. The API expects a JSON "
            f"payload, but what was sent was not valid JSON ({type(exc).__name__}).",
            param=None,
            code="invalid_json",
        ) from None
    if not isinstance(value, dict):
        raise Refusal(
            "The request body must be a JSON object.", param=None, code="invalid_json"
        )
    check_unicode(value, raw)
    return value


# --- items --------------------------------------------------------------------------

_TEXT_PART_KEYS = frozenset({"type", "text"})
_OUTPUT_TEXT_KEYS = frozenset({"type", "text", "annotations", "logprobs"})
_MESSAGE_KEYS = frozenset({"type", "role", "content", "id", "status", "phase"})
_CALL_KEYS = frozenset({"type", "call_id", "name", "arguments", "id", "status"})
_CALL_NULL_ONLY = frozenset({"namespace", "caller", "async"})
_CALL_OUTPUT_KEYS = frozenset({"type", "call_id", "output", "id", "status", "name"})
_CALL_OUTPUT_NULL_ONLY = frozenset({"namespace", "caller"})
_REASONING_KEYS = frozenset({"type", "id", "summary", "content", "encrypted_content", "status"})


def _text_part(obj: Any, param: str, *, outputs: bool) -> InputText | OutputText:
    check_object(obj, param)
    t = _type_of(obj, param)
    if t == "input_text":
        _known(obj, param, _TEXT_PART_KEYS)
        return InputText(_req_str(obj, "text", param))
    if t == "output_text" and outputs:
        _known(obj, param, _OUTPUT_TEXT_KEYS)
        text = _req_str(obj, "text", param)
        ann = obj.get("annotations")
        annotations = () if ann is None else tuple(check_array(ann, path(param, "annotations")))
        for i, a in enumerate(annotations):
            check_object(a, path(path(param, "annotations"), i))
        lp = obj.get("logprobs")
        logprobs = None if lp is None else tuple(check_array(lp, path(param, "logprobs")))
        for i, a in enumerate(logprobs or ()):
            check_object(a, path(path(param, "logprobs"), i))
        return OutputText(text, annotations, logprobs)
    allowed = ("input_text", "output_text") if outputs else ("input_text",)
    if t in _OPENAI_PART_TYPES or t == "output_text":
        raise _unsupported_value(path(param, "type"), t, "content parts (only text parts are)")
    raise Refusal(
        f"Invalid value: '{t}'. Supported values are: {', '.join(repr(a) for a in allowed)}.",
        param=path(param, "type"),
        code="invalid_value",
    )


def _message(obj: Mapping[str, Any], param: str) -> Message:
    _known(obj, param, _MESSAGE_KEYS)
    role = obj.get("role")
    if role is None:
        refuse_missing(path(param, "role"))
    role = check_enum(role, path(param, "role"), ROLES)
    content = obj.get("content")
    cparam = path(param, "content")
    if content is None:
        refuse_missing(cparam)
    if isinstance(content, str):
        parts: str | tuple = content
    elif isinstance(content, list):
        parts = tuple(_text_part(p, path(cparam, j), outputs=True) for j, p in enumerate(content))
    else:
        refuse_type(cparam, "string", content)
    phase = obj.get("phase")
    if phase is not None:
        phase = check_enum(phase, path(param, "phase"), ("commentary", "final_answer"))
    return Message(role, parts, _opt_str(obj, "id", param), _status(obj, param), phase)


def _function_call(obj: Mapping[str, Any], param: str) -> FunctionCall:
    _known(obj, param, _CALL_KEYS, _CALL_NULL_ONLY)
    return FunctionCall(
        call_id=_req_str(obj, "call_id", param),
        name=_req_str(obj, "name", param),
        arguments=_req_str(obj, "arguments", param),
        id=_opt_str(obj, "id", param),
        status=_status(obj, param),
    )


def _function_call_output(obj: Mapping[str, Any], param: str) -> FunctionCallOutput:
    _known(obj, param, _CALL_OUTPUT_KEYS, _CALL_OUTPUT_NULL_ONLY)
    call_id = _req_str(obj, "call_id", param)
    out = obj.get("output")
    oparam = path(param, "output")
    if out is None:
        refuse_missing(oparam)
    if isinstance(out, str):
        output: str | tuple = out
    elif isinstance(out, list):
        output = tuple(_text_part(p, path(oparam, j), outputs=False) for j, p in enumerate(out))
    else:
        refuse_type(oparam, "string", out)
    return FunctionCallOutput(
        call_id, output, _opt_str(obj, "id", param), _status(obj, param), _opt_str(obj, "name", param)
    )


def _typed_texts(value: Any, param: str, kind: str, cls: type) -> tuple:
    out = []
    for j, p in enumerate(check_array(value, param)):
        pp = path(param, j)
        check_object(p, pp)
        _known(p, pp, _TEXT_PART_KEYS)
        t = _type_of(p, pp)
        if t != kind:
            raise Refusal(
                f"Invalid value: '{t}'. Supported values are: '{kind}'.",
                param=path(pp, "type"),
                code="invalid_value",
            )
        out.append(cls(_req_str(p, "text", pp)))
    return tuple(out)


def _reasoning(
    obj: Mapping[str, Any], param: str, reasoning_key: bytes | None, strict_encrypted: bool
) -> Reasoning:
    _known(obj, param, _REASONING_KEYS)
    rid = _req_str(obj, "id", param)
    summary = obj.get("summary")
    if summary is None:
        refuse_missing(path(param, "summary"))
    summary_t = _typed_texts(summary, path(param, "summary"), "summary_text", SummaryText)
    content = obj.get("content")
    content_t = None if content is None else _typed_texts(content, path(param, "content"), "reasoning_text", ReasoningText)
    enc = _opt_str(obj, "encrypted_content", param)
    recovered = None
    if enc is not None:
        recovered = open_reasoning(enc, reasoning_key)
        if recovered is None and strict_encrypted:
            raise Refusal(
                "The encrypted content of this reasoning item could not be verified.",
                param=path(param, "encrypted_content"),
                code="invalid_encrypted_content",
            )
    return Reasoning(rid, summary_t, content_t, enc, _status(obj, param), recovered)


def decode_item(
    obj: Any,
    param: str = "input[0]",
    *,
    reasoning_key: bytes | None = None,
    strict_encrypted: bool = False,
) -> Item:
    """One input item (a dict) -> `Item`; `param` is its path for refusals."""
    check_object(obj, param)
    t = obj.get("type")
    if t is None:
        if "role" in obj:  # EasyInputMessage: {"role", "content"} without "type"
            return _message(obj, param)
        refuse_missing(path(param, "type"))
    tparam = path(param, "type")
    check_str(t, tparam)
    if t == "message":
        return _message(obj, param)
    if t == "function_call":
        return _function_call(obj, param)
    if t == "function_call_output":
        return _function_call_output(obj, param)
    if t == "reasoning":
        return _reasoning(obj, param, reasoning_key, strict_encrypted)
    if t in _OPENAI_ITEM_TYPES:
        raise _unsupported_value(tparam, t, "input items (supported: " + ", ".join(_ITEM_TYPES) + ")")
    raise Refusal(
        f"Invalid value: '{t}'. Supported values are: {', '.join(repr(a) for a in _ITEM_TYPES)}.",
        param=tparam,
        code="invalid_value",
    )


def decode_input(
    value: Any,
    param: str = "input",
    *,
    reasoning_key: bytes | None = None,
    strict_encrypted: bool = False,
) -> tuple[Item, ...]:
    """`input`: a string (one user message) or a list of items."""
    if isinstance(value, str):
        return (Message("user", value),)
    check_array(value, param) if isinstance(value, list) else refuse_type(param, "string", value)
    return tuple(
        decode_item(v, path(param, i), reasoning_key=reasoning_key, strict_encrypted=strict_encrypted)
        for i, v in enumerate(value)
    )


# --- tools --------------------------------------------------------------------------

_TOOL_KEYS = frozenset({"type", "name", "description", "parameters", "strict"})
# Known to OpenAI on function tools; refused when set.
_TOOL_UNSUPPORTED = frozenset({"defer_loading", "allowed_callers", "async", "output_schema"})


def _function_name(obj: Mapping[str, Any], param: str) -> str:
    name = _req_str(obj, "name", param)
    if not _FUNCTION_NAME.fullmatch(name):
        raise Refusal(
            f"Invalid '{path(param, 'name')}': string does not match pattern. Expected a string "
            "that matches the pattern '^[a-zA-Z0-9_-]{1,64}$'.",
            param=path(param, "name"),
            code="invalid_value",
        )
    return name


def _tool(obj: Any, param: str) -> FunctionTool:
    check_object(obj, param)
    t = _type_of(obj, param)
    if t != "function":
        if t in _OPENAI_TOOL_TYPES:
            raise Refusal(
                f"Unsupported value: '{t}' tools are not supported by ignis; only 'function' tools are.",
                param=path(param, "type"),
                code="unsupported_value",
            )
        raise Refusal(
            f"Invalid value: '{t}'. Supported values are: 'function'.",
            param=path(param, "type"),
            code="invalid_value",
        )
    for key in obj:
        if key in _TOOL_UNSUPPORTED and obj[key] not in (None, False):
            p = path(param, key)
            raise Refusal(f"Unsupported parameter: '{p}' is not supported by ignis.", param=p, code="unsupported_parameter")
        if key not in _TOOL_KEYS and key not in _TOOL_UNSUPPORTED:
            p = path(param, key)
            raise Refusal(f"Unknown parameter: '{p}'.", param=p, code="unknown_parameter")
    name = _function_name(obj, param)
    description = _opt_str(obj, "description", param)
    params = obj.get("parameters")
    pparam = path(param, "parameters")
    if params is not None:
        check_object(params, pparam)
        ptype = params.get("type")
        if ptype is not None and ptype != "object":
            raise Refusal(
                f"Invalid schema for function '{name}': schema must be a JSON Schema of 'type: \"object\"', got 'type: {json.dumps(ptype)}'.",
                param=pparam,
                code="invalid_function_parameters",
            )
        props = params.get("properties")
        if props is not None:
            check_object(props, path(pparam, "properties"))
    strict = _opt_bool(obj, "strict", param)
    return FunctionTool(name, params, description, strict)


def _tools(value: Any) -> tuple[FunctionTool, ...]:
    tools = tuple(_tool(t, path("tools", i)) for i, t in enumerate(check_array(value, "tools")))
    seen: set[str] = set()
    for i, t in enumerate(tools):
        if t.name in seen:
            raise Refusal(
                f"Invalid 'tools[{i}].name': duplicate function name '{t.name}'.",
                param=f"tools[{i}].name",
                code="invalid_value",
            )
        seen.add(t.name)
    return tools


def _tool_choice(value: Any, names: tuple[str, ...]) -> ToolChoice:
    param = "tool_choice"
    if isinstance(value, str):
        mode = check_enum(value, param, ("auto", "none", "required"))
        if mode == "required" and not names:
            raise Refusal(
                "Tool choice 'required' must be specified with 'tools' parameter.",
                param=param,
                code="invalid_value",
            )
        return ToolChoice(mode)
    check_object(value, param)
    t = _type_of(value, param)
    if t == "function":
        _known(value, param, frozenset({"type", "name"}))
        name = _req_str(value, "name", param)
        if name not in names:
            raise Refusal(
                f"Tool choice 'function' with name '{name}' not found in 'tools' parameter.",
                param=path(param, "name"),
                code="invalid_value",
            )
        return ToolChoice("required", (name,), "function")
    if t == "allowed_tools":
        _known(value, param, frozenset({"type", "mode", "tools"}))
        mode = value.get("mode")
        if mode is None:
            refuse_missing(path(param, "mode"))
        mode = check_enum(mode, path(param, "mode"), ("auto", "required"))
        tl = value.get("tools")
        if tl is None:
            refuse_missing(path(param, "tools"))
        allowed = []
        for i, entry in enumerate(check_array(tl, path(param, "tools"))):
            ep = f"{param}.tools[{i}]"
            check_object(entry, ep)
            et = _type_of(entry, ep)
            if et != "function":
                raise _unsupported_value(path(ep, "type"), et, "allowed tools (only 'function' is)")
            _known(entry, ep, frozenset({"type", "name"}))
            name = _req_str(entry, "name", ep)
            if name not in names:
                raise Refusal(
                    f"Tool '{name}' in 'tool_choice.tools' not found in 'tools' parameter.",
                    param=path(ep, "name"),
                    code="invalid_value",
                )
            allowed.append(name)
        if mode == "required" and not allowed:
            raise Refusal(
                "Tool choice 'required' needs at least one allowed tool.",
                param=path(param, "tools"),
                code="invalid_value",
            )
        return ToolChoice(mode, tuple(allowed), "allowed_tools")
    if t in _OPENAI_TOOL_CHOICE_TYPES:
        raise _unsupported_value(path(param, "type"), t, "tool_choice (only 'function' and 'allowed_tools' are)")
    raise Refusal(
        f"Invalid value: '{t}'. Supported values are: 'function', 'allowed_tools'.",
        param=path(param, "type"),
        code="invalid_value",
    )


# --- other request fields -----------------------------------------------------------


def _reasoning_config(value: Any) -> ReasoningConfig:
    param = "reasoning"
    check_object(value, param)
    _known(value, param, frozenset({"effort", "summary", "generate_summary", "context", "mode"}))
    effort = value.get("effort")  # range-checked by extract_sampling
    summary = value.get("summary")
    if summary is not None:
        summary = check_enum(summary, "reasoning.summary", SUMMARIES)
    gen = value.get("generate_summary")  # deprecated alias of summary
    if gen is not None:
        gen = check_enum(gen, "reasoning.generate_summary", SUMMARIES)
        summary = summary or gen
    ctx = value.get("context")
    if ctx is not None and check_str(ctx, "reasoning.context") != "auto":
        raise _unsupported_value("reasoning.context", ctx, "reasoning.context (only 'auto' is)")
    mode = value.get("mode")
    if mode is not None and check_str(mode, "reasoning.mode") != "standard":
        raise _unsupported_value("reasoning.mode", mode, "reasoning.mode (only 'standard' is)")
    return ReasoningConfig(effort if isinstance(effort, str) else None, summary)


def _text_config(value: Any) -> TextConfig:
    check_object(value, "text")
    _known(value, "text", frozenset({"format", "verbosity"}))
    fmt = value.get("format")
    if fmt is not None:
        check_object(fmt, "text.format")
        t = _type_of(fmt, "text.format")
        if t != "text":
            if t in ("json_schema", "json_object"):
                raise Refusal(
                    f"Unsupported value: text.format '{t}' is not supported by ignis; only 'text' is.",
                    param="text.format.type",
                    code="unsupported_value",
                )
            raise Refusal(
                f"Invalid value: '{t}'. Supported values are: 'text'.",
                param="text.format.type",
                code="invalid_value",
            )
        _known(fmt, "text.format", frozenset({"type"}))
    verbosity = value.get("verbosity")
    if verbosity is not None:
        verbosity = check_enum(verbosity, "text.verbosity", VERBOSITIES)
    return TextConfig(verbosity)


def _include(value: Any) -> tuple[str, ...]:
    out = []
    for i, v in enumerate(check_array(value, "include")):
        p = f"include[{i}]"
        check_str(v, p)
        if v not in KNOWN_INCLUDES:
            raise Refusal(
                f"Invalid value: '{v}'. Supported values are: "
                + ", ".join(repr(x) for x in sorted(KNOWN_INCLUDES))
                + ".",
                param=p,
                code="invalid_value",
            )
        if v not in out:
            out.append(v)
    return tuple(out)


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
    if not isinstance(body, Mapping):
        raise Refusal("The request body must be a JSON object.", param=None, code="invalid_json")
    for key in body:
        if key not in REQUEST_FIELDS and key not in extra_fields:
            p = path("", key)
            raise Refusal(f"Unknown parameter: '{p}'.", param=p, code="unknown_parameter")
    for key in UNSUPPORTED_FIELDS:
        if body.get(key) is not None:
            raise Refusal(
                f"Unsupported parameter: '{key}' is not supported by ignis.",
                param=key,
                code="unsupported_parameter",
            )

    model = body.get("model")
    if model is None:
        if default_model is None:
            refuse_missing("model")
        model = default_model
    else:
        check_str(model, "model", min_len=1)

    # `text` before the rest: an unsupported output format is the most telling refusal.
    text = TextConfig() if body.get("text") is None else _text_config(body["text"])

    if "input" not in body or body["input"] is None:
        refuse_missing("input")
    items = decode_input(body["input"], reasoning_key=reasoning_key, strict_encrypted=strict_encrypted)

    instructions = _opt_str(body, "instructions", "")
    tools = () if body.get("tools") is None else _tools(body["tools"])
    names = tuple(t.name for t in tools)
    tool_choice = ToolChoice() if body.get("tool_choice") is None else _tool_choice(body["tool_choice"], names)
    parallel = _opt_bool(body, "parallel_tool_calls")
    reasoning = None if body.get("reasoning") is None else _reasoning_config(body["reasoning"])
    stream = _opt_bool(body, "stream")
    include = () if body.get("include") is None else _include(body["include"])

    obfuscation = None
    so = body.get("stream_options")
    if so is not None:
        check_object(so, "stream_options")
        _known(so, "stream_options", frozenset({"include_obfuscation"}))
        obfuscation = _opt_bool(so, "include_obfuscation", "stream_options")

    truncation = body.get("truncation")
    truncation = "disabled" if truncation is None else check_enum(truncation, "truncation", ("auto", "disabled"))

    if _opt_bool(body, "background"):
        raise Refusal(
            "Background mode is not supported by ignis.", param="background", code="unsupported_value"
        )

    prev = _opt_str(body, "previous_response_id", "")
    if prev is not None:
        accept = (transport == "socket") if accept_previous_response_id is None else accept_previous_response_id
        if not accept:
            raise Refusal(
                f"Previous response with id '{prev}' not found: ignis stores no responses over HTTP. "
                "Send the whole conversation as `input` (or use the WebSocket mode, where a connection "
                "keeps the latest response of each stream).",
                param="previous_response_id",
                code="previous_response_not_found",
            )

    store = _opt_bool(body, "store")
    metadata = None if body.get("metadata") is None else _metadata(body["metadata"])
    user = _opt_str(body, "user", "")
    prompt_cache_key = _opt_str(body, "prompt_cache_key", "")
    service_tier = body.get("service_tier")
    if service_tier is not None:
        service_tier = check_enum(service_tier, "service_tier", SERVICE_TIERS)
    safety_identifier = _opt_str(body, "safety_identifier", "")
    retention = body.get("prompt_cache_retention")
    if retention is not None:
        retention = check_enum(retention, "prompt_cache_retention", ("in_memory", "24h"))
    client_metadata = body.get("client_metadata")
    if client_metadata is not None:
        check_object(client_metadata, "client_metadata")

    sampling = extract_sampling(body)

    return ResponsesRequest(
        model=model,
        input=items,
        instructions=instructions,
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=True if parallel is None else parallel,
        sampling=sampling,
        reasoning=reasoning,
        text=text,
        stream=bool(stream),
        include=include,
        include_obfuscation=obfuscation,
        truncation=truncation,
        previous_response_id=prev,
        store=store,
        metadata=metadata,
        user=user,
        prompt_cache_key=prompt_cache_key,
        service_tier=service_tier,
        safety_identifier=safety_identifier,
        prompt_cache_retention=retention,
        client_metadata=client_metadata,
    )
