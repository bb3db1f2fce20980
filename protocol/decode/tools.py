"""Responses ``tools`` and ``tool_choice``: JSON -> `FunctionTool`s and a `ToolChoice`.

Tools ignis runs the model for: ``function``, ``custom`` (freeform input, free text or
a ``lark`` / ``regex`` grammar; the server checks the grammar compiles) and
``namespace`` (function and custom tools under a shared name: flattened, each named
``NAMESPACE.NAME``). The hosted tool types OpenAI defines (web search, file search,
MCP, code interpreter, ...) are refused as unsupported (``tools[i].type``): ignis runs
no tools itself. A function tool with ``strict: true`` must have parameters in
OpenAI's strict subset (`protocol.structured.check_strict_schema`). Names are unique
(a namespaced tool's by its qualified name). ``tool_choice`` takes a mode string,
``{"type": "function" | "custom", "name"}`` or ``{"type": "allowed_tools", "mode",
"tools"}``; every name must be one of the request's tools.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from protocol.checks import (
    check_array,
    check_enum,
    check_known_keys,
    check_object,
    invalid_choice,
    opt_bool,
    opt_str,
    path,
    refuse_unknown_parameter,
    refuse_unsupported_parameter,
    req_name,
    req_str,
    require,
    unsupported_value,
)
from protocol.conversation import CustomFormat, FunctionTool, ToolChoice
from protocol.errors import Refusal
from protocol.structured import check_strict_schema

__all__ = ["decode_tools", "decode_tool_choice"]

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
        "apply_patch",
        "shell",
        "programmatic_tool_calling",
    }
)
_TOOL_KEYS = frozenset({"type", "name", "description", "parameters", "strict"})
# Known to OpenAI on function tools; refused when set (null and false pass).
_TOOL_UNSUPPORTED = frozenset({"defer_loading", "allowed_callers", "async", "output_schema"})
_CUSTOM_KEYS = frozenset({"type", "name", "description", "format"})
_CUSTOM_UNSUPPORTED = frozenset({"defer_loading", "allowed_callers", "async"})
_NAMESPACE_KEYS = frozenset({"type", "name", "description", "tools"})
_NAMED_KEYS = frozenset({"type", "name"})


# --- tools --------------------------------------------------------------------------


def decode_tools(value: Any) -> tuple[tuple[FunctionTool, ...], tuple[tuple[str, str], ...]]:
    """``tools`` (None: no tools) -> (the tools, a namespace's flattened into it; each
    namespace's (name, description)). Names (qualified) must be unique."""
    if value is None:
        return (), ()
    tools: list[FunctionTool] = []
    namespaces: list[tuple[str, str]] = []
    for i, obj in enumerate(check_array(value, "tools")):
        where = path("tools", i)
        check_object(obj, where)
        if obj.get("type") == "namespace":
            name, description, inner = _namespace(obj, where)
            namespaces.append((name, description))
            tools += inner
        else:
            tools.append(_tool(obj, where))
    seen: set[str] = set()
    for t in tools:
        if t.name in seen:
            raise Refusal(f"Invalid '{t.where}.name': duplicate tool name '{t.name}'.", param=f"{t.where}.name",
                          code="invalid_value")
        seen.add(t.name)
    return tuple(tools), tuple(namespaces)


def _namespace(obj: Mapping[str, Any], param: str) -> tuple[str, str, list[FunctionTool]]:
    check_known_keys(obj, param, _NAMESPACE_KEYS)
    name = req_name(obj, "name", param)
    description = req_str(obj, "description", param)
    inner = []
    for j, tool in enumerate(check_array(require(obj, "tools", param), path(param, "tools"))):
        where = path(path(param, "tools"), j)
        check_object(tool, where)
        kind = req_str(tool, "type", where)
        if kind not in ("function", "custom"):
            raise invalid_choice(path(where, "type"), kind, ("function", "custom"))
        inner.append(_tool(tool, where, namespace=name))
    return name, description, inner


def _tool(obj: Any, param: str, namespace: str | None = None) -> FunctionTool:
    check_object(obj, param)
    t = req_str(obj, "type", param)
    if t == "custom":
        return _custom(obj, param, namespace)
    if t != "function":
        if t in _OPENAI_TOOL_TYPES:
            raise Refusal(
                f"Unsupported value: '{t}' tools are not supported by ignis (it runs no hosted tools); "
                "'function', 'custom' and 'namespace' tools are.",
                param=path(param, "type"),
                code="unsupported_value",
            )
        raise invalid_choice(path(param, "type"), t, ("function", "custom", "namespace"))
    _check_tool_keys(obj, param)
    name = req_name(obj, "name", param)
    description = opt_str(obj, "description", param)
    parameters = _parameters(obj, param, name)
    strict = opt_bool(obj, "strict", param)
    if strict and parameters is not None:
        check_strict_schema(
            parameters, owner=f"function '{name}'", param=path(param, "parameters"), code="invalid_function_parameters"
        )
    return FunctionTool(_qualified(namespace, name), description, parameters, strict, namespace=namespace, where=param)


def _qualified(namespace: str | None, name: str) -> str:
    return name if namespace is None else f"{namespace}.{name}"


def _custom(obj: Mapping[str, Any], param: str, namespace: str | None) -> FunctionTool:
    check_known_keys(obj, param, _CUSTOM_KEYS, _CUSTOM_UNSUPPORTED)
    name = req_name(obj, "name", param)
    description = opt_str(obj, "description", param)
    fmt = CustomFormat()
    raw = obj.get("format")
    if raw is not None:
        where = path(param, "format")
        check_object(raw, where)
        kind = check_enum(require(raw, "type", where), path(where, "type"), ("text", "grammar"))
        if kind == "grammar":
            check_known_keys(raw, where, frozenset({"type", "syntax", "definition"}))
            syntax = check_enum(require(raw, "syntax", where), path(where, "syntax"), ("lark", "regex"))
            definition = req_str(raw, "definition", where)
            fmt = CustomFormat(syntax, definition)
        else:
            check_known_keys(raw, where, frozenset({"type"}))
    return FunctionTool(_qualified(namespace, name), description, namespace=namespace, format=fmt, where=param)


def _check_tool_keys(obj: Mapping[str, Any], param: str) -> None:
    """`check_known_keys`, but OpenAI's keys ignis lacks pass when false as well as null."""
    for key in obj:
        if key in _TOOL_UNSUPPORTED and obj[key] not in (None, False):
            refuse_unsupported_parameter(path(param, key))
        if key not in _TOOL_KEYS and key not in _TOOL_UNSUPPORTED:
            refuse_unknown_parameter(path(param, key))


def _parameters(obj: Mapping[str, Any], param: str, name: str) -> Mapping[str, Any] | None:
    """A function's ``parameters``: a JSON schema of an object (None when absent)."""
    params = obj.get("parameters")
    if params is None:
        return None
    where = path(param, "parameters")
    check_object(params, where)
    ptype = params.get("type")
    if ptype is not None and ptype != "object":
        raise Refusal(
            f"Invalid schema for function '{name}': schema must be a JSON Schema of 'type: \"object\"', got 'type: {json.dumps(ptype)}'.",
            param=where,
            code="invalid_function_parameters",
        )
    props = params.get("properties")
    if props is not None:
        check_object(props, path(where, "properties"))
    return params


# --- tool_choice --------------------------------------------------------------------

_CHOICE = "tool_choice"


def decode_tool_choice(value: Any, tools: tuple[FunctionTool, ...]) -> ToolChoice:
    """``tool_choice`` (None: auto) against the request's decoded `tools`."""
    if value is None:
        return ToolChoice()
    names = tuple(t.name for t in tools)
    if isinstance(value, str):
        return _mode(value, names)
    check_object(value, _CHOICE)
    t = req_str(value, "type", _CHOICE)
    if t in ("function", "custom"):
        return ToolChoice("required", _tool_name(value, _CHOICE, names, f"Tool choice '{t}' with name '{{}}'"), kind=t)
    if t == "allowed_tools":
        return _allowed_tools(value, names)
    if t in _OPENAI_TOOL_CHOICE_TYPES:
        raise unsupported_value(path(_CHOICE, "type"), t, "tool_choice (only 'function', 'custom' and 'allowed_tools' are)")
    raise invalid_choice(path(_CHOICE, "type"), t, ("function", "custom", "allowed_tools"))


def _mode(value: str, names: tuple[str, ...]) -> ToolChoice:
    mode = check_enum(value, _CHOICE, ("auto", "none", "required"))
    if mode == "required" and not names:
        raise Refusal(
            "Tool choice 'required' must be specified with 'tools' parameter.",
            param=_CHOICE,
            code="invalid_value",
        )
    return ToolChoice(mode)


def _allowed_tools(value: Mapping[str, Any], names: tuple[str, ...]) -> ToolChoice:
    check_known_keys(value, _CHOICE, frozenset({"type", "mode", "tools"}))
    mode = check_enum(require(value, "mode", _CHOICE), path(_CHOICE, "mode"), ("auto", "required"))
    where = path(_CHOICE, "tools")
    entries = check_array(require(value, "tools", _CHOICE), where)
    allowed = tuple(_allowed_entry(entry, path(where, i), names) for i, entry in enumerate(entries))
    if mode == "required" and not allowed:
        raise Refusal(
            "Tool choice 'required' needs at least one allowed tool.",
            param=where,
            code="invalid_value",
        )
    return ToolChoice(mode, allowed=allowed)


def _allowed_entry(entry: Any, param: str, names: tuple[str, ...]) -> str:
    check_object(entry, param)
    t = req_str(entry, "type", param)
    if t not in ("function", "custom"):
        raise unsupported_value(path(param, "type"), t, "allowed tools (only 'function' and 'custom' are)")
    return _tool_name(entry, param, names, "Tool '{}' in 'tool_choice.tools'")


def _tool_name(obj: Mapping[str, Any], param: str, names: tuple[str, ...], which: str) -> str:
    """``{"type": "function", "name": N}``: N, one of the request's tool `names`
    (`which` names it in the refusal, ``{}`` standing for N)."""
    check_known_keys(obj, param, _NAMED_KEYS)
    name = req_str(obj, "name", param)
    if name not in names:
        raise Refusal(
            f"{which.format(name)} not found in 'tools' parameter.",
            param=path(param, "name"),
            code="invalid_value",
        )
    return name
