"""A custom (freeform) tool's input grammar, moved inside a JSON string.

A model trained on function calls is shown a custom tool as a function with one string
argument, ``input``, and calls it as ``{"name": "apply_patch", "arguments": {"input":
"..."}}``. The client's grammar (Lark or a regex) describes the *decoded* input, but
the model writes it JSON-escaped, so the grammar the engine enforces is the client's
with every terminal rewritten to match the escaped text of what it matched before
(``"\\n"`` becomes the two characters backslash and ``n``). `json_string_rule` returns
that as a Lark rule body for llguidance:

- ``format: text`` (or none): any JSON string.
- ``regex``: a JSON string whose decoded text matches the whole regex, rewritten as
  the Lark terminals are (below); syntax only Rust's regex crate knows (``\\p{L}``,
  ``[[:alpha:]]``) goes to llguidance's JSON-schema ``pattern`` instead.
- ``lark``: the client's grammar rewritten character by character (below), nested as
  ``%lark { ... }`` between the quotes, so its rule names stay its own.

Why character by character: llguidance lexes a terminal greedily, and escaping makes
terminals that once ended on a character they could not take now share its first byte
(``/.*/`` followed by ``LF`` becomes "escapes or plain characters" followed by
``\\n``: both begin with a backslash). So every terminal becomes a rule over
one-character lexemes (a plain character, or one escape sequence), and the Earley
parser, not the lexer, decides where each ends. A patch-sized input parses in well
under a millisecond a token.

Escapes are the canonical ones (``json.dumps``, with DEL as ``\\u007f`` as llguidance's
JSON strings have it): a model that writes ``\\u0041`` for ``A`` is held to ``A``.
What cannot be carried inside a string is refused (`FreeformError`): special tokens,
``%json``, ``%ignore``, look-around and back-references, ``\\b`` anchors, imports
other than Lark's ``common`` terminals.
"""

from __future__ import annotations

import functools
import json
import re
import threading

try:  # Python 3.11+: the parser moved under re (sre_parse is deprecated)
    from re import _constants as sre_c  # type: ignore[attr-defined]
    from re import _parser as sre_parse  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover
    import sre_constants as sre_c  # type: ignore[no-redef]
    import sre_parse  # type: ignore[no-redef]

__all__ = ["FreeformError", "escape_lark", "json_string_rule", "regex_expr", "regex_literal"]


class FreeformError(ValueError):
    """A custom tool grammar that cannot be enforced inside a JSON string."""


# Characters a JSON string cannot hold raw (llguidance's JSON strings also escape DEL).
_SPECIAL = [chr(c) for c in range(0x20)] + ['"', "\\", "\x7f"]
_PLAIN = '[^"\\\\\\x00-\\x1F\\x7F]'  # a Rust regex class: characters that stand for themselves
_META = set("\\.+*?()|[]{}^$#&-~ /")
# Where plain characters (a JSON string holds them as they are) begin and end: a class's
# plain members, if any, include one of these or one next to an end of its ranges.
_PLAIN_EDGES = (0x20, 0x21, 0x23, 0x5B, 0x5D, 0x7E, 0x80, 0xD7FF, 0xE000, 0xFFFF, 0x10000, 0x10FFFF)
# What a category (\d, \w, \s and their complements) certainly holds, for the same test.
_CATEGORY_PROBES = "0a_ !\u00a0\u00e9\u4e2d\u0660\U0001f600"
_ALL_PLAIN: str | None = None  # every plain character, built on the rare first need
_MAX_SCANS = 16  # searches over all of them, per grammar
_scans = threading.local()


def _json_escape(c: str) -> str:
    """The escaped text of one character in a JSON string (json.dumps's choice)."""
    return "\\u007f" if c == "\x7f" else json.dumps(c, ensure_ascii=False)[1:-1]


def _char(c: str, ignore_case: bool = False) -> str:
    """One character as one lexeme: its escaped text as a Lark literal."""
    if ignore_case and c.lower() != c.upper():
        return f"/[{_class_char(c.lower())}{_class_char(c.upper())}]/"
    return json.dumps(_json_escape(c), ensure_ascii=False)


def _class_char(c: str) -> str:
    if c in _META or c in "[]^":
        return "\\" + c
    if ord(c) < 0x20 or c == "\x7f":
        return f"\\x{ord(c):02X}"
    return c


def regex_literal(text: str) -> str:
    """`text` as a Rust regex (inside ``/.../``) that matches it literally."""
    return "".join(_class_char(c) for c in text)


_CATEGORIES = {
    sre_c.CATEGORY_DIGIT: "\\d", sre_c.CATEGORY_NOT_DIGIT: "\\D",
    sre_c.CATEGORY_SPACE: "\\s", sre_c.CATEGORY_NOT_SPACE: "\\S",
    sre_c.CATEGORY_WORD: "\\w", sre_c.CATEGORY_NOT_WORD: "\\W",
}


def _surrogate(code: int) -> bool:
    return 0xD800 <= code <= 0xDFFF


def _class_src(items: list) -> str:
    """A character class (Rust and Python syntax) from sre_parse's IN items. Surrogates,
    which no UTF-8 text holds (and Rust's classes refuse), are left out."""
    negate, parts = False, []
    for op, av in items:
        if op is sre_c.LITERAL:
            if not _surrogate(av):
                parts.append(_class_char(chr(av)))
        elif op is sre_c.RANGE:
            low, high = av
            low = 0xE000 if _surrogate(low) else low
            high = 0xD7FF if _surrogate(high) else high
            if low <= high:
                parts.append(f"{_class_char(chr(low))}-{_class_char(chr(high))}")
        elif op is sre_c.CATEGORY:
            parts.append(_CATEGORIES[av])
        elif op is sre_c.NEGATE:
            negate = True
        else:
            raise FreeformError(f"unsupported item in a character class: {op}")
    if not parts and not negate:
        raise FreeformError("the character class matches nothing (it holds only surrogates)")
    return "[" + ("^" if negate else "") + "".join(parts) + "]"


def _is_plain(c: str) -> bool:
    return ord(c) >= 0x20 and c not in '"\\\x7f' and not _surrogate(ord(c))


def _has_plain(test: re.Pattern[str], src: str, flags: int) -> bool:
    """Whether the class `test` (compiled from `src`) matches a plain character. Its
    membership changes only at the ends of its ranges and literals (each one's
    neighbours, and the edges of the plain set, are tried), except through categories
    (\\d, \\w, \\s: what they hold is tried) and case folding: a class with either that
    none of those matches is searched over every plain character (a few per grammar)."""
    codes = set(_PLAIN_EDGES)
    for m in re.finditer(r"(?s)\\?(.)", src):  # every character the source names, and its neighbours
        code = ord(m.group(1))
        codes.update((code - 1, code, code + 1))
    candidates = [chr(c) for c in codes if 0 <= c <= 0x10FFFF] + list(_CATEGORY_PROBES)
    if any(_is_plain(c) and test.fullmatch(c) for c in candidates):
        return True
    if not (flags & re.IGNORECASE or re.search(r"\\[dDsSwW]", src)):
        return False  # (no category, no folding: the ends tell it all)
    budget = getattr(_scans, "left", _MAX_SCANS)
    if budget <= 0:
        raise FreeformError(f"more than {_MAX_SCANS} character classes that match almost nothing (such as "
                            f"[^\\D\\S]) in one grammar")
    _scans.left = budget - 1
    return _search_all(src, flags & re.IGNORECASE)


@functools.lru_cache(maxsize=256)
def _search_all(src: str, flags: int) -> bool:
    global _ALL_PLAIN
    if _ALL_PLAIN is None:
        _ALL_PLAIN = "".join(chr(c) for c in range(0x20, 0x110000) if _is_plain(chr(c)))
    return re.compile(src, flags).search(_ALL_PLAIN) is not None


def _set(src: str, flags: int) -> str:
    """Character class `src` as one-character lexemes: one regex lexeme for its plain
    members, one literal for the escape of each special member."""
    test = re.compile(src, flags & (re.IGNORECASE | re.DOTALL))
    alts = [_char(c) for c in _SPECIAL if test.fullmatch(c)]
    if _has_plain(test, src, flags):
        plain = f"[{src}&&{_PLAIN}]"
        alts.insert(0, "/" + (f"(?i:{plain})" if flags & re.IGNORECASE else plain) + "/")
    if not alts:
        raise FreeformError(f"the character class {src} matches nothing")
    return alts[0] if len(alts) == 1 else "(" + " | ".join(alts) + ")"


def _repeat(body: str, low: int, high: int) -> str:
    body = f"({body})"
    if high is sre_c.MAXREPEAT:
        return body + ("*" if low == 0 else "+" if low == 1 else f"{{{low},}}")
    return body + ("?" if (low, high) == (0, 1) else f"{{{low},{high}}}")


def _node(op, av, flags: int) -> str:  # noqa: C901 - one case per sre_parse opcode
    if op is sre_c.LITERAL:
        if _surrogate(av):
            raise FreeformError("a lone surrogate (\\ud800-\\udfff) matches no UTF-8 text")
        return _char(chr(av), bool(flags & re.IGNORECASE))
    if op is sre_c.NOT_LITERAL:
        return _set(f"[^{_class_char(chr(av))}]", flags)
    if op is sre_c.ANY:
        return _set("[\\s\\S]" if flags & re.DOTALL else "[^\\n]", flags)
    if op is sre_c.IN:
        return _set(_class_src(av), flags)
    if op is sre_c.BRANCH:
        return "(" + " | ".join(_seq(branch, flags) for branch in av[1]) + ")"
    if op is sre_c.SUBPATTERN:
        _group, add, remove, sub = av
        return "(" + _seq(sub, (flags | add) & ~remove) + ")"
    if op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT) or op.name == "POSSESSIVE_REPEAT":
        low, high, sub = av
        return _repeat(_seq(sub, flags), low, high)
    if op.name == "ATOMIC_GROUP":
        return "(" + _seq(av, flags) + ")"
    raise FreeformError(f"a regex construct a grammar engine cannot match ({op.name.lower()})")


def _seq(nodes, flags: int) -> str:
    return " ".join(_node(op, av, flags) for op, av in nodes) or '""'


def regex_expr(pattern: str, flags: str = "") -> str:
    """A Lark expression over one-character lexemes matching the JSON-escaped text of
    each full match of Python regex `pattern` (Lark's dialect; `flags` from
    ``/.../flags``: i, s, m, x)."""
    value = 0
    for f in flags:
        value |= {"i": re.IGNORECASE, "s": re.DOTALL, "m": re.MULTILINE, "x": re.VERBOSE}.get(f, 0)
    try:
        parsed = sre_parse.parse(pattern, value)
    except re.error as exc:
        raise FreeformError(f"invalid regex /{pattern[:80]}/: {exc}") from None
    except RecursionError:
        raise FreeformError("the regex nests too deeply") from None
    nodes = list(parsed)
    while nodes and nodes[0][0] is sre_c.AT and nodes[0][1] in (sre_c.AT_BEGINNING, sre_c.AT_BEGINNING_STRING):
        nodes.pop(0)
    while nodes and nodes[-1][0] is sre_c.AT and nodes[-1][1] in (sre_c.AT_END, sre_c.AT_END_STRING):
        nodes.pop()
    try:
        return _seq(nodes, parsed.state.flags)
    except RecursionError:
        raise FreeformError("the regex nests too deeply") from None


# -- Lark grammars ------------------------------------------------------------------

# Lark's lexical pieces that change; everything else is copied as it is.
_TOKENS = re.compile(r"""
    (?P<comment>(?:\#|//)[^\n]*)
  | (?P<string>"(?:\\.|[^"\\\n])*")(?P<sflags>i?)
  | (?P<regex>/(?:\\.|[^/\\\n])+/)(?P<rflags>[imslux]*)
  | (?P<imp>%import[ \t]+common(?:\.(?P<one>[A-Z_][A-Z_0-9]*)(?:[ \t]*->[ \t]*(?P<alias>[A-Z_][A-Z_0-9]*))?
        |[ \t]*\((?P<many>[^)]*)\)))
  | (?P<bad>%json|%lark|%llguidance|%ignore|%import|<[^<>\s]+>|@[A-Za-z_])
  | (?P<terminal>(?<![\w.])_?[A-Z][A-Z_0-9]*\b)
""", re.VERBOSE)

# Lark's common terminals (the ones grammars import), as Python regexes.
_COMMON = {
    "DIGIT": "[0-9]", "HEXDIGIT": "[a-fA-F0-9]", "INT": "[0-9]+", "SIGNED_INT": "[+-]?[0-9]+",
    "DECIMAL": r"[0-9]+\.[0-9]*|\.[0-9]+", "FLOAT": r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?",
    "SIGNED_FLOAT": r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?",
    "NUMBER": r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?",
    "SIGNED_NUMBER": r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?",
    "ESCAPED_STRING": r'"(?:[^"\\\n]|\\.)*"', "LCASE_LETTER": "[a-z]", "UCASE_LETTER": "[A-Z]",
    "LETTER": "[a-zA-Z]", "WORD": "[a-zA-Z]+", "CNAME": "[a-zA-Z_][a-zA-Z_0-9]*",
    "WS_INLINE": r"[ \t]+", "WS": r"[ \t\f\r\n]+", "CR": r"\r", "LF": r"\n", "NEWLINE": r"(?:\r?\n)+",
    "SH_COMMENT": r"#[^\n]*", "CPP_COMMENT": r"//[^\n]*", "C_COMMENT": r"/\*(?s:.)*?\*/", "SQL_COMMENT": r"--[^\n]*",
}


def _rule_name(terminal: str) -> str:
    """A terminal's name as a rule's (terminals become rules over one-character lexemes)."""
    underscore = terminal.startswith("_")
    return ("_" if underscore else "") + "t_" + terminal.lstrip("_").lower()


def _common(name: str, alias: str | None) -> str:
    if name not in _COMMON:
        raise FreeformError(f"%import common.{name}: not one of Lark's common terminals ignis knows")
    return f"{_rule_name(alias or name)}: {regex_expr(_COMMON[name])}"


def _literal(literal: str, ignore_case: bool) -> str:
    text = json.loads(re.sub(r"\\x([0-9a-fA-F]{2})", r"\\u00\1", literal))
    return "(" + (" ".join(_char(c, ignore_case) for c in text) or '""') + ")"


def escape_lark(grammar: str) -> str:
    """The Lark grammar `grammar` rewritten to match the JSON-escaped text of what it
    matched, over one-character lexemes."""
    out: list[str] = []
    pos = 0
    for m in _TOKENS.finditer(grammar):
        out.append(grammar[pos:m.start()])
        pos = m.end()
        if m["comment"] is not None:
            continue
        if m["string"] is not None:
            out.append(_literal(m["string"], bool(m["sflags"])))
        elif m["regex"] is not None:
            out.append("(" + regex_expr(m["regex"][1:-1].replace("\\/", "/"), m["rflags"]) + ")")
        elif m["imp"] is not None:
            names = [m["one"]] if m["one"] else [n.strip() for n in m["many"].split(",") if n.strip()]
            out.append("\n".join(_common(n, m["alias"]) for n in names))
        elif m["terminal"] is not None:
            out.append(_rule_name(m["terminal"]))
        else:
            raise FreeformError(f"'{m['bad']}' cannot be used in a custom tool grammar (the input is a JSON string)")
    out.append(grammar[pos:])
    return "".join(out)


# Constructs Python's parser refuses for a reason Rust's would too.
_PYTHON_ONLY = re.compile(r"\(\?<?[=!]|\\[1-9]")


def json_string_rule(syntax: str | None, definition: str | None) -> str:
    """A Lark rule body matching a JSON string (quotes included) whose decoded text the
    custom tool's format accepts. `syntax` None: any text."""
    _scans.left = _MAX_SCANS
    if syntax is None:
        return '%json {"type": "string"}'
    if syntax == "regex":
        try:
            return '"\\"" (' + regex_expr(definition or "") + ') "\\""'
        except FreeformError:
            if _PYTHON_ONLY.search(definition or ""):
                raise
        # Rust-only syntax (\p{L}, [[:alpha:]], ...): llguidance's JSON-schema pattern,
        # which escapes the regex itself (one lexeme; less exact at quotes and backslashes).
        return "%json " + json.dumps({"type": "string", "pattern": f"^(?:{definition})$"}, ensure_ascii=False)
    if syntax == "lark":
        return '"\\"" %lark {\n' + escape_lark(definition or "") + '\n} "\\""'
    raise FreeformError(f"unknown grammar syntax {syntax!r}")
