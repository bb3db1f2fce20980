"""What the engine must enforce on an answer, and what the server checks after it.

``tool_choice`` that demands a call: ``"required"`` (any of the tools), a named
function, or ``allowed_tools`` with mode ``required`` (the conversation's tool list is
already cut to the allowed ones) decode to ``ToolChoice(mode="required", name=...)``.
For those:

- The engine forces the answer's first tokens (after an optional think block) to
  spell the opening of a call, one choice per allowed function, exactly as the Hermes
  tool block in the system prompt teaches it and as native templates (Qwen3) render
  past calls: ``<tool_call>\\n{"name": "NAME", "arguments": `` (see
  ignis/engine/constraint.py). The arguments are the model's.
- The server ends a turn that still holds no valid call to one of them ``failed``
  (`missing_call_message`, checked in generation.drive through
  ``ParserConfig.required_tools``).

A thinking budget (``reasoning.effort``, chat's ``thinking.budget_tokens``; see
protocol/sampling.py) closes the think block after that many tokens: the engine forces
the closing tag, and the answer follows.

Not forced (the tool check still applies): vocabularies without token bytes (not
byte-level BPE). Think tags that are not single token ids: forcing starts at once,
and a budget cannot be kept.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ignis.engine.constraint import OutputConstraint, token_index
from ignis.output_parser import ParserConfig
from ignis.server.render import Prompt
from protocol.conversation import FunctionTool, ToolChoice
from protocol.errors import Refusal

__all__ = ["call_prefix", "constrain_output", "missing_call_message", "required_tools", "with_grammar"]


def required_tools(choice: ToolChoice, tools: Sequence[FunctionTool]) -> tuple[str, ...]:
    """The functions one of which the answer must call (empty: no call is demanded)."""
    if choice.mode != "required":
        return ()
    if choice.name is not None:
        return (choice.name,)
    return tuple(t.name for t in tools)


def call_prefix(name: str, parser: ParserConfig) -> str:
    """The opening of a call to `name`, up to its arguments."""
    return f'{parser.tool_start}\n{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": '


def constrain_output(
    prompt: Prompt,
    choice: ToolChoice,
    tools: Sequence[FunctionTool],
    tokenizer: Any,
    vocab_size: int,
    *,
    think_budget: int | None = None,
    stop: Sequence[str] = (),
) -> tuple[Prompt, OutputConstraint | None]:
    """`prompt` with the required tools in its parser config, and the constraint that
    forces a call to one of them and keeps the think block within `think_budget` (None
    when there is nothing to enforce, or the vocabulary has no token bytes). Builds the
    engine's token index on first use (off the engine's thread: callers run in a worker
    thread). A `stop` string that would cut the forced text is the client's mistake: a
    400 on ``stop``, not a turn that fails for certain."""
    names = required_tools(choice, tools)
    parser = prompt.parser
    if names:
        prompt = replace(prompt, parser=replace(parser, required_tools=names))
    if not getattr(tokenizer, "is_byte_level", False):
        return prompt, None
    think_start = think_end = None
    if parser.reasoning:
        think_start, think_end = tokenizer.single_token_id(parser.think_start), tokenizer.single_token_id(parser.think_end)
    if think_end is None:
        think_budget = None  # no block to close, or no single token to close it with
    if not names and think_budget is None:
        return prompt, None
    choices = [call_prefix(n, parser) for n in names]
    for text in stop:
        if any(_cuts(text, c) for c in choices):
            raise Refusal(
                f"Invalid 'stop': {text!r} would cut the start of the tool call that 'tool_choice' demands "
                f"({choices[0]!r}...); use stop sequences that cannot occur in it.",
                param="stop", code="invalid_value",
            )
    constraint = OutputConstraint(
        tuple(c.encode("utf-8") for c in choices),
        think_start_id=think_start,
        think_end_id=think_end,
        starts_in_reasoning=parser.reasoning and parser.starts_in_reasoning,
        think_budget=think_budget,
    )
    token_index(tokenizer, vocab_size)
    return prompt, constraint


def _cuts(stop: str, forced: str) -> bool:
    """Whether a match of `stop` could begin inside `forced` (the text the engine writes
    itself): it occurs in it, or it begins with an end of it."""
    return stop in forced or any(stop.startswith(forced[k:]) for k in range(1, len(forced)))


def missing_call_message(names: Sequence[str]) -> str:
    shown = ", ".join(names[:8]) + (f" (and {len(names) - 8} more)" if len(names) > 8 else "")
    which = f"the required tool {shown}" if len(names) == 1 else f"a required tool (one of {shown})"
    return (
        f"The model did not produce a valid call to {which}: tool_choice demands one, and its output "
        "holds no well-formed call."
    )


def with_grammar(constraint: OutputConstraint | None, grammar: Any) -> OutputConstraint | None:
    """The constraint to keep beside an output grammar (ignis/server/structured.py): the
    grammar spells any demanded call itself, so only the thinking budget stays."""
    if grammar is None or constraint is None:
        return constraint
    if constraint.think_budget is None:
        return None
    return replace(constraint, choices=())
