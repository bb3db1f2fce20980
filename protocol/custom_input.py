"""A custom tool call's input, read from the model's arguments as they stream.

The model calls a custom tool as a function with one string argument, ``{"input":
"..."}`` (JSON-escaped; the output grammar holds it to that shape). `InputStream`
decodes the string while the arguments arrive, so ``response.custom_tool_call_input.delta``
carries the input itself, not its JSON; an escape split across chunks waits for its
end. `final_input` reads the whole arguments once the call ends: the ``input`` string,
or, for arguments of any other shape (no grammar held the model to it), their text.
"""

from __future__ import annotations

import json
import re

__all__ = ["InputStream", "final_input"]

_OPENING = re.compile(r'\s*\{\s*"input"\s*:\s*"')
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


class InputStream:
    """Feed argument chunks; get the input text each adds."""

    __slots__ = ("_raw", "_pos", "_state")

    def __init__(self) -> None:
        self._raw = ""
        self._pos = 0
        self._state = "opening"  # opening | string | done (closed, or not this shape)

    def feed(self, chunk: str) -> str:
        self._raw += chunk
        if self._state == "opening":
            m = _OPENING.match(self._raw)
            if m is None:
                compact = re.sub(r"\s+", "", self._raw)
                if not '{"input":"'.startswith(compact):
                    self._state = "done"
                return ""
            self._state, self._pos = "string", m.end()
        if self._state != "string":
            return ""
        return self._decode()

    def _decode(self) -> str:
        raw, i, out = self._raw, self._pos, []
        while i < len(raw):
            c = raw[i]
            if c == '"':
                self._state = "done"
                break
            if c != "\\":
                out.append(c)
                i += 1
                continue
            if i + 1 >= len(raw):
                break  # the rest of the escape is still to come
            if raw[i + 1] != "u":
                if raw[i + 1] not in _ESCAPES:
                    self._state = "done"
                    break
                out.append(_ESCAPES[raw[i + 1]])
                i += 2
                continue
            text, used = _unicode_escape(raw, i)
            if used == 0:
                break
            if used < 0:
                self._state = "done"
                break
            out.append(text)
            i += used
        self._pos = i
        return "".join(out)


def _unicode_escape(raw: str, i: int) -> tuple[str, int]:
    """(`\\uXXXX` at `i` decoded, characters used); 0 used: incomplete; -1: invalid."""
    hex4 = raw[i + 2:i + 6]
    if len(hex4) < 4:
        return "", 0
    try:
        code = int(hex4, 16)
    except ValueError:
        return "", -1
    if 0xD800 <= code < 0xDC00:  # a surrogate pair: the low half follows
        low = raw[i + 6:i + 12]
        if len(low) < 6:
            return "", 0
        try:
            low_code = int(low[2:], 16) if low.startswith("\\u") else -1
        except ValueError:
            return "", -1
        if not 0xDC00 <= low_code < 0xE000:
            return "", -1
        return chr(0x10000 + ((code - 0xD800) << 10) + (low_code - 0xDC00)), 12
    return chr(code), 6


def final_input(arguments: str) -> str:
    """The input of a finished call: the ``input`` string of its arguments, else their text."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    if isinstance(value, dict) and isinstance(value.get("input"), str):
        return value["input"]
    return arguments
