"""Structured outputs: a request's JSON format and strict tools -> the engine's output grammar.

What is constrained (ignis/engine/grammar.py enforces it, from the first output token):

- ``text.format`` / chat ``response_format`` ``json_schema`` or ``json_object``: the
  answer is one JSON value of that schema (``strict: false`` schemas are compiled
  leniently: keywords the grammar engine does not know are ignored instead of refused).
  When tools may be called (``tool_choice`` auto), the answer is that JSON *or* tool
  calls, so an agent with an output type still uses its tools.
- A call demanded by ``tool_choice`` (required, a named function, allowed_tools
  required): the answer is calls, each ``<tool_call>\\n{"name": "NAME", "arguments":
  ARGS}\\n</tool_call>`` as the Hermes block in the system prompt teaches, with ARGS
  the tool's schema (strict), ``{"input": STRING}`` (custom) or any JSON object (not
  strict); ``parallel_tool_calls: false``: exactly one call. A request that sets
  ``stop`` or ``min_tokens`` with no strict or custom tool among the allowed ones keeps
  them instead, unconstrained (the server still fails a turn without a valid call);
  with one, they are refused.
- ``tool_choice: "auto"`` with a strict tool among the callable ones: free text, but
  each call the model opens (its ``<tool_call>`` tag, by id when the tag is one added
  token, else as text) is constrained as above from the tag on; with
  ``parallel_tool_calls: false`` at most one call, and nothing but whitespace after it.
  A request that sets ``stop`` or ``min_tokens`` keeps them instead, unconstrained
  (a grammar cannot honour them; a JSON format, or a demanded call with a strict or
  custom tool, refuses them).
- A reasoning template: an optional think block first (or the rest of the block the
  prompt opened; none when the request turns thinking off), free text up to the first
  closing tag; a thinking budget is a
  ``max_tokens`` on that text, after which the closing tag is the only choice.

A grammar the engine cannot compile is the client's: 400 with llguidance's message at
the schema's param (``text.format.schema``, ``tools[i].parameters``, ...). The whole
grammar is compiled once; only when that fails is each part compiled alone, to say
which one is at fault. Stop strings and ``min_tokens`` cannot be combined with a
grammar (400 at ``stop`` / ``min_tokens``). A custom tool's own grammar is compiled
alone first as well: its JSON-escaped form reads it more leniently than llguidance
does. The size, depth and cycle limits of every part were checked before
(ignis/server/grammar_bounds.py, called by prepare.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, Protocol

from ignis.engine.grammar import JSON_OPTIONS, Grammar, GrammarError, bounded_message, ll_tokenizer
from ignis.engine.thinking import ThinkBudget
from ignis.output_parser import ParserConfig
from ignis.server.freeform import FreeformError, json_string_rule, regex_literal
from ignis.server.tool_forcing import required_tools
from protocol.conversation import FunctionTool, ToolChoice
from protocol.errors import Refusal
from protocol.sampling import SamplingFields
from protocol.structured import TextFormat

__all__ = ["CallGrammar", "HERMES", "HermesGrammar", "output_grammar", "tool_arguments"]

_ANY_OBJECT: Mapping[str, Any] = {"type": "object"}
# How a chat format's model writes JSON (its separators, no other whitespace): Hermes-style
# templates show json.dumps's ", " and ": " (JSON_OPTIONS); gpt-oss writes harmony's
# arguments compact ({"location":"Paris"}, as openai-harmony's examples do).
JsonLayout = Mapping[str, str]
SPACED: JsonLayout = {"item_separator": JSON_OPTIONS["item_separator"], "key_separator": JSON_OPTIONS["key_separator"]}
COMPACT: JsonLayout = {"item_separator": ",", "key_separator": ":"}


def _with_options(schema: Mapping[str, Any], strict: bool, layout: JsonLayout = SPACED) -> dict[str, Any]:
    """The schema with the format's JSON layout (and leniency for non-strict schemas)."""
    options = dict(JSON_OPTIONS, **layout, lenient=not strict)
    return {**schema, "x-guidance": options}


Checks = list[Callable[[], None]]  # a part compiled alone: raises its Refusal when it fails


def _check(schema: Mapping[str, Any], strict: bool, tokenizer: Any, *, owner: str, param: str, code: str) -> None:
    try:
        Grammar.json_schema(_with_options(schema, strict)).check(tokenizer)
    except GrammarError as exc:
        raise Refusal(f"Invalid schema for {owner}: {exc}", param=param, code=code) from None


def _lit(text: str) -> str:
    """A Lark string literal (JSON's escapes are Lark's)."""
    return json.dumps(text, ensure_ascii=False)


def _tag(text: str, tokenizer: Any) -> str:
    """A template tag in the grammar: its token when the vocabulary has it as one added
    token (Qwen3's ``<tool_call>``; llguidance matches added tokens by id only, never by
    their text), else the literal."""
    token = (getattr(tokenizer, "added_tokens", None) or {}).get(text)
    return f"<[{token}]>" if token is not None else _lit(text)


def _json(schema: Mapping[str, Any], strict: bool, layout: JsonLayout = SPACED) -> str:
    return "%json " + json.dumps(_with_options(schema, strict, layout), ensure_ascii=False)


def _refuse_with_grammar(sampling: SamplingFields) -> None:
    if sampling.stop:
        raise Refusal("'stop' cannot be combined with a JSON output format or strict or custom tools: a stop "
                      "sequence would cut the constrained output before it is complete.", param="stop",
                      code="invalid_value")
    if sampling.min_tokens:
        raise Refusal("'min_tokens' cannot be combined with a JSON output format or strict or custom tools: the "
                      "grammar decides where the output ends.", param="min_tokens", code="invalid_value")


ToolArgs = list[tuple[list[FunctionTool], str]]  # tools and the rule of their arguments


def tool_arguments(tools: Sequence[FunctionTool], lt: Any, tool_param: Callable[[str], str],
                   checks: Checks, layout: JsonLayout = SPACED) -> tuple[list[str], ToolArgs]:
    """The rules of each tool's arguments, whatever the format spells around them: the
    tool's schema (strict), ``{"input": STRING}`` (custom: the string its grammar accepts)
    or, in one rule for all such tools (a grammar's symbols are bounded), any JSON object;
    each in the format's JSON `layout`."""
    input_open = _lit('{"input"' + layout["key_separator"])  # a custom tool's arguments: {"input": STRING}
    rules: list[str] = []
    groups: ToolArgs = []
    plain: list[FunctionTool] = []
    for k, tool in enumerate(tools):
        if tool.is_custom:
            rules.append(f"args_{k}: {input_open} input_{k} {_lit(chr(125))}")
            rules.append(f"input_{k}: {_custom_input(tool, lt)}")
        elif tool.strict and tool.parameters:
            checks.append(partial(_check, tool.parameters, True, lt, owner=f"function '{tool.name}'",
                                  param=tool_param(tool.name), code="invalid_function_parameters"))
            rules.append(f"args_{k}: {_json(tool.parameters, True, layout)}")
        else:
            plain.append(tool)
            continue
        groups.append(([tool], f"args_{k}"))
    if plain:
        rules.append(f"any_args: {_json(_ANY_OBJECT, False, layout)}")
        groups.append((plain, "any_args"))
    return rules, groups


def _call_rules(tools: Sequence[FunctionTool], parser: ParserConfig, tokenizer: Any, lt: Any,
                tool_param: Callable[[str], str], checks: Checks) -> list[str]:
    """Rules for one tool call block, ``call``: ``<tool_call>\\n{"name": "NAME",
    "arguments": ARGS}\\n</tool_call>`` as the Hermes block in the system prompt teaches
    it, ARGS the tool's schema (strict) or any JSON object; ``call_body`` is what follows
    the opening tag."""
    rules, groups = tool_arguments(tools, lt, tool_param, checks)
    names = []
    after_name = _lit(', "arguments": ')
    for group, args in groups:
        quoted = [_lit(json.dumps(t.name, ensure_ascii=False)) for t in group]
        if args == "any_args":
            rules.append(f"plain_name: {' | '.join(quoted)}")
            names.append(f"plain_name {after_name} any_args")
        else:
            names.append(f"{quoted[0]} {after_name} {args}")
    opening, closing = _lit('\n{"name": '), _lit("}\n")
    rules.append(f"call_body: {opening} ({' | '.join(names)}) {closing} {_tag(parser.tool_end, tokenizer)}")
    rules.append(f"call: {_tag(parser.tool_start, tokenizer)} call_body")
    return rules


def _check_custom(tool: FunctionTool, lt: Any, where: str) -> None:
    fmt = tool.format
    assert fmt is not None
    try:
        own = Grammar.lark(fmt.definition or "") if fmt.syntax == "lark" else Grammar.regex(fmt.definition or "")
        own.check(lt)
    except (GrammarError, ValueError) as exc:
        raise Refusal(f"Invalid grammar for custom tool '{tool.name}': {bounded_message(str(exc))}", param=where,
                      code="invalid_value") from None


def _custom_input(tool: FunctionTool, lt: Any) -> str:
    """The rule body of a custom tool's input (a JSON string its format accepts). A
    grammar llguidance rejects, or one that cannot be held inside a JSON string, is the
    client's: 400 at its definition."""
    fmt = tool.format
    assert fmt is not None
    where = f"{tool.where or 'tools'}.format.definition"
    if fmt.syntax is not None:  # as llguidance reads it (the JSON-escaped form below reads more leniently)
        _check_custom(tool, lt, where)
    try:
        return json_string_rule(fmt.syntax, fmt.definition)
    except FreeformError as exc:
        raise Refusal(f"Unsupported grammar for custom tool '{tool.name}': {bounded_message(str(exc))}",
                      param=where, code="invalid_value") from None


def _think(parser: ParserConfig, tokenizer: Any, body: str, budget: ThinkBudget | None,
           thinking: bool | None = None) -> list[str]:
    """``start``: the answer `body`, after an optional think block (or the rest of the one
    the prompt opened) when the template reasons and the request did not turn thinking
    off; at most `budget.tokens` tokens in it."""
    if not parser.reasoning or (thinking is False and not parser.starts_in_reasoning):
        return [f"start: {body}"]
    end = _tag(parser.think_end, tokenizer)
    if budget is not None:  # (a budget implies the closing tag is one token)
        think, rule = f"think {end}", f"think[max_tokens={budget.tokens}]: /(.|\\n)*/"
    elif end.startswith("<["):  # a token: free text up to it (its bytes are no text)
        think, rule = f"THINK? {end}", "THINK: /(.|\\n)+/"
    else:  # text: free text up to its first occurrence, which closes the block
        think, rule = "think_text", f"think_text[stop={end}]: /(.|\\n)*/"
    if parser.starts_in_reasoning:
        return [f"start: {think} WS? ({body})", rule]
    return [f"start: ({_tag(parser.think_start, tokenizer)} {think} WS?)? ({body})", rule]


def _lazy_calls(parser: ParserConfig, tokenizer: Any, parallel: bool) -> tuple[str, list[str]]:
    """Free text in which each tool call the model opens is constrained: the body and its
    rules. A tag that is one added token opens a call by its id; a text tag ends a lazy
    lexeme (free text up to its first occurrence). Free text never holds the tag's text,
    so whatever the output parser would read as a call is one the grammar held."""
    start = _tag(parser.tool_start, tokenizer)
    free = f"/(.|\\n)*/ & ~/(?s:.*){regex_literal(parser.tool_start)}(?s:.*)/"
    if start.startswith("<["):
        rules = [f"opened: TEXT {start} call_body"]
    else:
        rules = ["opened: text_then_tag call_body", f"text_then_tag[lazy]: /(.|\\n)*/ {start}"]
    rules.append(f"TEXT: {free}")
    if parallel:
        return "(opened)* TEXT", rules
    return "TEXT | opened WS?", rules


class CallGrammar(Protocol):
    """How a chat format spells a constrained answer around the shared parts (the rules
    ``answer``, a JSON format's value, and each tool's arguments, `tool_arguments`): its
    ``start`` rule and the rest. `mode`: "calls" (a demanded call), "answer" (a JSON
    format, or calls when tools may be called) or "lazy" (free text, each call held).
    `json_layout`: how the format's model writes JSON (arguments and a JSON answer)."""

    json_layout: JsonLayout

    def rules(self, *, mode: str, answer: bool, tools: Sequence[FunctionTool], parser: ParserConfig,
              tokenizer: Any, lt: Any, tool_param: Callable[[str], str], checks: Checks, parallel: bool,
              think_budget: ThinkBudget | None, thinking: bool | None) -> list[str]: ...


class HermesGrammar:
    """Hermes ``<tool_call>`` blocks after an optional think block (every format but harmony)."""

    json_layout = SPACED

    def rules(self, *, mode: str, answer: bool, tools: Sequence[FunctionTool], parser: ParserConfig,
              tokenizer: Any, lt: Any, tool_param: Callable[[str], str], checks: Checks, parallel: bool,
              think_budget: ThinkBudget | None, thinking: bool | None) -> list[str]:
        rules: list[str] = []
        alternatives = ["answer"] if answer else []
        if tools:
            rules += _call_rules(tools, parser, tokenizer, lt, tool_param, checks)
        if mode == "lazy":
            body, lazy_rules = _lazy_calls(parser, tokenizer, parallel)
            rules += lazy_rules
        else:
            if tools:
                rules.append("calls: call (WS? call)*" if parallel else "calls: call")
                alternatives.append("calls")
            body = " | ".join(alternatives)
        return [*_think(parser, tokenizer, body, think_budget, thinking), *rules]


HERMES = HermesGrammar()


def output_grammar(
    parser: ParserConfig,
    text_format: TextFormat,
    tools: Sequence[FunctionTool],
    choice: ToolChoice,
    sampling: SamplingFields,
    *,
    parallel: bool,
    tokenizer: Any,
    vocab_size: int,
    format_param: str,
    tool_param: Callable[[str], str],
    think_budget: ThinkBudget | None = None,
    spelling: CallGrammar | None = None,
) -> Grammar | None:
    """The grammar of the answer, or None when nothing is constrained. `tools` are the
    callable ones (already cut to the allowed ones); `format_param` is where the format's
    schema sits (``text.format`` / ``response_format.json_schema``); `tool_param(name)`
    where a tool's parameters sit; `think_budget` bounds the think block; `spelling` is the
    chat format's (None: Hermes). Compiles (and checks) with the tokenizer: call it off the
    event loop."""
    callable_tools = list(tools) if choice.mode != "none" else []
    answer_json = None
    if choice.mode == "required" and callable_tools:
        names = required_tools(choice, callable_tools)
        callable_tools = [t for t in callable_tools if t.name in names]
        if (sampling.stop or sampling.min_tokens) and not any(t.strict or t.is_custom for t in callable_tools):
            return None  # kept, unconstrained: the server's call check still applies
        mode = "calls"
    elif text_format.is_json:
        answer_json = text_format.schema if text_format.type == "json_schema" and text_format.schema else _ANY_OBJECT
        mode = "answer"
    elif any(t.strict or t.is_custom for t in callable_tools) and not (sampling.stop or sampling.min_tokens):
        mode = "lazy"  # (a stop string or min_tokens, which a grammar cannot keep, wins under auto)
    else:
        return None
    _refuse_with_grammar(sampling)
    lt = ll_tokenizer(tokenizer, vocab_size)
    rules: list[str] = []
    checks: Checks = []
    if answer_json is not None:
        strict_format = bool(text_format.strict)
        where = f"{format_param}.schema" if text_format.type == "json_schema" else format_param
        checks.append(partial(_check, answer_json, strict_format, lt,
                              owner=f"response_format '{text_format.name or 'json_object'}'", param=where,
                              code="invalid_json_schema"))
        rules.append(f"answer: {_json(answer_json, strict_format, (spelling or HERMES).json_layout)}")
    rules += (spelling or HERMES).rules(
        mode=mode, answer=answer_json is not None, tools=callable_tools, parser=parser, tokenizer=tokenizer, lt=lt,
        tool_param=tool_param, checks=checks, parallel=parallel, think_budget=think_budget,
        thinking=sampling.thinking)
    grammar = Grammar.lark("\n".join([*rules, "WS: /[ \\t\\r\\n]+/"]))
    try:
        return grammar.prepared(lt)  # its matcher built here (a compile thread; the caller waits)
    except GrammarError as exc:
        for check in checks:  # which part is at fault: each alone (raises its Refusal)
            check()
        # Every part compiles alone: a tag or name the grammar cannot hold.
        raise Refusal(f"The output grammar for this request does not compile: {exc}", param=None,
                      code="invalid_value") from None
