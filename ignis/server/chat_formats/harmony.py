"""gpt-oss's chat format, harmony: prompts rendered by `openai_harmony` (harmony_render),
output read by its streaming parser (harmony_parser), ``<|call|>`` and ``<|return|>`` as
stops (``<|end|>`` only ends one message: analysis, then the final answer, follow in one
generation)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

from ignis.output_parser import ParserConfig
from ignis.server.chat_formats.harmony_grammar import HARMONY_TOKENS, HarmonyGrammar
from ignis.server.chat_formats.harmony_parser import HarmonyParser
from ignis.server.chat_formats.harmony_render import build_conversation, render_ids
from ignis.server.chat_formats.o200k import harmony_encoding
from ignis.server.render import Prompt, oldest_droppable
from protocol.conversation import ChatMessage, FunctionTool, ToolChoice
from protocol.errors import Refusal

__all__ = ["HarmonyFormat", "HarmonyRenderer"]

log = logging.getLogger(__name__)


class HarmonyRenderer:
    """`Renderer`'s interface (server/render.py) for harmony: the conversation as
    openai_harmony renders it. Harmony tokenizes the whole prompt every turn (no token
    cache); its ids are o200k_harmony's, the gpt-oss tokenizer's."""

    token_cache = None

    def __init__(self, encoding: Any = None, *, today: Callable[[], str] | None = None) -> None:
        self.encoding = encoding if encoding is not None else harmony_encoding()
        self.today = today  # None: today's date (harmony's "Current date:")
        self.stop_token_ids = tuple(sorted(self.encoding.stop_tokens_for_assistant_actions()))  # <|return|>, <|call|>
        self.grammar = harmony_grammar(self.encoding)
        ids = self.grammar.ids  # the analysis message: what a thinking budget bounds
        self.reasoning_block = ((ids["<|channel|>"], *self.encoding.encode("analysis"), ids["<|message|>"]), ids["<|end|>"])

    def _ids(self, messages: Sequence[ChatMessage], tools: Sequence[FunctionTool], *, effort: str | None,
             namespaces: Mapping[str, str] | None, generation: bool, param: str) -> list[int]:
        conversation = build_conversation(messages, tools, effort=effort, namespaces=namespaces, today=self.today)
        try:
            return render_ids(self.encoding, conversation, generation=generation)
        except Exception as exc:  # noqa: BLE001 - HarmonyError: a conversation harmony cannot render
            raise Refusal(f"The conversation could not be rendered in the harmony format: {exc}", param=param,
                          code="invalid_value") from None

    def render(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[FunctionTool],
        choice: ToolChoice,
        *,
        thinking: bool | None = None,
        generation: bool = True,
        param: str = "input",
        max_tokens: int | None = None,
        truncate: bool = False,
        effort: str | None = None,
        namespaces: Mapping[str, str] | None = None,
    ) -> Prompt:
        """As `Renderer.render`; `thinking` is not used (gpt-oss always reasons: effort
        "none" renders as low)."""
        messages = list(messages)
        callable_tools = tuple(tools) if choice.mode != "none" else ()

        def ids() -> list[int]:
            return self._ids(messages, tools, effort=effort, namespaces=namespaces, generation=generation,
                             param=param)

        out = ids()
        dropped = 0
        while truncate and max_tokens is not None and len(out) > max_tokens:
            first = oldest_droppable(messages)
            if first is None:
                break  # only the last message left: the caller refuses
            del messages[first]
            dropped += 1
            out = ids()
        # Hermes think tags and tool tags do not apply: harmony's parser reads channels.
        config = ParserConfig(reasoning=False, tools=bool(callable_tools))
        return Prompt(out, config, dropped, len(out), reader=partial(HarmonyParser, self.encoding, tools=callable_tools),
                      stop_token_ids=self.stop_token_ids, grammar=self.grammar, reasoning_block=self.reasoning_block)


class HarmonyFormat:
    """The harmony chat format (gpt-oss)."""

    name = "harmony"

    def renderer(self, tokenizer: Any, template: Any, *, reasoning: bool | None = None) -> HarmonyRenderer:
        return HarmonyRenderer()

    def output_parser(self, config: ParserConfig, tools: Sequence[FunctionTool] = ()) -> HarmonyParser:
        return HarmonyParser(harmony_encoding(), config, tools)

    def call_grammar(self) -> HarmonyGrammar:
        return harmony_grammar(harmony_encoding())

    def call_prefix(self, name: str, tools: Sequence[FunctionTool] = ()) -> str:
        """What the model writes after the generation prompt (``<|start|>assistant``) to open
        a call to `name`, up to its arguments, as the grammar holds it."""
        return self.call_grammar().call_prefix(name, tools)


def harmony_grammar(encoding: Any) -> HarmonyGrammar:
    """The output grammar's spelling with the ids of harmony's tokens in `encoding`."""
    return HarmonyGrammar({t: encoding.encode(t, allowed_special="all")[0] for t in HARMONY_TOKENS})
