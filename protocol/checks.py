"""Small value checks that raise OpenAI-shaped refusals.

Shared by the Responses decoders, `protocol.sampling` and the chat-completions
decoder. Every check takes the value and its param path (OpenAI's notation:
``input[3].content[0].text``) and either returns the value, normalised, or raises
`Refusal` with the path, a message worded as OpenAI words it, and a code.

Pure stdlib; hot enough (once per request field) to stay hand-written.
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping, NoReturn

from protocol.errors import Refusal

__all__ = [
    "path",
    "type_name",
    "refuse_type",
    "refuse_missing",
    "refuse_value",
    "check_bool",
    "check_int",
    "check_number",
    "check_str",
    "check_object",
    "check_array",
    "check_enum",
    "check_known_keys",
    "require",
    "check_unicode",
]

# A \\uD800-\\uDFFF escape in JSON text: the only way a parsed string gets a surrogate.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def path(prefix: str, key: str | int) -> str:
    """Join a param path: ``path("input", 3) == "input[3]"``, ``path("a", "b") == "a.b"``."""
    if isinstance(key, int):
        return f"{prefix}[{key}]"
    if not key:  # an empty key still needs a visible path
        return f'{prefix}[""]'
    return f"{prefix}.{key}" if prefix else key


def type_name(value: Any) -> str:
    """OpenAI's word for a JSON value's type."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "decimal number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__


_ARTICLE = {"integer": "an integer", "object": "an object", "array": "an array"}


def refuse_type(param: str, expected: str, value: Any) -> NoReturn:
    exp = _ARTICLE.get(expected, f"a {expected}")
    got = type_name(value)
    got = _ARTICLE.get(got, "null" if got == "null" else f"a {got}")
    raise Refusal(
        f"Invalid type for '{param}': expected {exp}, but got {got} instead.",
        param=param,
        code="invalid_type",
    )


def refuse_missing(param: str) -> NoReturn:
    raise Refusal(
        f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter"
    )


def refuse_value(param: str, message: str, code: str = "invalid_value") -> NoReturn:
    raise Refusal(message, param=param, code=code)


def check_bool(value: Any, param: str) -> bool:
    if not isinstance(value, bool):
        refuse_type(param, "boolean", value)
    return value


def check_int(value: Any, param: str, *, ge: int | None = None, le: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        refuse_type(param, "integer", value)
    if ge is not None and value < ge:
        raise Refusal(
            f"Invalid '{param}': integer below minimum value. Expected a value >= {ge}, but got {value} instead.",
            param=param,
            code="integer_below_min_value",
        )
    if le is not None and value > le:
        raise Refusal(
            f"Invalid '{param}': integer above maximum value. Expected a value <= {le}, but got {value} instead.",
            param=param,
            code="integer_above_max_value",
        )
    return value


def check_number(
    value: Any,
    param: str,
    *,
    ge: float | None = None,
    le: float | None = None,
    gt: float | None = None,
) -> float:
    """A JSON number (int or float, never bool, never NaN/inf), returned as float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        refuse_type(param, "decimal", value)
    try:
        value = float(value)
    except OverflowError:  # an integer beyond float range (JSON allows it)
        if value > 0 and le is not None:
            msg, code = f"Invalid '{param}': decimal above maximum value. Expected a value <= {le:g}.", "decimal_above_max_value"
        elif value < 0 and (ge is not None or gt is not None):
            bound = ge if ge is not None else gt
            msg, code = f"Invalid '{param}': decimal below minimum value. Expected a value >= {bound:g}.", "decimal_below_min_value"
        else:
            msg, code = f"Invalid '{param}': expected a finite number.", "invalid_value"
        raise Refusal(msg, param=param, code=code) from None
    if not math.isfinite(value):
        refuse_value(param, f"Invalid '{param}': expected a finite number.")
    if ge is not None and value < ge:
        raise Refusal(
            f"Invalid '{param}': decimal below minimum value. Expected a value >= {ge:g}, but got {value:g} instead.",
            param=param,
            code="decimal_below_min_value",
        )
    if gt is not None and value <= gt:
        raise Refusal(
            f"Invalid '{param}': decimal below minimum value. Expected a value > {gt:g}, but got {value:g} instead.",
            param=param,
            code="decimal_below_min_value",
        )
    if le is not None and value > le:
        raise Refusal(
            f"Invalid '{param}': decimal above maximum value. Expected a value <= {le:g}, but got {value:g} instead.",
            param=param,
            code="decimal_above_max_value",
        )
    return value


def check_str(value: Any, param: str, *, min_len: int = 0, max_len: int | None = None) -> str:
    if not isinstance(value, str):
        refuse_type(param, "string", value)
    if len(value) < min_len:
        if min_len == 1:
            msg = f"Invalid '{param}': empty string. Expected a string with minimum length 1, but got an empty string instead."
            code = "empty_string"
        else:
            msg = f"Invalid '{param}': string too short. Expected a string with minimum length {min_len}, but got a string with length {len(value)} instead."
            code = "string_below_min_length"
        raise Refusal(msg, param=param, code=code)
    if max_len is not None and len(value) > max_len:
        raise Refusal(
            f"Invalid '{param}': string too long. Expected a string with maximum length {max_len}, but got a string with length {len(value)} instead.",
            param=param,
            code="string_above_max_length",
        )
    return value


def check_object(value: Any, param: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        refuse_type(param, "object", value)
    return value


def check_array(value: Any, param: str, *, max_len: int | None = None) -> list[Any]:
    if not isinstance(value, list):
        refuse_type(param, "array", value)
    if max_len is not None and len(value) > max_len:
        raise Refusal(
            f"Invalid '{param}': array too long. Expected an array with maximum length {max_len}, but got an array with length {len(value)} instead.",
            param=param,
            code="array_above_max_length",
        )
    return value


def check_enum(value: Any, param: str, allowed: tuple[Any, ...]) -> Any:
    if isinstance(value, (str, type(None))) and value in allowed:
        return value
    if not isinstance(value, str) and value is not None:
        refuse_type(param, "string", value)
    shown = ", ".join(repr(a) for a in allowed if a is not None)
    raise Refusal(
        f"Invalid value: {value!r}. Supported values are: {shown}.",
        param=param,
        code="invalid_value",
    )


def check_known_keys(obj: Mapping[str, Any], param: str, known: frozenset[str] | set[str]) -> None:
    """Refuse the first key not in `known` (code ``unknown_parameter``)."""
    for key in obj:
        if key not in known:
            p = path(param, key)
            raise Refusal(f"Unknown parameter: '{p}'.", param=p, code="unknown_parameter")


def require(obj: Mapping[str, Any], key: str, param: str) -> Any:
    """obj[key], or a ``missing_required_parameter`` refusal (null counts as missing)."""
    value = obj.get(key)
    if value is None:
        refuse_missing(path(param, key))
    return value


def _encodable(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_unicode(value: Any, text: str) -> None:
    """Refuse parsed JSON whose strings hold a lone UTF-16 surrogate (``"\\ud800"``, valid
    JSON syntax but not Unicode text: it could be neither tokenized nor sent back). `text`
    is the JSON text `value` came from; only when it has a surrogate escape is `value`
    walked (escaped pairs, as ``ensure_ascii`` writes an emoji, are fine). The param is
    the string's path (for a bad object key, the object's)."""
    if not _SURROGATE_ESCAPE.search(text):
        return
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        v, where = stack.pop()
        if isinstance(v, str):
            ok = _encodable(v)
        elif isinstance(v, Mapping):
            ok = all(_encodable(k) for k in v)
            if ok:
                stack.extend((x, path(where, k)) for k, x in v.items())
        else:
            ok = True
            if isinstance(v, list):
                stack.extend((x, path(where, i)) for i, x in enumerate(v))
        if not ok:
            raise Refusal(
                f"Invalid value{f' at {where!r}' if where else ''}: a string holds a lone UTF-16 surrogate "
                "(an escape from \\ud800 to \\udfff without its pair), which is not Unicode text.",
                param=where or None,
                code="invalid_value" if where else "invalid_json",
            )
