"""The output grammar under harmony (gpt-oss): the answer's messages, on their channels.

The prompt ends with ``<|start|>assistant`` (the generation prompt); the model writes the
rest of that message's header, its content, and, when one message is followed by another
in the same generation, ``<|end|><|start|>assistant`` and the next header itself (this is
how openai_harmony renders a turn of several messages). What the grammar holds:

- ``analysis``, optional, first: ``<|channel|>analysis<|message|>TEXT<|end|>`` (free text).
- A preamble, optional, before a call only: ``<|channel|>commentary<|message|>TEXT<|end|>``
  (text for the user, no recipient).
- A call: ``<|channel|>commentary to=RECIPIENT <|constrain|>json<|message|>ARGS<|call|>``,
  or with the recipient first, as openai_harmony renders past calls
  (``to=RECIPIENT<|channel|>commentary <|constrain|>json<|message|>``). RECIPIENT is
  ``functions.NAME`` (a namespace's tools: ``NAMESPACE.NAME``); ARGS, compact JSON, the
  tool's schema (strict), ``{"input":STRING}`` (a custom tool: the string its grammar accepts, as the
  renderer declares it) or any JSON object. ``<|call|>`` ends the generation: one call
  per turn, whatever ``parallel_tool_calls`` says.
- The final answer: ``<|channel|>final<|message|>BODY<|return|>``, BODY free text, or the
  JSON value of ``text.format``.

Which of these may end the answer follows the mode (structured.py): a demanded call
(``tool_choice`` required or named) -> a call; a JSON format -> the final JSON (or a call
when tools may be called); ``auto`` with strict or custom tools -> the final text or a
call. ``<|return|>`` and ``<|call|>`` end the grammar when they are end-of-generation ids
of the tokenizer (llguidance then allows them only where the grammar is complete), else
they are spelled in it. Special tokens are named by id (``<[200005]>``): llguidance never
matches their text, and free text never holds them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ignis.engine.thinking import ThinkBudget
from ignis.output_parser import ParserConfig
from ignis.server.chat_formats.harmony_render import recipient
from ignis.server.structured import COMPACT, Checks, tool_arguments
from protocol.conversation import FunctionTool

__all__ = ["HARMONY_TOKENS", "HarmonyGrammar"]

HARMONY_TOKENS = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>")


def _lit(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


class HarmonyGrammar:
    """`structured.CallGrammar` for harmony; `ids` maps each of `HARMONY_TOKENS` to its id.
    JSON compact, as gpt-oss writes it (``{"location":"Paris"}``)."""

    json_layout = COMPACT

    def __init__(self, ids: Mapping[str, int]) -> None:
        missing = [t for t in HARMONY_TOKENS if t not in ids]
        if missing:
            raise ValueError(f"the vocabulary lacks harmony's tokens {missing}")
        self.ids = dict(ids)

    def _t(self, token: str) -> str:
        return f"<[{self.ids[token]}]>"

    def _closing(self, token: str, eos: frozenset[int]) -> str:
        """`token` at the end of the answer: nothing when it is an end-of-generation id
        (the grammar is complete there and llguidance allows the EOS ids), else itself."""
        return "" if self.ids[token] in eos else f" {self._t(token)}"

    def call_prefix(self, name: str, tools: Sequence[FunctionTool] = ()) -> str:
        """What the model writes after the generation prompt to open a call to `name`, up
        to its arguments (the channel-first form)."""
        where = recipient(name, {t.name: t for t in tools})
        return f"<|channel|>commentary to={where} <|constrain|>json<|message|>"

    def rules(self, *, mode: str, answer: bool, tools: Sequence[FunctionTool], parser: ParserConfig,
              tokenizer: Any, lt: Any, tool_param: Callable[[str], str], checks: Checks, parallel: bool,
              think_budget: ThinkBudget | None, thinking: bool | None) -> list[str]:
        """`structured.CallGrammar.rules`. A thinking budget bounds the analysis message's
        text (besides the effort harmony's system message states); Hermes's think tags do
        not apply."""
        t = self._t
        eos = frozenset(getattr(tokenizer, "eos_token_ids", ()) or ())
        # One message ends, the model opens the next one itself.
        next_message = f'{t("<|end|>")} {t("<|start|>")} "assistant"'
        thought = "thought" if think_budget is not None else "TEXT?"
        rules = [
            f'analysis: {t("<|channel|>")} "analysis" {t("<|message|>")} {thought} {next_message}',
            "TEXT: /(.|\\n)+/",
        ]
        if think_budget is not None:
            rules.append(f"thought[max_tokens={think_budget.tokens}]: /(.|\\n)*/")
        endings: list[str] = []
        if answer:
            rules.append(f'final: {t("<|channel|>")} "final" {t("<|message|>")} answer{self._closing("<|return|>", eos)}')
            endings.append("final")
        elif mode == "lazy":
            rules.append(f'final: {t("<|channel|>")} "final" {t("<|message|>")} TEXT?{self._closing("<|return|>", eos)}')
            endings.append("final")
        if tools:
            arg_rules, groups = tool_arguments(tools, lt, tool_param, checks, self.json_layout)
            rules += arg_rules
            by_name = {x.name: x for x in tools}
            calls = []
            for k, (group, args) in enumerate(groups):
                where = " | ".join(_lit(recipient(x.name, by_name)) for x in group)
                rules.append(f"to_{k}: {_lit(' to=')} ({where})")
                # channel first (what gpt-oss writes) or recipient first (how harmony renders past calls)
                header = (f'({t("<|channel|>")} "commentary" to_{k} " " | to_{k} {t("<|channel|>")} "commentary ")'
                          f' {t("<|constrain|>")} "json" {t("<|message|>")}')
                rules.append(f"call_{k}: {header} {args}{self._closing('<|call|>', eos)}")
                calls.append(f"call_{k}")
            rules.append(f'preamble: {t("<|channel|>")} "commentary" {t("<|message|>")} TEXT? {next_message}')
            rules.append(f"call: preamble? ({' | '.join(calls)})")
            endings.append("call")
        if not endings:  # (output_grammar never asks for nothing)
            raise ValueError("a harmony grammar needs an answer or a call")
        return [f"start: analysis? ({' | '.join(endings)})", *rules]
