"""Structured outputs on the wire: the output formats and OpenAI's strict schema subset.

- `TextFormat`: Responses ``text.format`` / chat ``response_format``: ``text``,
  ``json_schema`` (name, description, schema, strict) or ``json_object``.
  `decode_text_format` checks one (with the param prefix of where it sits) and
  `TextFormat.to_wire` echoes it as it was sent, in the Responses shape.
- `check_strict_schema`: a schema sent with ``strict: true`` (a format or a function
  tool's parameters) must lie in OpenAI's strict subset: the root an object, every
  object ``additionalProperties: false`` with every property required, and none of the
  keywords OpenAI's structured outputs do not support. A violation is a 400 whose
  message names the function or format and the keyword, and where in the schema, as
  OpenAI words it ("In context=('properties', 'x'), 'minLength' is not permitted.").

Whether the engine can compile a schema (a grammar llguidance rejects) is checked by
the server, which owns the grammar engine; this module imports nothing of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from protocol.checks import (
    check_known_keys,
    check_object,
    opt_bool,
    opt_str,
    path,
    refuse_missing,
    req_name,
    require,
)
from protocol.errors import Refusal

__all__ = ["UNSUPPORTED_STRICT_KEYWORDS", "TextFormat", "check_strict_schema", "decode_text_format"]

# Keywords OpenAI's strict mode does not support (its structured-outputs guide). Other
# keys (title, description, $defs, $ref, anyOf, enum, const, pattern, format, bounds,
# minItems / maxItems, minLength / maxLength, ...) are accepted and enforced.
UNSUPPORTED_STRICT_KEYWORDS = frozenset({
    "allOf", "oneOf", "not", "if", "then", "else", "dependentRequired", "dependentSchemas",
    "patternProperties", "unevaluatedProperties", "propertyNames", "minProperties", "maxProperties",
    "unevaluatedItems", "contains", "minContains", "maxContains", "uniqueItems",
})
# Keys whose value is a map of name -> subschema, and those whose value is a subschema
# or a list of them.
_SCHEMA_MAPS = ("properties", "$defs", "definitions")
_SCHEMA_ONE = ("items", "additionalProperties")
_SCHEMA_LISTS = ("anyOf", "prefixItems")
_SCHEMA_FORMAT_KEYS = frozenset({"name", "schema", "description", "strict"})


@dataclass(frozen=True, slots=True)
class TextFormat:
    """One output format; `sent` remembers which optional fields the client set (echo)."""

    type: Literal["text", "json_schema", "json_object"] = "text"
    name: str | None = None
    schema: Mapping[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None

    @property
    def is_json(self) -> bool:
        return self.type != "text"

    def to_wire(self) -> dict[str, Any]:
        """Responses' shape (``text.format``), as OpenAI echoes it: every field, the ones
        not sent as null (``description``) or their default (``strict``: false)."""
        d: dict[str, Any] = {"type": self.type}
        if self.type == "json_schema":
            d["name"] = self.name
            d["schema"] = dict(self.schema or {})
            d["description"] = self.description
            d["strict"] = bool(self.strict)
        return d


def decode_text_format(fmt: Any, param: str, *, nested: str | None = None) -> TextFormat:
    """Check ``{"type": ...}`` at `param` (``text.format`` / ``response_format``). `nested`:
    chat puts json_schema's fields in a sub-object (``response_format.json_schema``);
    Responses has them flat (None)."""
    check_object(fmt, param)
    t = require(fmt, "type", param)
    if t not in ("text", "json_schema", "json_object"):
        raise Refusal(f"Invalid value: {t!r}. Supported values are: 'text', 'json_schema' and 'json_object'.",
                      param=path(param, "type"), code="invalid_value")
    allowed = {"type"}
    if t == "json_schema":
        allowed |= {nested} if nested else _SCHEMA_FORMAT_KEYS
    check_known_keys(fmt, param, allowed)
    if t != "json_schema":
        return TextFormat(t)
    if not nested:
        return _json_schema(fmt, param, schema_required=True)
    where = path(param, nested)
    obj = check_object(require(fmt, nested, param), where)
    check_known_keys(obj, where, _SCHEMA_FORMAT_KEYS)
    return _json_schema(obj, where, schema_required=False)


def _json_schema(obj: Mapping[str, Any], where: str, *, schema_required: bool) -> TextFormat:
    """The fields of a json_schema format. OpenAI's chat accepts a missing schema as any
    JSON (`schema_required` False); Responses demands one."""
    name = req_name(obj, "name", where)
    description = opt_str(obj, "description", where)
    strict = opt_bool(obj, "strict", where)
    sp = path(where, "schema")
    schema = obj.get("schema")
    if schema is None:
        if schema_required:
            refuse_missing(sp)
    else:
        check_object(schema, sp)
        if strict:
            check_strict_schema(schema, owner=f"response_format '{name}'", param=sp, code="invalid_json_schema")
    return TextFormat("json_schema", name, schema, description, strict)


def check_strict_schema(schema: Mapping[str, Any], *, owner: str, param: str, code: str) -> None:
    """Refuse (400 at `param`) a schema outside OpenAI's strict subset. `owner` names it in
    the message: ``function 'get_weather'`` or ``response_format 'answer'``."""

    def fail(context: tuple[str, ...], why: str) -> None:
        raise Refusal(f"Invalid schema for {owner}: In context={context!r}, {why}", param=param, code=code)

    if schema.get("type") != "object" or "anyOf" in schema:
        fail((), "the root schema must be an object ('type': 'object'), not anyOf or another type.")

    def walk(node: Any, context: tuple[str, ...]) -> None:
        if isinstance(node, bool):
            return
        if not isinstance(node, Mapping):
            fail(context, f"a schema must be an object, got {type(node).__name__}.")
            return
        for key in node:
            if key in UNSUPPORTED_STRICT_KEYWORDS:
                fail(context, f"'{key}' is not permitted.")
        types = node.get("type")
        is_object = types == "object" or (isinstance(types, list) and "object" in types) or "properties" in node
        if is_object:
            if node.get("additionalProperties") is not False:
                fail(context, "'additionalProperties' is required to be supplied and to be false.")
            props = node.get("properties") or {}
            if not isinstance(props, Mapping):
                fail(context, "'properties' must be an object.")
            required = node.get("required") or []
            if not isinstance(required, list):
                fail(context, "'required' must be an array of property names.")
            missing = [k for k in props if k not in required]
            if missing:
                fail(context, f"'required' is required to be supplied and to be an array including every key in "
                              f"properties. Missing '{missing[0]}'.")
        for key in _SCHEMA_MAPS:
            sub = node.get(key)
            if isinstance(sub, Mapping):
                for name, child in sub.items():
                    walk(child, (*context, key, name))
        for key in _SCHEMA_ONE:
            sub = node.get(key)
            if isinstance(sub, Mapping):
                walk(sub, (*context, key))
        for key in _SCHEMA_LISTS:
            sub = node.get(key)
            if isinstance(sub, list):
                for i, child in enumerate(sub):
                    walk(child, (*context, key, str(i)))

    walk(schema, ())
