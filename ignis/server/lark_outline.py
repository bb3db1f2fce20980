"""What a client's Lark grammar would cost the grammar engine, read before it sees it.

`outline(text)` tokenizes the grammar (comments, strings, regexes and special tokens are
single tokens, so nothing inside them counts), splits it into definitions (a line
``name: ...`` or ``NAME: ...``, with ``?``/``!``, a ``.priority`` or ``[attributes]``;
other lines continue the one before) and returns a `LarkOutline`:

- `rules` (definitions), `alternatives` (``|``-separated choices, every level),
  `literal_chars` (characters of string literals and regexes), `nesting` (the deepest
  bracket nesting);
- `depth`: the most definitions a compile can chain through (each refers to the next;
  grammar_graph.weighted_depth, a cycle counting all its members);
- `stuck`: the rules that can never produce a finite text, when ``start`` is one of them
  (``start: a``, ``a: a "x"``); None when start can finish, or when the body could not be
  read (syntax this reader does not know: the grammar engine judges it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ignis.server.grammar_graph import productive, weighted_depth

__all__ = ["MAX_NESTING", "LarkOutline", "outline"]

# The deepest bracket nesting read (llguidance itself refuses past ~30).
MAX_NESTING = 64

_TOKEN = re.compile(r"""
    (?P<nl>\n)
  | (?P<ws>[ \t\f\r]+)
  | (?P<comment>(?://|\#)[^\n]*)
  | (?P<string>"(?:\\.|[^"\\\n])*"i?)
  | (?P<regex>/(?:\\.|[^/\\\n])+/[imslux]*)
  | (?P<special><\[[^\]\n]*\]>|<\|[^|\n]*\|>|<[^<>\s]+>)
  | (?P<directive>%[A-Za-z_]+)
  | (?P<name>[A-Za-z_][A-Za-z_0-9]*(?:\.[A-Za-z_][A-Za-z_0-9]*)*)
  | (?P<number>-?[0-9]+)
  | (?P<op>->|\.\.|[:|()\[\]?*+~{},.&=!])
  | (?P<other>.)
""", re.VERBOSE)


@dataclass(frozen=True)
class LarkOutline:
    rules: int
    alternatives: int
    literal_chars: int
    nesting: int
    depth: int
    stuck: tuple[str, ...] | None


class _Unread(Exception):
    """Syntax this reader does not know."""


def _tokens(text: str) -> list[tuple[str, str]]:
    out = []
    for m in _TOKEN.finditer(text):
        kind = m.lastgroup or "other"
        if kind not in ("ws", "comment"):
            out.append((kind, m.group()))
    return out


def _lines(tokens: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    lines: list[list[tuple[str, str]]] = [[]]
    for tok in tokens:
        if tok[0] == "nl":
            lines.append([])
        else:
            lines[-1].append(tok)
    return [ln for ln in lines if ln]


def _header(line: list[tuple[str, str]]) -> tuple[str, int] | None:
    """(the defined name, where its body starts) when `line` opens a definition."""
    k = 1 if line[0] in (("op", "?"), ("op", "!")) else 0
    if k >= len(line) or line[k][0] != "name":
        return None
    name, k = line[k][1], k + 1
    if k < len(line) and line[k] == ("op", "{"):  # template parameters
        while k < len(line) and line[k] != ("op", "}"):
            k += 1
        k += 1
    if k + 1 < len(line) and line[k] == ("op", ".") and line[k + 1][0] == "number":  # priority
        k += 2
    if k < len(line) and line[k] == ("op", "["):  # llguidance attributes
        depth = 0
        while k < len(line):
            depth += {("op", "["): 1, ("op", "]"): -1}.get(line[k], 0)
            k += 1
            if depth == 0:
                break
    if k < len(line) and line[k] == ("op", ":"):
        return name, k + 1
    return None


def outline(text: str) -> LarkOutline:
    tokens = _tokens(text)
    literal = sum(len(v) for kind, v in tokens if kind in ("string", "regex"))
    alternatives = sum(1 for tok in tokens if tok == ("op", "|"))
    nesting = level = 0
    for tok in tokens:
        if tok in (("op", "("), ("op", "[")):
            level += 1
            nesting = max(nesting, level)
        elif tok in (("op", ")"), ("op", "]")):
            level = max(0, level - 1)
    bodies: dict[str, list[tuple[str, str]]] = {}
    leaves: set[str] = set()  # imported or declared names
    current: list[tuple[str, str]] | None = None
    for line in _lines(tokens):
        if line[0][0] == "directive":
            current = None
            if line[0][1] in ("%import", "%declare"):
                leaves.update(v.rsplit(".", 1)[-1] for kind, v in line[1:] if kind == "name")
            continue
        head = _header(line)
        if head is not None:
            name, start = head
            current = bodies.setdefault(name, [])
            if current:
                current.append(("op", "|"))  # a second definition of a name adds choices
            current.extend(line[start:])
        elif current is not None:
            current.extend(line)
    rules = len(bodies)
    alternatives += rules
    if nesting > MAX_NESTING:
        return LarkOutline(rules, alternatives, literal, nesting, 0, None)
    names = list(bodies)
    ids = {n: i for i, n in enumerate(names)}
    refs: list[list[int]] = [[] for _ in names]
    clauses: list[list[list[int]]] = [[] for _ in names]
    read = True
    for i, name in enumerate(names):
        try:
            reader = _Reader(bodies[name], ids, leaves, clauses, refs[i])
            top = reader.expansions()
            if reader.k != len(reader.toks):
                raise _Unread
            clauses[i].append([top])
        except _Unread:
            read = False
    depth = weighted_depth(refs, range(len(names)))
    stuck = None
    if read and "start" in ids:
        done = productive(clauses)
        if not done[ids["start"]]:
            stuck = tuple(n for n in names if not done[ids[n]])
    return LarkOutline(rules, alternatives, literal, nesting, depth, stuck)


class _Reader:
    """Recursive descent over one body (bounded by MAX_NESTING), building its productivity
    as nodes of `clauses`: a sequence is a node with one clause per item, a choice a node
    with one clause of its options; `refs` collects the definitions it refers to."""

    def __init__(self, toks: list[tuple[str, str]], ids: dict[str, int], leaves: set[str],
                 clauses: list[list[list[int]]], refs: list[int]) -> None:
        self.toks, self.k, self.ids, self.leaves, self.clauses, self.refs = toks, 0, ids, leaves, clauses, refs

    def _node(self, node_clauses: list[list[int]]) -> int:
        self.clauses.append(node_clauses)
        return len(self.clauses) - 1

    def _true(self) -> int:
        return self._node([])

    def _peek(self) -> tuple[str, str] | None:
        return self.toks[self.k] if self.k < len(self.toks) else None

    def _take(self) -> tuple[str, str]:
        tok = self._peek()
        if tok is None:
            raise _Unread
        self.k += 1
        return tok

    def expansions(self) -> int:
        options = [self.sequence()]
        while self._peek() == ("op", "|"):
            self.k += 1
            options.append(self.sequence())
        return options[0] if len(options) == 1 else self._node([options])

    def sequence(self) -> int:
        items: list[int] = []
        while (tok := self._peek()) is not None and tok not in (("op", "|"), ("op", ")"), ("op", "]")):
            if tok == ("op", "->"):  # an alias names the choice: nothing to read
                self.k += 2
                continue
            items.append(self.item())
        return self._node([[x] for x in items])

    def item(self) -> int:
        atom = self.atom()
        while (tok := self._peek()) is not None:
            if tok in (("op", "?"), ("op", "*")):
                self.k += 1
                atom = self._true()
            elif tok == ("op", "+"):
                self.k += 1
            elif tok == ("op", "~"):  # ~ n or ~ n..m
                self.k += 1
                low = self._take()
                if low[0] != "number":
                    raise _Unread
                if self._peek() == ("op", ".."):
                    self.k += 2
                if int(low[1]) <= 0:
                    atom = self._true()
            elif tok == ("op", "{"):  # {n}, {n,}, {n,m}
                self.k += 1
                low = self._take()
                while self._take() != ("op", "}"):
                    pass
                if low[0] != "number" or int(low[1]) <= 0:
                    atom = self._true()
            elif tok == ("op", "&"):  # llguidance: both lexemes at once
                self.k += 1
                atom = self._node([[atom], [self.atom()]])
            else:
                break
        return atom

    def atom(self) -> int:
        kind, value = self._take()
        if (kind, value) == ("op", "("):
            inner = self.expansions()
            if self._take() != ("op", ")"):
                raise _Unread
            return inner
        if (kind, value) == ("op", "["):
            self.expansions()
            if self._take() != ("op", "]"):
                raise _Unread
            return self._true()
        if (kind, value) == ("op", "~"):  # llguidance: a lexeme's complement
            self.atom()
            return self._true()
        if kind == "string":
            if self._peek() == ("op", ".."):
                self.k += 2
            return self._true()
        if kind in ("regex", "special"):
            return self._true()
        if kind == "name":
            if self._peek() == ("op", "{"):  # a template's arguments
                while self._take() != ("op", "}"):
                    pass
            target = self.ids.get(value)
            if target is None:  # imported, a template's parameter, or unknown: the engine judges
                return self._true()
            self.refs.append(target)
            return target
        raise _Unread
