"""Client data on its way into a chat template: made plain, and kept from becoming markup.

`plain_data` copies what a client sent into JSON types only, which is all a template sees.

`Neutralizer` finds, in every string of that data (dict keys too), the strings of added tokens
(`<|im_start|>`, `<think>`...) and the fragments of them at a string's edges (`<|im_` at the
end, `start|>` at the start), which a template joining two client strings could fuse into a
token. It swaps each for a random run of digits, which templates render as ordinary text, and
hands back the map to put the originals back in the rendered text. Fragments shorter than two
characters are left alone: in any split of a token into two pieces, one piece has two or more
characters, so fusing is blocked without touching every text that ends in "<" or starts with ">".
"""

from __future__ import annotations

import bisect
import json
import re
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import fields, is_dataclass
from functools import lru_cache
from typing import Any

_PLACEHOLDER_DIGITS = 24
# A string found free of markup is remembered (an agent resends the same history every
# turn), up to this many characters of strings; then the memory starts over. Strings
# with markup (rare) are scanned each time, so the memory holds strings only.
_MEMO_CHARS = 1 << 22


def plain_data(value: Any) -> Any:
    """A copy of `value` made only of dicts, lists and JSON scalars."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):  # subclasses (enums...) may carry methods the sandbox allows
        return str.__str__(value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, Mapping):
        return {plain_data(k): plain_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_data(v) for v in value]
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain_data(getattr(value, f.name)) for f in fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return plain_data(value.model_dump())
    return f"<{type(value).__name__}>"


@lru_cache(maxsize=8)
def markup_pattern(tokens: frozenset[str]) -> re.Pattern[str] | None:
    """One regex of the markup `tokens`, longest first so a token wins over a token it
    contains; None for none. Shared: the neutralizer and the prompt token cache look for the
    same tokens, and a vocabulary of 79k reserved tokens compiles to ~20 MB (measured)."""
    ordered = sorted(tokens, key=lambda t: (-len(t), t))
    return re.compile("|".join(map(re.escape, ordered))) if ordered else None


class Neutralizer:
    """Swaps markup in client strings for placeholders (see the module docstring)."""

    def __init__(self, control_tokens: Iterable[str]) -> None:
        tokens = frozenset(t for t in control_tokens if t)
        self._pattern = markup_pattern(tokens)
        # Proper prefixes (heads) and suffixes (tails) of the tokens, at least two characters,
        # looked up by bisection in the sorted tokens (tails: reversed): a set of every
        # fragment, or a regex of them, grew with the tokens' squared lengths (a vocabulary of
        # 79k reserved tokens took 660 MB).
        self._sorted = sorted(tokens)
        self._reversed = sorted(t[::-1] for t in tokens)
        self._longest = max(map(len, tokens), default=0)
        # Strings found free of markup. Shared by the server's worker threads: each set
        # operation is atomic, and a lost update only costs a rescan.
        self._clean: set[str] = set()
        self._clean_chars = 0

    def neutralize(self, value: Any, *, avoid: str = "") -> tuple[Any, dict[str, str]]:
        """(copy of `value` with markup swapped, {placeholder: original}). The map is empty
        when there was nothing to swap. Placeholders never occur in `avoid` nor in `value`."""
        value = plain_data(value)
        risky = {s[a:b] for s in _strings(value) for a, b in self._spans(s)}
        if not risky:
            return value, {}
        avoid += json.dumps(value, ensure_ascii=False)
        swap: dict[str, str] = {}
        taken: set[str] = set()
        for text in sorted(risky):
            placeholder = _random_digits()
            while placeholder in avoid or placeholder in taken:
                placeholder = _random_digits()
            swap[text] = placeholder
            taken.add(placeholder)
        return _map_strings(value, lambda s: self._swap(s, swap)), {p: t for t, p in swap.items()}

    @staticmethod
    def restore(text: str, originals: Mapping[str, str]) -> str:
        if not originals:
            return text
        return re.sub("|".join(originals), lambda m: originals[m.group(0)], text)

    def _spans(self, s: str) -> list[tuple[int, int]]:
        """`_risky_spans(s)`, with the clean strings remembered."""
        if s in self._clean:
            return []
        spans = self._risky_spans(s)
        if not spans:
            if self._clean_chars + len(s) > _MEMO_CHARS:
                self._clean.clear()
                self._clean_chars = 0
            self._clean.add(s)
            self._clean_chars += len(s)
        return spans

    def _risky_spans(self, s: str) -> list[tuple[int, int]]:
        if self._pattern is None:
            return []
        spans = [m.span() for m in self._pattern.finditer(s)]
        start, end = len(s) - len(s.lstrip()), len(s.rstrip())
        limit = min(self._longest - 1, end - start)
        # Longest fragment at each (whitespace-trimmed) edge, unless a whole token is there:
        # the longest k <= limit with s[start:start + k] in tails, and with s[end - k:end] in heads.
        head = tail = 0
        for k in range(limit, 1, -1):
            if _proper_prefix(s[start : start + k][::-1], self._reversed):  # a token's tail opens s
                head = k
                break
        for k in range(limit, 1, -1):
            if _proper_prefix(s[end - k : end], self._sorted):  # a token's head ends s
                tail = k
                break
        if head and not any(a < start + head and b > start for a, b in spans):
            spans.append((start, start + head))
        if tail and not any(a < end and b > end - tail for a, b in spans):
            spans.append((end - tail, end))
        return sorted(set(spans))

    def _swap(self, s: str, swap: Mapping[str, str]) -> str:
        pieces, position = [], 0
        for a, b in self._spans(s):
            if a < position:  # a head and tail fragment of a short string may overlap
                continue
            pieces += [s[position:a], swap[s[a:b]]]
            position = b
        pieces.append(s[position:])
        return "".join(pieces)


def _proper_prefix(x: str, words: list[str]) -> bool:
    """Whether x is a proper prefix of some string in `words` (sorted): those starting with x
    follow x's place in the order, x itself first if it is one."""
    i = bisect.bisect_left(words, x)
    for w in words[i : i + 2]:
        if w.startswith(x) and len(w) > len(x):
            return True
    return False


def _strings(value: Any) -> Iterable[str]:
    """Every string in plain data, dict keys included."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            stack += [*item.keys(), *item.values()]
        elif isinstance(item, list):
            stack += item


def _map_strings(value: Any, fn: Any) -> Any:
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, dict):
        return {_map_strings(k, fn): _map_strings(v, fn) for k, v in value.items()}
    if isinstance(value, list):
        return [_map_strings(v, fn) for v in value]
    return value


def _random_digits() -> str:
    # Templates leave digits alone (trim, tojson, escaping); a random run cannot be guessed by a
    # client or collide with the text.
    return "".join(secrets.choice("0123456789") for _ in range(_PLACEHOLDER_DIGITS))
