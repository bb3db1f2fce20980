"""The Jinja chat template with Hermes-style tool calls (``<tool_call>{...}</tool_call>``)
and ``<think>`` reasoning: every model family but gpt-oss. The pieces live where they
always did; this object is how the server reaches them through the registry."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ignis.output_parser import OutputParser, ParserConfig
from ignis.server.render import Renderer
from ignis.server.structured import HERMES, HermesGrammar
from ignis.server.tool_forcing import call_prefix
from protocol.conversation import FunctionTool

__all__ = ["HermesFormat"]


class HermesFormat:
    name = "hermes"

    def renderer(self, tokenizer: Any, template: Any, *, reasoning: bool | None = None) -> Renderer:
        return Renderer(tokenizer, template, reasoning=reasoning)

    def output_parser(self, config: ParserConfig, tools: Sequence[FunctionTool] = ()) -> OutputParser:
        return OutputParser(config)

    def call_grammar(self) -> HermesGrammar:
        return HERMES

    def call_prefix(self, name: str, tools: Sequence[FunctionTool] = ()) -> str:
        return call_prefix(name, ParserConfig())
