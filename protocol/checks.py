"""Small value checks that raise OpenAI-shaped refusals.

Shared by the Responses decoders (`protocol.decode`), `protocol.sampling`,
`protocol.structured` and the chat-completions decoder (`protocol.chat_request`).
Every check takes the value and its param path (OpenAI's notation:
``input[3].content[0].text``) and either returns the value, normalised, or raises
`Refusal` with the path, a message worded as OpenAI words it, and a code. The
``opt_*`` / ``req_*`` helpers read one key of an object the same way.

`decode_json` is the one JSON loader of every endpoint (request bodies, socket
frames, the admin API).

Pure stdlib; hot enough (once per request field) to stay hand-written.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Mapping, NoReturn

from protocol.errors import Refusal

__all__ = [
    "decode_json",
    "invalid_json",
    "check_body",
    "path",
    "type_name",
    "a_type",
    "refuse_type",
    "refuse_missing",
    "refuse_unknown_parameter",
    "refuse_unsupported_parameter",
    "unsupported_value",
    "invalid_choice",
    "check_bool",
    "check_int",
    "check_number",
    "check_str",
    "check_object",
    "check_array",
    "check_enum",
    "check_known_keys",
    "require",
    "req_str",
    "req_name",
    "opt_str",
    "opt_bool",
    "opt_enum",
    "check_unicode",
]

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
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


def _a(word: str) -> str:
    """`word` with its indefinite article: ``an integer``, ``a string``."""
    return f"an {word}" if word in ("integer", "object", "array") else f"a {word}"


def a_type(value: Any) -> str:
    """`type_name` with its article, as a refusal says what it got: ``an array``, ``null``."""
    got = type_name(value)
    return "null" if got == "null" else _a(got)


def refuse_type(param: str, expected: str, value: Any) -> NoReturn:
    raise Refusal(
        f"Invalid type for '{param}': expected {_a(expected)}, but got {a_type(value)} instead.",
        param=param,
        code="invalid_type",
    )


def refuse_missing(param: str) -> NoReturn:
    raise Refusal(
        f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter"
    )


def refuse_unknown_parameter(param: str) -> NoReturn:
    raise Refusal(f"Unknown parameter: '{param}'.", param=param, code="unknown_parameter")


def refuse_unsupported_parameter(param: str, why: str = "") -> NoReturn:
    """A field OpenAI defines and ignis does not implement, sent set (not null)."""
    raise Refusal(
        f"Unsupported parameter: '{param}' is not supported by ignis.{' ' + why if why else ''}",
        param=param,
        code="unsupported_parameter",
    )


def unsupported_value(param: str, value: str, what: str) -> Refusal:
    """A value OpenAI defines and ignis does not implement (`what` says where it sits)."""
    return Refusal(
        f"Unsupported value: '{value}' is not supported by ignis for {what}.",
        param=param,
        code="unsupported_value",
    )


def invalid_choice(param: str, value: str, allowed: tuple[str, ...]) -> Refusal:
    """A string that names none of `allowed` (where an unknown name is a mistake, not a
    feature ignis lacks: compare `unsupported_value`)."""
    return Refusal(
        f"Invalid value: '{value}'. Supported values are: {', '.join(repr(a) for a in allowed)}.",
        param=param,
        code="invalid_value",
    )


def _out_of_range(param: str, kind: str, relation: str, bound: str, got: str | None = None) -> Refusal:
    """OpenAI's ``integer below minimum value`` and its kin; `relation` is the comparison
    the value failed (``>=``, ``>``, ``<=``), `kind` "integer" or "decimal"."""
    side, code = ("below minimum", "below_min") if relation[0] == ">" else ("above maximum", "above_max")
    but = "" if got is None else f", but got {got} instead"
    return Refusal(
        f"Invalid '{param}': {kind} {side} value. Expected a value {relation} {bound}{but}.",
        param=param,
        code=f"{kind}_{code}_value",
    )


def _not_finite(param: str) -> Refusal:
    return Refusal(f"Invalid '{param}': expected a finite number.", param=param, code="invalid_value")


def check_bool(value: Any, param: str) -> bool:
    if not isinstance(value, bool):
        refuse_type(param, "boolean", value)
    return value


def check_int(value: Any, param: str, *, ge: int | None = None, le: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        refuse_type(param, "integer", value)
    if ge is not None and value < ge:
        raise _out_of_range(param, "integer", ">=", f"{ge}", f"{value}")
    if le is not None and value > le:
        raise _out_of_range(param, "integer", "<=", f"{le}", f"{value}")
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
            raise _out_of_range(param, "decimal", "<=", f"{le:g}") from None
        if value < 0 and (ge is not None or gt is not None):
            raise _out_of_range(param, "decimal", ">=", f"{(ge if ge is not None else gt):g}") from None
        raise _not_finite(param) from None
    if not math.isfinite(value):
        raise _not_finite(param)
    if ge is not None and value < ge:
        raise _out_of_range(param, "decimal", ">=", f"{ge:g}", f"{value:g}")
    if gt is not None and value <= gt:
        raise _out_of_range(param, "decimal", ">", f"{gt:g}", f"{value:g}")
    if le is not None and value > le:
        raise _out_of_range(param, "decimal", "<=", f"{le:g}", f"{value:g}")
    return value


def check_str(value: Any, param: str, *, min_len: int = 0, max_len: int | None = None) -> str:
    if not isinstance(value, str):
        refuse_type(param, "string", value)
    if len(value) < min_len:
        if min_len == 1:
            raise _empty(param, "string")
        raise Refusal(
            f"Invalid '{param}': string too short. Expected a string with minimum length {min_len}, but got a string with length {len(value)} instead.",
            param=param,
            code="string_below_min_length",
        )
    if max_len is not None and len(value) > max_len:
        raise _too_long(param, "string", max_len, len(value))
    return value


def check_object(value: Any, param: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        refuse_type(param, "object", value)
    return value


def check_array(value: Any, param: str, *, nonempty: bool = False, max_len: int | None = None) -> list[Any]:
    if not isinstance(value, list):
        refuse_type(param, "array", value)
    if nonempty and not value:
        raise _empty(param, "array")
    if max_len is not None and len(value) > max_len:
        raise _too_long(param, "array", max_len, len(value))
    return value


def _empty(param: str, kind: str) -> Refusal:
    """An empty string or array where one of length 1 or more is required."""
    return Refusal(
        f"Invalid '{param}': empty {kind}. Expected {_a(kind)} with minimum length 1, but got an empty {kind} instead.",
        param=param,
        code=f"empty_{kind}",
    )


def _too_long(param: str, kind: str, max_len: int, length: int) -> Refusal:
    """A string or array longer than `max_len`."""
    return Refusal(
        f"Invalid '{param}': {kind} too long. Expected {_a(kind)} with maximum length {max_len}, but got {_a(kind)} with length {length} instead.",
        param=param,
        code=f"{kind}_above_max_length",
    )


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


def check_known_keys(
    obj: Mapping[str, Any],
    param: str,
    known: frozenset[str] | set[str],
    null_only: frozenset[str] = frozenset(),
) -> None:
    """Refuse the first key not in `known` (code ``unknown_parameter``). Keys in
    `null_only` (fields OpenAI defines and ignis does not implement) pass when null and
    are refused when set (`refuse_unsupported_parameter`)."""
    for key in obj:
        if key not in known:
            p = path(param, key)
            if key in null_only:
                if obj[key] is None:
                    continue
                refuse_unsupported_parameter(p)
            refuse_unknown_parameter(p)


def require(obj: Mapping[str, Any], key: str, param: str) -> Any:
    """obj[key], or a ``missing_required_parameter`` refusal (null counts as missing)."""
    value = obj.get(key)
    if value is None:
        refuse_missing(path(param, key))
    return value


def req_str(obj: Mapping[str, Any], key: str, param: str = "", **limits: int) -> str:
    """obj[key], a string (`limits`: `check_str`'s min_len / max_len); null counts as missing."""
    return check_str(require(obj, key, param), path(param, key), **limits)


def req_name(obj: Mapping[str, Any], key: str, param: str) -> str:
    """obj[key]: the name of a function or an output format, as OpenAI restricts them."""
    name = req_str(obj, key, param)
    if not _NAME.fullmatch(name):
        where = path(param, key)
        raise Refusal(
            f"Invalid '{where}': string does not match pattern. Expected a string "
            "that matches the pattern '^[a-zA-Z0-9_-]{1,64}$'.",
            param=where,
            code="invalid_value",
        )
    return name


def opt_str(obj: Mapping[str, Any], key: str, param: str = "") -> str | None:
    """obj[key], a string, or None when absent or null."""
    value = obj.get(key)
    return None if value is None else check_str(value, path(param, key))


def opt_bool(obj: Mapping[str, Any], key: str, param: str = "") -> bool | None:
    """obj[key], a boolean, or None when absent or null."""
    value = obj.get(key)
    return None if value is None else check_bool(value, path(param, key))


def opt_enum(obj: Mapping[str, Any], key: str, param: str, allowed: tuple[Any, ...]) -> Any:
    """obj[key], one of `allowed`, or None when absent or null."""
    value = obj.get(key)
    return None if value is None else check_enum(value, path(param, key), allowed)


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


# --- JSON -------------------------------------------------------------------------


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def invalid_json(reason: str) -> Refusal:
    """The refusal of a body or frame that is not JSON (param null, code ``invalid_json``)."""
    return Refusal(
        "We could not parse the JSON body of your request. The API expects a JSON "
        f"payload, but what was sent was not valid JSON ({reason}).",
        param=None,
        code="invalid_json",
    )


def check_body(body: Any) -> Mapping[str, Any]:
    """A request body (or frame) must be a JSON object (code ``invalid_json``)."""
    if not isinstance(body, Mapping):
        raise Refusal(
            f"The request body must be a JSON object, but got {a_type(body)}.", param=None, code="invalid_json"
        )
    return body


def decode_json(raw: bytes | bytearray | memoryview | str) -> dict[str, Any]:
    """Parse a request body or a socket text frame, which must hold a JSON object.

    Strict JSON: bad UTF-8, NaN / Infinity, nesting deeper than the parser goes and
    lone surrogates (`check_unicode`) are refused (``invalid_json``). A leading
    byte-order mark is skipped, on every endpoint: RFC 8259 lets a parser ignore it,
    and some platforms' clients send one."""
    try:
        if isinstance(raw, str):
            text = raw[1:] if raw.startswith("\ufeff") else raw
        else:
            text = bytes(raw).decode("utf-8-sig")
        value = json.loads(text, parse_constant=_refuse_constant)
    except (ValueError, RecursionError, TypeError) as exc:  # UnicodeDecodeError is a ValueError
        raise invalid_json(type(exc).__name__) from None
    check_body(value)
    check_unicode(value, text)
    return value
