"""Responses input items: JSON -> `protocol.items.Item`, or a `Refusal`.

`decode_input` reads a request's ``input`` (a string is one user message);
`decode_item` reads one item and is the inverse of ``item.to_dict()``.

- Items: ``message`` (also without ``type``, as OpenAI's EasyInputMessage),
  ``function_call`` (with its ``namespace``), ``function_call_output``,
  ``custom_tool_call``, ``custom_tool_call_output``, ``reasoning``, ``compaction`` (ours
  only: an ``encrypted_content`` ignis cannot read is refused, ``invalid_encrypted_content``,
  since the summary stands for the whole earlier conversation). The other item types
  OpenAI defines are refused as unsupported (``input[i].type``).
- Message parts: ``input_text`` and ``output_text`` are both accepted under any
  role (both are text to the model; OpenAI is stricter); image, file and audio
  parts are refused as unsupported (``input[i].content[j].type``).
- An ``encrypted_content`` that ignis cannot read (another server's, or a bad
  signature) leaves ``Reasoning.recovered_text`` None: the past reasoning is
  dropped, as most chat templates drop past reasoning anyway. ``strict_encrypted``
  refuses it instead (``invalid_encrypted_content``).
"""

from __future__ import annotations

from typing import Any, Mapping

from protocol.checks import (
    check_array,
    check_enum,
    check_known_keys,
    check_object,
    check_str,
    invalid_choice,
    opt_enum,
    opt_str,
    path,
    refuse_missing,
    refuse_type,
    req_str,
    require,
    unsupported_value,
)
from protocol.encrypted import open_compaction, open_reasoning
from protocol.errors import Refusal
from protocol.items import (
    ITEM_STATUSES,
    ROLES,
    Compaction,
    FunctionCall,
    FunctionCallOutput,
    CustomToolCall,
    CustomToolCallOutput,
    InputText,
    Item,
    Message,
    OutputText,
    Reasoning,
    ReasoningText,
    SummaryText,
)

__all__ = ["decode_input", "decode_item", "ITEM_TYPES"]

ITEM_TYPES = (
    "message", "function_call", "function_call_output", "custom_tool_call", "custom_tool_call_output", "reasoning",
    "compaction",
)
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
        "compaction_trigger",
        "program",
        "program_output",
    }
)
_OPENAI_PART_TYPES = frozenset({"input_image", "input_file", "input_audio", "refusal"})

_TEXT_PART_KEYS = frozenset({"type", "text"})
_OUTPUT_TEXT_KEYS = frozenset({"type", "text", "annotations", "logprobs"})
_MESSAGE_KEYS = frozenset({"type", "role", "content", "id", "status", "phase"})
_CALL_KEYS = frozenset({"type", "call_id", "name", "arguments", "id", "status", "namespace"})
_CALL_NULL_ONLY = frozenset({"caller", "async"})
_CUSTOM_CALL_KEYS = frozenset({"type", "call_id", "name", "input", "id", "namespace"})
_CUSTOM_OUTPUT_KEYS = frozenset({"type", "call_id", "output", "id"})
_CALL_OUTPUT_KEYS = frozenset({"type", "call_id", "output", "id", "status", "name"})
_CALL_OUTPUT_NULL_ONLY = frozenset({"namespace", "caller"})
_REASONING_KEYS = frozenset({"type", "id", "summary", "content", "encrypted_content", "status"})
_COMPACTION_KEYS = frozenset({"type", "id", "encrypted_content", "created_by"})


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
    if t == "custom_tool_call":
        return _custom_tool_call(obj, param)
    if t == "custom_tool_call_output":
        check_known_keys(obj, param, _CUSTOM_OUTPUT_KEYS, _CALL_NULL_ONLY)
        output = _text_or_parts(obj, "output", param, outputs=False)
        return CustomToolCallOutput(req_str(obj, "call_id", param), output, opt_str(obj, "id", param))
    if t == "reasoning":
        return _reasoning(obj, param, reasoning_key, strict_encrypted)
    if t == "compaction":
        return _compaction(obj, param, reasoning_key)
    if t in _OPENAI_ITEM_TYPES:
        raise unsupported_value(tparam, t, "input items (supported: " + ", ".join(ITEM_TYPES) + ")")
    raise invalid_choice(tparam, t, ITEM_TYPES)


def _status(obj: Mapping[str, Any], param: str) -> Any:
    return opt_enum(obj, "status", param, ITEM_STATUSES)


def _message(obj: Mapping[str, Any], param: str) -> Message:
    check_known_keys(obj, param, _MESSAGE_KEYS)
    role = check_enum(require(obj, "role", param), path(param, "role"), ROLES)
    content = _text_or_parts(obj, "content", param, outputs=True)
    phase = opt_enum(obj, "phase", param, ("commentary", "final_answer"))
    return Message(role, content, opt_str(obj, "id", param), _status(obj, param), phase)


def _function_call(obj: Mapping[str, Any], param: str) -> FunctionCall:
    check_known_keys(obj, param, _CALL_KEYS, _CALL_NULL_ONLY)
    return FunctionCall(
        call_id=req_str(obj, "call_id", param),
        name=req_str(obj, "name", param),
        arguments=req_str(obj, "arguments", param),
        id=opt_str(obj, "id", param),
        status=_status(obj, param),
        namespace=opt_str(obj, "namespace", param),
    )


def _custom_tool_call(obj: Mapping[str, Any], param: str) -> CustomToolCall:
    check_known_keys(obj, param, _CUSTOM_CALL_KEYS, _CALL_NULL_ONLY | {"status"})
    return CustomToolCall(
        call_id=req_str(obj, "call_id", param),
        name=req_str(obj, "name", param),
        input=req_str(obj, "input", param),
        id=opt_str(obj, "id", param),
        namespace=opt_str(obj, "namespace", param),
    )


def _function_call_output(obj: Mapping[str, Any], param: str) -> FunctionCallOutput:
    check_known_keys(obj, param, _CALL_OUTPUT_KEYS, _CALL_OUTPUT_NULL_ONLY)
    call_id = req_str(obj, "call_id", param)
    output = _text_or_parts(obj, "output", param, outputs=False)
    return FunctionCallOutput(
        call_id, output, opt_str(obj, "id", param), _status(obj, param), opt_str(obj, "name", param)
    )


def _text_or_parts(obj: Mapping[str, Any], key: str, param: str, *, outputs: bool) -> str | tuple:
    """A message's ``content`` or a call output's ``output``: a string or a list of text
    parts (`outputs`: ``output_text`` parts are allowed too)."""
    value = require(obj, key, param)
    where = path(param, key)
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        refuse_type(where, "string", value)
    return tuple(_text_part(p, path(where, j), outputs=outputs) for j, p in enumerate(value))


def _text_part(obj: Any, param: str, *, outputs: bool) -> InputText | OutputText:
    check_object(obj, param)
    t = req_str(obj, "type", param)
    if t == "input_text":
        check_known_keys(obj, param, _TEXT_PART_KEYS)
        return InputText(req_str(obj, "text", param))
    if t == "output_text" and outputs:
        check_known_keys(obj, param, _OUTPUT_TEXT_KEYS)
        text = req_str(obj, "text", param)
        annotations = _objects(obj, "annotations", param) or ()
        return OutputText(text, annotations, _objects(obj, "logprobs", param))
    if t in _OPENAI_PART_TYPES or t == "output_text":
        raise unsupported_value(path(param, "type"), t, "content parts (only text parts are)")
    raise invalid_choice(path(param, "type"), t, ("input_text", "output_text") if outputs else ("input_text",))


def _objects(obj: Mapping[str, Any], key: str, param: str) -> tuple[Any, ...] | None:
    """obj[key]: an array of objects, kept verbatim (None when absent or null)."""
    value = obj.get(key)
    if value is None:
        return None
    where = path(param, key)
    out = tuple(check_array(value, where))
    for i, entry in enumerate(out):
        check_object(entry, path(where, i))
    return out


def _typed_texts(value: Any, param: str, kind: str, cls: type) -> tuple:
    """A reasoning item's ``summary`` / ``content``: an array of `kind` text parts."""
    out = []
    for j, part in enumerate(check_array(value, param)):
        where = path(param, j)
        check_object(part, where)
        check_known_keys(part, where, _TEXT_PART_KEYS)
        t = req_str(part, "type", where)
        if t != kind:
            raise invalid_choice(path(where, "type"), t, (kind,))
        out.append(cls(req_str(part, "text", where)))
    return tuple(out)


def _reasoning(
    obj: Mapping[str, Any], param: str, reasoning_key: bytes | None, strict_encrypted: bool
) -> Reasoning:
    check_known_keys(obj, param, _REASONING_KEYS)
    rid = req_str(obj, "id", param)
    summary = _typed_texts(require(obj, "summary", param), path(param, "summary"), "summary_text", SummaryText)
    content = obj.get("content")
    if content is not None:
        content = _typed_texts(content, path(param, "content"), "reasoning_text", ReasoningText)
    sealed = opt_str(obj, "encrypted_content", param)
    recovered = None
    if sealed is not None:
        recovered = open_reasoning(sealed, reasoning_key)
        if recovered is None and strict_encrypted:
            raise Refusal(
                "The encrypted content of this reasoning item could not be verified.",
                param=path(param, "encrypted_content"),
                code="invalid_encrypted_content",
            )
    return Reasoning(rid, summary, content, sealed, _status(obj, param), recovered)


def _compaction(obj: Mapping[str, Any], param: str, key: bytes | None) -> Compaction:
    check_known_keys(obj, param, _COMPACTION_KEYS)
    opt_str(obj, "created_by", param)
    sealed = req_str(obj, "encrypted_content", param)
    summary = open_compaction(sealed, key)
    if summary is None:
        raise Refusal(
            "The encrypted content of this compaction item could not be read: only compaction items this "
            "server made (POST /v1/responses/compact) can be sent back.",
            param=path(param, "encrypted_content"),
            code="invalid_encrypted_content",
        )
    return Compaction(sealed, opt_str(obj, "id", param), summary)
