"""The conversation -> prompt token ids, for both endpoints (one path, same tokens).

`Renderer.render(messages, tools, tool_choice, thinking=...)` takes the internal
conversation (`protocol.conversation`: what `protocol.responses_conversation.to_conversation`
and `protocol.chat_request.decode_chat_request` both produce) and renders it with the
model's own chat template through `ignis.model.chat_template.encode_chat` (client text
never becomes special tokens). Whatever the template cannot express is adapted here,
once, so both endpoints get the same prompt:

- ``developer`` messages become ``system`` when the template does not mention the
  developer role.
- Leading system messages are merged into one (joined by a blank line) when the
  template would drop all but the first (Codex sends two developer messages).
- Tools: when the template does not render the tool list (SmolLM2's ChatML), a
  Hermes-style block is added to the system prompt: the tools as JSON inside
  ``<tools></tools>`` and the instruction to answer with
  ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``, which is what
  `ignis.output_parser` reads back. Past calls then become that text in the
  assistant turn, and tool results a user turn wrapped in ``<tool_response>``.
- Reasoning of past turns (``reasoning_content``, restored from
  ``encrypted_content`` by the decoder) is passed on; the template decides whether
  the model sees it.

Each capability is probed once per template by rendering a marker conversation.
A template that refuses a conversation (``raise_exception``) is a 400 naming `param`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ignis.model.chat_template import ChatTemplate, ChatTemplateError, PromptTooLong, encode_chat
from ignis.model.token_cache import TokenCache, TokenCount
from ignis.model.tokenizer import Tokenizer
from ignis.output_parser import OutputParser, ParserConfig
from ignis.server.errors import text_too_long
from protocol.conversation import (
    ChatMessage,
    FunctionTool,
    ToolCall,
    ToolChoice,
    to_template_messages,
    to_template_tools,
)
from protocol.errors import Refusal

log = logging.getLogger(__name__)

__all__ = ["Prompt", "Renderer", "hermes_tools_block"]

_PROBE_FN = "ignis_probe_function_9f1c"
_PROBE_ARG = "ignis_probe_argument_9f1c"
_PROBE_RESULT = "ignis_probe_result_9f1c"
_PROBE_SYSTEM = "ignis_probe_second_system_9f1c"


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    parser: ParserConfig  # how to read the output (reasoning / tool tags, per request)
    truncated: int = 0  # messages dropped by truncation "auto"
    tokenized: int = 0  # tokens the tokenizer ran over (the rest came from the token cache)
    # The chat format's output parser, built from `parser` (ignis/server/chat_formats):
    # Hermes text through ignis.output_parser unless the format says otherwise.
    reader: Callable[[ParserConfig], Any] = OutputParser
    stop_token_ids: tuple[int, ...] = ()  # the format's stops, besides the model's EOS ids
    # Whether the server's output grammar (structured.py) fits this format's output; a
    # format it does not fit decodes unconstrained.
    constrained: bool = True
    # How the format spells a constrained answer (structured.CallGrammar); None: Hermes
    # calls and think tags.
    grammar: Any = None
    # The format's own reasoning message, (its opening ids, its closing id), which a thinking
    # budget bounds (harmony's <|channel|>analysis<|message|> ... <|end|>); None: the
    # parser's think tags.
    reasoning_block: tuple[tuple[int, ...], int] | None = None

    def output_parser(self) -> Any:
        """A fresh parser of this prompt's output (one per turn)."""
        return self.reader(self.parser)


def hermes_tools_block(tools: Sequence[FunctionTool], choice: ToolChoice) -> str:
    lines = "\n".join(json.dumps(t.to_template(), ensure_ascii=False) for t in tools)
    text = (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{lines}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )
    if choice.mode == "required":
        text += (
            f"\n\nYou must call the function {choice.name}." if choice.name else "\n\nYou must call at least one function."
        )
    return text


def oldest_droppable(messages: Sequence[ChatMessage]) -> int | None:
    """Where `truncation: "auto"` cuts next: the oldest message that is not a system or
    developer one, unless it is the last (None: nothing more may go)."""
    first = next((i for i, m in enumerate(messages) if m.role not in ("system", "developer")), None)
    return None if first is None or first == len(messages) - 1 else first


class Renderer:
    def __init__(self, tokenizer: Any, template: ChatTemplate, *, reasoning: bool | None = None) -> None:
        self.tokenizer = tokenizer
        self.template = template
        # The whole conversation is rendered every turn (cheap) but only text not seen
        # before is tokenized (see ignis/model/token_cache.py): same ids as a full pass.
        self.token_cache = TokenCache(tokenizer) if isinstance(tokenizer, Tokenizer) else None
        source = "\n".join(template.templates.values())
        self.has_developer = "developer" in source
        # Qwen3-style think tags: parse reasoning out of the output.
        # reasoning=None: decided by the template.
        self.reasoning_tags = (
            reasoning if reasoning is not None
            else "<think>" in source or tokenizer.token_to_id("<think>") is not None
        )
        # Llama 3 templates apply `tojson` to arguments: give them objects. Templates that
        # test `arguments is string` keep the exact text (the tokens the model produced).
        self.arguments_as_object = "arguments is string" not in source and "tojson" in source
        self.native_tools = self._probe(self._probe_tools)
        self.native_tool_calls = self._probe(self._probe_tool_calls)
        self.native_tool_results = self._probe(self._probe_tool_results)
        self.keeps_second_system = self._probe(self._probe_second_system)
        log.debug(
            "template: developer=%s tools=%s calls=%s results=%s second_system=%s reasoning=%s",
            self.has_developer, self.native_tools, self.native_tool_calls, self.native_tool_results,
            self.keeps_second_system, self.reasoning_tags,
        )

    # -- probes ---------------------------------------------------------------------

    @staticmethod
    def _probe(fn: Any) -> bool:
        try:
            return bool(fn())
        except Exception:  # noqa: BLE001 - a template that fails the probe lacks the feature
            return False

    def _text(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        return self.template.render(messages, tools=tools, add_generation_prompt=True)

    def _probe_tools(self) -> bool:
        tool = FunctionTool(_PROBE_FN, "probe", {"type": "object", "properties": {}})
        return _PROBE_FN in self._text([{"role": "user", "content": "hi"}], to_template_tools([tool]))

    def _probe_tool_calls(self) -> bool:
        call = ToolCall("call_probe", _PROBE_FN, json.dumps({"q": _PROBE_ARG}))
        msgs = [ChatMessage("user", "hi"), ChatMessage("assistant", "", tool_calls=(call,)),
                ChatMessage("tool", "ok", tool_call_id="call_probe", name=_PROBE_FN)]
        tool = FunctionTool(_PROBE_FN, "probe", {"type": "object", "properties": {}})
        text = self._text(to_template_messages(msgs, arguments_as_object=self.arguments_as_object), to_template_tools([tool]))
        return _PROBE_ARG in text

    def _probe_tool_results(self) -> bool:
        call = ToolCall("call_probe", _PROBE_FN, "{}")
        msgs = [ChatMessage("user", "hi"), ChatMessage("assistant", "", tool_calls=(call,)),
                ChatMessage("tool", _PROBE_RESULT, tool_call_id="call_probe", name=_PROBE_FN)]
        tool = FunctionTool(_PROBE_FN, "probe", {"type": "object", "properties": {}})
        text = self._text(to_template_messages(msgs, arguments_as_object=self.arguments_as_object), to_template_tools([tool]))
        return _PROBE_RESULT in text

    def _probe_second_system(self) -> bool:
        msgs = [{"role": "system", "content": "a"}, {"role": "system", "content": _PROBE_SYSTEM},
                {"role": "user", "content": "hi"}]
        return _PROBE_SYSTEM in self._text(msgs)

    # -- adaptation -----------------------------------------------------------------

    def adapt(
        self, messages: Sequence[ChatMessage], tools: Sequence[FunctionTool], choice: ToolChoice
    ) -> tuple[list[ChatMessage], list[FunctionTool] | None]:
        """The conversation as this template can render it, and the tools to pass it."""
        out: list[ChatMessage] = []
        hermes = not self.native_tools  # past calls and results in the format the tool block teaches
        for m in messages:
            if m.role == "developer" and not self.has_developer:
                m = replace(m, role="system")
            if m.tool_calls and (hermes or not self.native_tool_calls):
                text = "".join(
                    "\n<tool_call>\n" + json.dumps({"name": c.name, "arguments": c.arguments_object()}, ensure_ascii=False)
                    + "\n</tool_call>"
                    for c in m.tool_calls
                )
                m = replace(m, content=m.content + text if m.content else text.lstrip("\n"), tool_calls=())
            if m.role == "tool" and (hermes or not self.native_tool_results):
                m = ChatMessage("user", f"<tool_response>\n{m.content}\n</tool_response>")
            out.append(m)
        if not self.keeps_second_system:
            lead = 0
            while lead < len(out) and out[lead].role == "system":
                lead += 1
            if lead > 1:
                merged = ChatMessage("system", "\n\n".join(m.content for m in out[:lead]))
                out = [merged, *out[lead:]]
        if not tools:
            return out, None
        if self.native_tools:
            return out, list(tools)
        block = hermes_tools_block(tools, choice)
        if out and out[0].role == "system":
            out[0] = replace(out[0], content=f"{out[0].content}\n\n{block}" if out[0].content else block)
        else:
            out.insert(0, ChatMessage("system", block))
        return out, None

    # -- rendering ------------------------------------------------------------------

    def _encode(self, messages: Sequence[ChatMessage], tools: Sequence[FunctionTool], choice: ToolChoice,
                count: TokenCount, *, thinking: bool | None, generation: bool, param: str,
                max_tokens: int | None) -> list[int]:
        """The prompt's ids; raises `PromptTooLong` (before tokenizing) when the rendered text
        has more characters than `max_tokens` of the longest token could cover."""
        msgs, native = self.adapt(messages, tools, choice)
        longest = getattr(self.tokenizer, "max_token_bytes", None)
        try:
            return encode_chat(
                self.tokenizer,
                self.template,
                to_template_messages(msgs, arguments_as_object=self.arguments_as_object),
                tools=to_template_tools(native) if native else None,
                add_generation_prompt=generation,
                enable_thinking=thinking,
                token_cache=self.token_cache,
                token_count=count,
                max_chars=max_tokens * longest if max_tokens is not None and longest else None,
            )
        except ChatTemplateError as exc:
            if exc.raised:  # the template refused this conversation: the client's to fix
                raise Refusal(f"The model's chat template refused the conversation: {exc}", param=param,
                              code="invalid_value") from None
            raise Refusal(f"The conversation could not be rendered with the model's chat template: {exc}",
                          param=param, code="invalid_value") from None

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
        """Render and tokenize; with `truncate` (Responses ``truncation: "auto"``) drop the
        oldest non-system messages until the prompt fits in `max_tokens`. `effort` and
        `namespaces` (descriptions by name) are for formats that render them (harmony);
        a Jinja template gets neither."""
        messages = list(messages)
        count = TokenCount()
        over: PromptTooLong | None = None  # set while the prompt is surely over max_tokens

        def encode() -> list[int]:
            nonlocal over
            try:
                out = self._encode(messages, tools, choice, count, thinking=thinking, generation=generation,
                                   param=param, max_tokens=max_tokens)
            except PromptTooLong as exc:
                over = exc
                return []
            over = None
            return out

        ids = encode()
        dropped = 0
        if truncate and max_tokens is not None:
            while over is not None or len(ids) > max_tokens:
                first = oldest_droppable(messages)
                if first is None:
                    break  # only the last message left: the caller refuses
                del messages[first]
                dropped += 1
                try:
                    ids = encode()
                except Refusal:
                    continue  # e.g. a tool result without its call: drop more
        if over is not None:
            assert max_tokens is not None
            raise text_too_long(over.chars, max_tokens, param)
        if not ids:
            raise Refusal(f"The rendered prompt is empty: '{param}' has nothing to answer.", param=param,
                          code="empty_array")
        tools_on = bool(tools) and choice.mode != "none"
        starts = False
        if self.reasoning_tags and generation:
            tail = self.tokenizer.decode(ids[-6:], skip_special_tokens=False)
            starts = tail.rstrip().endswith("<think>")
        return Prompt(ids, ParserConfig(reasoning=self.reasoning_tags, tools=tools_on, starts_in_reasoning=starts), dropped,
                      count.tokenized)
