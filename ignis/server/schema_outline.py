"""What a client's JSON schema would cost the grammar engine, read without recursion.

`outline(schema)` walks every subschema once (an explicit stack: a schema nests and
chains ``$ref``s as deep as it likes) and returns a `SchemaOutline`:

- `nodes`: subschemas; `literal_chars`: characters of its ``const`` / ``enum`` values
  (a literal costs llguidance work per token in proportion to its size);
- `depth`: the most subschemas a compile can nest through, from the root, following
  both nesting and ``$ref``s (grammar_graph.weighted_depth: a cycle counts all its
  members);
- `productive`: whether any finite JSON value can satisfy the root, as far as the
  structure says: a ``$ref`` cycle with no way out (``a -> b -> a``, or an object
  that requires itself) cannot; `stuck_at` points at such a ``$ref``. What is not
  understood counts as satisfiable (the grammar engine then judges);
- `surrogate`: a lone UTF-16 surrogate somewhere, which UTF-8 (and so the grammar
  engine) cannot hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from ignis.server.grammar_graph import productive, weighted_depth

__all__ = ["SchemaOutline", "has_surrogate", "outline"]

# Keywords whose value is one subschema, a map of them, or a list of them.
_ONE = ("additionalProperties", "additionalItems", "items", "contains", "not", "if", "then", "else",
        "propertyNames", "unevaluatedItems", "unevaluatedProperties")
_MAP = ("properties", "patternProperties", "dependentSchemas")
_LIST = ("allOf", "anyOf", "oneOf", "prefixItems")
_DEFS = ("$defs", "definitions")  # reached by $ref only: no nesting edge


@dataclass(frozen=True)
class SchemaOutline:
    nodes: int
    literal_chars: int
    depth: int
    productive: bool
    stuck_at: str | None
    surrogate: bool


def has_surrogate(text: str) -> bool:
    """A lone surrogate code point (JSON's "\\ud800" decodes to one; UTF-8 has none)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _literal_size(value: Any) -> tuple[int, bool]:
    """(characters of every string and number in `value`, whether one holds a surrogate)."""
    size, bad, work = 0, False, [value]
    while work:
        v = work.pop()
        if isinstance(v, str):
            size += len(v)
            bad = bad or has_surrogate(v)
        elif isinstance(v, dict):
            for key, item in v.items():
                size += len(str(key))
                bad = bad or has_surrogate(str(key))
                work.append(item)
        elif isinstance(v, (list, tuple)):
            work.extend(v)
        else:
            size += len(str(v))
    return size, bad


def _pointer(path: list[str]) -> str:
    return "#" + "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in path)


def outline(schema: Any) -> SchemaOutline:
    # Nodes: every subschema (a mapping or a boolean), by JSON pointer.
    values: list[Any] = []
    paths: list[str] = []
    children: list[list[int]] = []
    by_pointer: dict[str, int] = {}
    literal, surrogate = 0, False
    work: list[tuple[Any, list[str], int]] = [(schema, [], -1)]
    while work:
        value, path, parent = work.pop()
        node = len(values)
        pointer = _pointer(path)
        values.append(value)
        paths.append(pointer)
        children.append([])
        by_pointer[pointer] = node
        if parent >= 0:  # (definitions have parent -1: a compile reaches them by $ref alone)
            children[parent].append(node)
        if not isinstance(value, dict):
            continue
        for key, item in value.items():
            if has_surrogate(str(key)):
                surrogate = True
            if key in ("const", "enum", "default", "examples"):
                size, bad = _literal_size(item)
                surrogate = surrogate or bad
                if key in ("const", "enum"):
                    literal += size
            elif isinstance(item, str) and has_surrogate(item):
                surrogate = True
        for key in _ONE:
            sub = value.get(key)
            if isinstance(sub, (dict, bool)):
                work.append((sub, [*path, key], node))
            elif key == "items" and isinstance(sub, list):  # draft 4 tuples
                work.extend((s, [*path, key, str(i)], node) for i, s in enumerate(sub) if isinstance(s, (dict, bool)))
        for key in _LIST:
            sub = value.get(key)
            if isinstance(sub, list):
                work.extend((s, [*path, key, str(i)], node) for i, s in enumerate(sub) if isinstance(s, (dict, bool)))
        for key in (*_MAP, *_DEFS):
            sub = value.get(key)
            if isinstance(sub, dict):
                work.extend((s, [*path, key, str(k)], -1 if key in _DEFS else node) for k, s in sub.items()
                            if isinstance(s, (dict, bool)))
    refs = [_ref_target(v, by_pointer) for v in values]
    succ = [kids + ([r] if r is not None else []) for kids, r in zip(children, refs)]
    depth = weighted_depth(succ, [0])
    ok, stuck = _productivity(values, refs, by_pointer, paths)
    return SchemaOutline(len(values), literal, depth, ok, stuck, surrogate)


def _ref_target(value: Any, by_pointer: dict[str, int]) -> int | None:
    if not isinstance(value, dict):
        return None
    ref = value.get("$ref")
    if not isinstance(ref, str) or not ref.startswith("#"):
        return None  # an anchor or another document: the grammar engine judges
    return by_pointer.get("#" + unquote(ref[1:]).rstrip("/") if ref != "#" else "#")


def _productivity(values: list[Any], refs: list[int | None], by_pointer: dict[str, int],
                  paths: list[str]) -> tuple[bool, str | None]:
    """(whether the root can be satisfied by a finite value, a $ref where it cannot)."""
    n = len(values)
    clauses: list[list[list[int]]] = [[] for _ in range(n)]

    def node(path: str) -> int | None:
        return by_pointer.get(path)

    for v, value in enumerate(values):
        if value is False:
            clauses[v].append([])  # nothing satisfies it
            continue
        if not isinstance(value, dict):
            continue
        here = paths[v]
        if refs[v] is not None:
            clauses[v].append([refs[v]])
        branches = value.get("allOf")
        for i in range(len(branches) if isinstance(branches, list) else 0):
            child = node(f"{here}/allOf/{i}")
            if child is not None:
                clauses[v].append([child])
        for key in ("anyOf", "oneOf"):
            branches = value.get(key)
            if isinstance(branches, list):
                members = [c for i in range(len(branches)) if (c := node(f"{here}/{key}/{i}")) is not None]
                if len(members) == len(branches):  # (a branch that is no schema: the engine judges)
                    clauses[v].append(members)
        if "const" in value:
            continue
        if "enum" in value:
            if isinstance(value["enum"], list) and not value["enum"]:
                clauses[v].append([])
            continue
        types = value.get("type")
        if types is None:
            continue  # any type: null will do
        types = [types] if isinstance(types, str) else types if isinstance(types, list) else []
        if not types or not all(t == "object" or t == "array" for t in types):
            continue  # (a type with no needs, or one the engine judges)
        options: list[int] = []
        for t in types:
            needs = _object_needs(value, here, node) if t == "object" else _array_needs(value, here, node)
            virtual = len(clauses)  # a node for "this type, with what it needs"
            clauses.append([[x] if x is not None else [] for x in needs])
            options.append(virtual)
        clauses[v].append(options)
    done = productive(clauses)
    if done[0]:
        return True, None
    # Where it is stuck: a $ref not satisfiable, reached from the root by what it needs.
    seen, work = {0}, [0]
    while work:
        v = work.pop()
        if v < n and refs[v] is not None and not done[v]:
            return False, paths[v]
        for clause in clauses[v]:
            if not any(done[m] for m in clause):
                for m in clause:
                    if m not in seen:
                        seen.add(m)
                        work.append(m)
    return False, None


def _object_needs(value: dict[str, Any], here: str, node: Any) -> list[int | None]:
    """The subschemas an object of this schema must hold a value of (None: impossible)."""
    required = value.get("required")
    if not isinstance(required, list):
        return []
    props = value.get("properties") if isinstance(value.get("properties"), dict) else {}
    extra = value.get("additionalProperties")
    out: list[int | None] = []
    for name in required:
        if not isinstance(name, str):
            continue
        if name in props:
            _add(out, node(f"{here}/properties/{_escape(name)}"))
        elif value.get("patternProperties"):
            continue  # a pattern may take it: the engine judges
        elif extra is False:
            out.append(None)
        elif isinstance(extra, dict):
            _add(out, node(f"{here}/additionalProperties"))
    return out


def _array_needs(value: dict[str, Any], here: str, node: Any) -> list[int | None]:
    """The subschemas an array of this schema must hold an item of (None: impossible)."""
    least = value.get("minItems")
    if not isinstance(least, int) or isinstance(least, bool) or least <= 0:
        return []
    prefix = value.get("prefixItems") if isinstance(value.get("prefixItems"), list) else []
    out: list[int | None] = []
    for i in range(min(least, len(prefix))):
        _add(out, node(f"{here}/prefixItems/{i}"))
    if least > len(prefix):
        items = value.get("items")
        if items is False:
            out.append(None)
        elif isinstance(items, dict):
            _add(out, node(f"{here}/items"))
    return out


def _add(needs: list[int | None], child: int | None) -> None:
    """A needed subschema, where `node` found one (None from it: nothing to follow)."""
    if child is not None:
        needs.append(child)


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")
