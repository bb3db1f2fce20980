"""Limits on the grammars one request brings, checked before anything renders or compiles.

The grammar engine (llguidance) recurses natively as it compiles, and a few inputs cost
it far more than their size suggests; so every schema and grammar of a request is
outlined here first (ignis/server/schema_outline.py, lark_outline.py: a Python walk
without recursion) and refused with a 400 at its own `param`, naming the limit, when it
passes one. Measured with llguidance 1.9.1 and SmolLM2's 49k-token vocabulary on a
2-core Zen 5 (experiments/RESULTS.md, 2026-12-01):

- Native stack: ~3.4 KB per level of a ``$ref`` chain or of a rule chain (a 950-deep
  chain overflowed a 2 MB thread: SIGSEGV, the whole server gone). Compiles run on
  threads with a 256 MiB stack (ignis/engine/grammar_thread.py); `MAX_DEPTH` keeps
  every accepted grammar far inside it.
- A string literal costs llguidance ~0.2 us per character per token mask (100,000
  characters: 20 ms a token; 1 MB: "too many expressions constructed"):
  `MAX_LITERAL_CHARS` for ``const``/``enum`` values, property names, patterns and Lark
  literals together.
- Grammar symbols: llguidance panics past 65,535 (a custom tool of 15,000 alternatives,
  after a second of work); 10,000 alternatives took 0.56 s to compile: `MAX_RULES`,
  `MAX_ALTERNATIVES`, `MAX_GRAMMAR_CHARS`.
- A ``$ref`` cycle (or a rule) with no way out cannot produce a finite value: 400.
- Tools are counted before the conversation is rendered (`MAX_TOOLS`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ignis.server import lark_outline, schema_outline
from protocol.conversation import FunctionTool
from protocol.errors import Refusal
from protocol.structured import TextFormat

__all__ = ["MAX_ALTERNATIVES", "MAX_DEPTH", "MAX_GRAMMAR_CHARS", "MAX_LITERAL_CHARS", "MAX_RULES",
           "MAX_SCHEMA_NODES", "MAX_TOOLS", "GrammarBudget", "check_grammars", "check_tool_count"]

MAX_TOOLS = 512  # tools (functions, custom tools) in one request
MAX_DEPTH = 1_000  # nesting levels plus $ref hops, or chained rule references, from the start
MAX_SCHEMA_NODES = 10_000  # subschemas, all of a request's compiled schemas together
MAX_LITERAL_CHARS = 32_768  # literal text (const, enum, names, patterns, Lark strings and regexes), together
MAX_RULES = 4_096  # Lark definitions, all custom tools together
MAX_ALTERNATIVES = 4_096  # Lark choices, all custom tools together
MAX_GRAMMAR_CHARS = 65_536  # one custom tool's grammar definition


def _n(value: int) -> str:
    return f"{value:,}"


def check_tool_count(tools: Sequence[Any], param: str) -> None:
    if len(tools) > MAX_TOOLS:
        raise Refusal(f"Invalid '{param}': array too long. Expected an array with maximum length {MAX_TOOLS}, "
                      f"but got an array with length {len(tools)} instead.", param=param,
                      code="array_above_max_length")


class GrammarBudget:
    """What one request's grammars have used of the limits so far."""

    def __init__(self) -> None:
        self.nodes = 0
        self.literal = 0
        self.rules = 0
        self.alternatives = 0

    def _literal(self, chars: int, fail: Callable[[str], Refusal]) -> None:
        self.literal += chars
        if self.literal > MAX_LITERAL_CHARS:
            raise fail(f"its literal text (const and enum values, property names, patterns) brings the request's "
                       f"grammars to {_n(self.literal)} characters; the limit is {_n(MAX_LITERAL_CHARS)}")

    def schema(self, schema: Any, *, owner: str, param: str, code: str) -> None:
        """Account for one JSON schema that will be compiled; a Refusal at `param` past a limit."""
        def fail(why: str) -> Refusal:
            return Refusal(f"Invalid schema for {owner}: {why}.", param=param, code=code)

        out = schema_outline.outline(schema)
        if out.surrogate:
            raise fail("it holds a lone UTF-16 surrogate (such as \\ud800), which no UTF-8 text can match")
        self.nodes += out.nodes
        if self.nodes > MAX_SCHEMA_NODES:
            raise fail(f"it brings the request's schemas to {_n(self.nodes)} subschemas; the limit is "
                       f"{_n(MAX_SCHEMA_NODES)}")
        if out.depth > MAX_DEPTH:
            raise fail(f"it nests {_n(out.depth)} levels deep, counting each $ref followed; the limit is "
                       f"{_n(MAX_DEPTH)}")
        self._literal(out.literal_chars + _names_and_patterns(schema), fail)
        if not out.productive:
            where = f" (at '{out.stuck_at[:120]}')" if out.stuck_at else ""
            raise fail(f"no finite JSON value can satisfy it: a $ref cycle with no way out{where}")

    def lark(self, text: str, *, owner: str, param: str) -> None:
        """Account for one client Lark grammar (a custom tool's definition)."""
        def fail(why: str) -> Refusal:
            return Refusal(f"Invalid grammar for {owner}: {why}.", param=param, code="invalid_value")

        self._text(text, fail)
        out = lark_outline.outline(text)
        if out.nesting > lark_outline.MAX_NESTING:
            raise fail(f"its brackets nest {_n(out.nesting)} deep; the limit is {lark_outline.MAX_NESTING}")
        self.rules += out.rules
        if self.rules > MAX_RULES:
            raise fail(f"it brings the request's grammars to {_n(self.rules)} rules; the limit is {_n(MAX_RULES)}")
        self.alternatives += out.alternatives
        if self.alternatives > MAX_ALTERNATIVES:
            raise fail(f"it brings the request's grammars to {_n(self.alternatives)} alternatives; the limit is "
                       f"{_n(MAX_ALTERNATIVES)}")
        if out.depth > MAX_DEPTH:
            raise fail(f"its rules chain {_n(out.depth)} deep (each referring to the next); the limit is "
                       f"{_n(MAX_DEPTH)}")
        self._literal(out.literal_chars, fail)
        if out.stuck is not None:
            shown = ", ".join(name[:40] for name in out.stuck[:5]) + (", ..." if len(out.stuck) > 5 else "")
            raise fail(f"rule 'start' can never finish: no finite text matches these rules ({shown})")

    def regex(self, pattern: str, *, owner: str, param: str) -> None:
        """Account for one client regex (a custom tool's definition)."""
        def fail(why: str) -> Refusal:
            return Refusal(f"Invalid grammar for {owner}: {why}.", param=param, code="invalid_value")

        self._text(pattern, fail)
        level = deepest = 0
        escaped = False
        for c in pattern:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == "(":
                level += 1
                deepest = max(deepest, level)
            elif c == ")":
                level = max(0, level - 1)
        if deepest > lark_outline.MAX_NESTING:
            raise fail(f"its groups nest {_n(deepest)} deep; the limit is {lark_outline.MAX_NESTING}")
        self._literal(len(pattern), fail)

    def _text(self, text: str, fail: Callable[[str], Refusal]) -> None:
        if len(text) > MAX_GRAMMAR_CHARS:
            raise fail(f"its definition has {_n(len(text))} characters; the limit is {_n(MAX_GRAMMAR_CHARS)}")
        if schema_outline.has_surrogate(text):
            raise fail("it holds a lone UTF-16 surrogate (such as \\ud800), which no UTF-8 text can match")


def _names_and_patterns(schema: Any) -> int:
    """Characters of the property names and patterns of `schema` (they become literals)."""
    size, work = 0, [schema]
    while work:
        v = work.pop()
        if isinstance(v, dict):
            for key, item in v.items():
                if key in ("properties", "patternProperties") and isinstance(item, dict):
                    size += sum(len(str(k)) for k in item)
                elif key == "pattern" and isinstance(item, str):
                    size += len(item)
                if key not in ("const", "enum", "default", "examples"):
                    work.append(item)
        elif isinstance(v, list):
            work.extend(v)
    return size


def check_grammars(text_format: TextFormat, tools: Sequence[FunctionTool], *, format_param: str,
                   tool_param: Callable[[str], str], tools_param: str = "tools") -> None:
    """Every limit above for one request: its tool count, its JSON format's schema, its
    strict tools' parameters and its custom tools' grammars (before any is rendered or
    compiled). `format_param` is where the format sits, `tool_param(name)` where a
    tool's parameters sit."""
    check_tool_count(tools, tools_param)
    budget = GrammarBudget()
    if text_format.type == "json_schema" and text_format.schema:
        budget.schema(text_format.schema, owner=f"response_format '{text_format.name or 'json_schema'}'",
                      param=f"{format_param}.schema", code="invalid_json_schema")
    for tool in tools:
        fmt = tool.format
        if fmt is not None:
            where = f"{tool.where or 'tools'}.format.definition"
            owner = f"custom tool '{tool.name}'"
            if fmt.syntax == "lark":
                budget.lark(fmt.definition or "", owner=owner, param=where)
            elif fmt.syntax == "regex":
                budget.regex(fmt.definition or "", owner=owner, param=where)
        elif tool.strict and tool.parameters:
            budget.schema(tool.parameters, owner=f"function '{tool.name}'", param=tool_param(tool.name),
                          code="invalid_function_parameters")
