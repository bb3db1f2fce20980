"""Chat formats: how one model family's prompts are written and its output read.

One object per format owns rendering (a `Renderer`-like object whose ``render`` gives a
`Prompt`), the output parser (a `Prompt` carries its own, `Prompt.output_parser()`), the
output grammar's spelling of its answer (`call_grammar`; a `Prompt` carries it too:
server/structured.py builds a JSON format, strict and custom tools and a demanded call
around it), and the opening of a call. The model family picks it: `Family.chat_template` names it when it
is a registered format (`FORMATS`), else the family's Jinja template is rendered with
Hermes-style tool calls (`ignis.model.chat_template.ChatTemplate.chat_format`).

==========  =====================================================================
format      what it is
==========  =====================================================================
hermes      the model's Jinja template; tools, calls and results as the template
            renders them, else a Hermes ``<tool_call>`` block (server/render.py);
            output read by ignis/output_parser.py
harmony     gpt-oss: openai_harmony renders and parses (chat_formats/harmony*.py)
==========  =====================================================================
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from ignis.output_parser import ParserConfig
from protocol.conversation import FunctionTool
from protocol.deltas import Delta

__all__ = ["ChatFormat", "FORMATS", "OutputReader", "chat_format"]


class OutputReader(Protocol):
    """A per-request output parser, as `ignis.server.turn.drive` uses it."""

    config: ParserConfig
    saw_tool_call: bool
    call_names: list[str]
    text_spans: list[tuple[int, int]]

    @property
    def settled(self) -> int: ...

    def feed_output(self, text: str, token_ids: Sequence[int]) -> list[Delta]: ...

    def finish(self) -> list[Delta]: ...


class ChatFormat(Protocol):
    name: str

    def renderer(self, tokenizer: Any, template: Any, *, reasoning: bool | None = None) -> Any: ...

    def output_parser(self, config: ParserConfig, tools: Sequence[FunctionTool] = ()) -> OutputReader: ...

    def call_grammar(self) -> Any:
        """How the output grammar spells this format's answer (server/structured.py's
        `CallGrammar`: its calls, channels or think tags)."""
        ...

    def call_prefix(self, name: str, tools: Sequence[FunctionTool] = ()) -> str:
        """The text that opens a call to `name`, up to its arguments."""
        ...


def _hermes() -> ChatFormat:
    from ignis.server.chat_formats.hermes import HermesFormat

    return HermesFormat()


def _harmony() -> ChatFormat:
    from ignis.server.chat_formats.harmony import HarmonyFormat

    return HarmonyFormat()


# Imported on first use: harmony's module needs openai_harmony only when a gpt-oss model is served.
FORMATS = {"hermes": _hermes, "harmony": _harmony}


def chat_format(name: str | None) -> ChatFormat:
    """The format registered as `name` (None: hermes)."""
    key = name or "hermes"
    if key not in FORMATS:
        raise ValueError(f"no chat format {name!r} (known: {sorted(FORMATS)})")
    return FORMATS[key]()
