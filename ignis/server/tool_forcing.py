"""What tool_choice and a thinking budget demand of an answer, and what the server checks after it.

``tool_choice`` that demands a call: ``"required"`` (any of the tools), a named
function, or ``allowed_tools`` with mode ``required`` (the conversation's tool list is
already cut to the allowed ones) decode to ``ToolChoice(mode="required", name=...)``.
For those:

- The engine holds the answer to the grammar of "an optional think block, then calls
  to allowed tools" (ignis/server/structured.py): each call spelled as the Hermes tool
  block in the system prompt teaches it and as native templates (Qwen3) render past
  calls, its arguments the tool's schema (strict) or any JSON object.
- The server ends a turn that still holds no valid call to one of them ``failed``
  (`missing_call_message`, checked in turn.drive through ``ParserConfig.required_tools``):
  an output cut by its token limit, or a call the parser cannot read.

A thinking budget (``reasoning.effort``, chat's ``thinking.budget_tokens``; see
protocol/sampling.py) closes the think block after that many tokens (`think_budget`):
inside the output grammar when there is one, else the engine forces the closing tag
(ignis/engine/thinking.py). The think tags count only as single token ids: a template
whose closing tag is not one token cannot keep a budget.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ignis.engine.thinking import ThinkBudget
from ignis.output_parser import ParserConfig
from ignis.server.render import Prompt
from protocol.conversation import FunctionTool, ToolChoice

__all__ = ["call_prefix", "demand_calls", "missing_call_message", "required_tools", "think_budget"]


def required_tools(choice: ToolChoice, tools: Sequence[FunctionTool]) -> tuple[str, ...]:
    """The functions one of which the answer must call (empty: no call is demanded)."""
    if choice.mode != "required":
        return ()
    if choice.name is not None:
        return (choice.name,)
    return tuple(t.name for t in tools)


def demand_calls(prompt: Prompt, choice: ToolChoice, tools: Sequence[FunctionTool]) -> Prompt:
    """`prompt` with the required tools in its parser config (for the server's check)."""
    names = required_tools(choice, tools)
    return replace(prompt, parser=replace(prompt.parser, required_tools=names)) if names else prompt


def call_prefix(name: str, parser: ParserConfig) -> str:
    """The opening of a call to `name`, up to its arguments."""
    return f'{parser.tool_start}\n{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": '


def think_budget(parser: ParserConfig, tokenizer: Any, tokens: int | None, *, context: int,
                 block: tuple[tuple[int, ...], int] | None = None) -> ThinkBudget | None:
    """The engine's budget for a think block of at most `tokens` tokens under this
    template, or None: no budget asked, one the `context` length could never spend (any
    number a client sends, 10**30 included, is unbounded from there), the template does
    not reason, its closing tag is not one token, or the model could never be inside a
    block (the prompt did not open one and the opening tag is not one token either).
    `block`: the chat format's own reasoning message (`render.Prompt.reasoning_block`)."""
    if tokens is None or tokens >= context:
        return None
    if block is not None:
        opening, end = block
        return ThinkBudget(tokens, end, opening[-1], header=tuple(opening[:-1]))
    if not parser.reasoning:
        return None
    end = tokenizer.single_token_id(parser.think_end)
    start = tokenizer.single_token_id(parser.think_start)
    starts_open = parser.starts_in_reasoning
    if end is None or (start is None and not starts_open):
        return None
    return ThinkBudget(tokens, end, start, starts_open)


def missing_call_message(names: Sequence[str]) -> str:
    shown = ", ".join(names[:8]) + (f" (and {len(names) - 8} more)" if len(names) > 8 else "")
    which = f"the required tool {shown}" if len(names) == 1 else f"a required tool (one of {shown})"
    return (
        f"The model did not produce a valid call to {which}: tool_choice demands one, and its output "
        "holds no well-formed call."
    )
