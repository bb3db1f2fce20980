"""Harmony output tokens -> `protocol.deltas`, through openai_harmony's `StreamableParser`.

The same deltas `ignis.output_parser` makes of Hermes text, so the Responses and chat
encoders work unchanged:

- ``analysis`` content (no recipient) -> `ReasoningDelta`, streamed as it comes.
- ``final`` content, and ``commentary`` content with no recipient (a preamble shown to the
  user) -> `TextDelta`, streamed.
- A message with a recipient (``to=functions.NAME``, a namespace's ``NAMESPACE.NAME``)
  is a call, buffered to its end (``<|call|>``, or ``<|end|>``) as the Hermes parser
  buffers a block: ``ToolCallStart(name)`` (``functions.`` dropped, a namespace's prefix
  kept: the stream encoder knows the tool by its qualified name), ONE ``ToolCallArguments``
  with the content exactly as written, ``ToolCallEnd()``. Arguments must be a JSON object;
  a custom tool's arguments are ``{"input": ...}`` (what the model is taught), and any
  other content of a call to one is taken as the input itself. A call whose arguments are
  not an object is not a call: its content becomes answer text (as a malformed Hermes
  block does).
- At `finish()` (end of generation) the open message is closed as harmony's
  ``process_eos`` closes it; an open call counts only when its arguments are complete, and
  output with no harmony header at all (plain words) is answer text.

Content is kept exactly (no whitespace stripped): re-rendering a turn gives the tokens the
model produced. Never raises: tokens harmony's parser refuses, and everything after them,
become answer text. Logprobs are not placed on harmony text (`text_spans` stays empty).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from ignis.output_parser import ParserConfig, coalesce
from protocol.conversation import FunctionTool
from protocol.deltas import Delta, ReasoningDelta, TextDelta, ToolCallArguments, ToolCallEnd, ToolCallStart

__all__ = ["HarmonyParser"]

log = logging.getLogger(__name__)

_END_TOKENS = ("<|end|>", "<|call|>", "<|return|>")


def _object_text(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except (ValueError, RecursionError):
        return False


class HarmonyParser:
    """One per request: `feed_output` each engine output's text and token ids, then
    `finish` once. The attributes the server reads are the Hermes parser's."""

    def __init__(self, encoding: Any, config: ParserConfig, tools: Sequence[FunctionTool] = ()) -> None:
        from openai_harmony import Role, StreamableParser

        self.config = config
        self._encoding = encoding
        self._parser = StreamableParser(encoding, Role.ASSISTANT, strict=False)
        self._ends = frozenset(encoding.encode(t, allowed_special="all")[0] for t in _END_TOKENS)
        self._tools: Mapping[str, FunctionTool] = {t.name: t for t in tools}
        self._channel: str | None = None  # the open message's, once its header is read
        self._recipient: str | None = None
        self._call: list[str] | None = None  # the open call's content so far
        self._broken = False  # harmony refused a token: the rest is text
        self._header: list[int] = []  # the open message's tokens before its content
        self._fed = 0
        self._done = False
        #: Always empty: logprobs are not routed onto harmony text.
        self.text_spans: list[tuple[int, int]] = []
        self.saw_tool_call = False
        self.call_names: list[str] = []

    @property
    def settled(self) -> int:
        return self._fed

    # -- the server's interface --------------------------------------------------------

    def feed_output(self, text: str, token_ids: Sequence[int]) -> list[Delta]:
        """The deltas of one engine output (harmony reads the ids; `text` is only counted)."""
        self.text_spans = []
        self._fed += len(text)
        if self._done:
            return []
        out: list[Delta] = []
        for token in token_ids:
            self._token(int(token), out)
        return coalesce(out)

    def finish(self) -> list[Delta]:
        self.text_spans = []
        if self._done:
            return []
        self._done = True
        out: list[Delta] = []
        if self._call is not None:
            self._close_call(out, final=True)
        elif self._channel is None and self._header and not any(self._encoding.is_special_token(t) for t in self._header):
            out.append(TextDelta(self._encoding.decode(self._header)))  # plain text, no harmony header at all
        self._channel = self._recipient = None
        return coalesce(out)

    # -- tokens ------------------------------------------------------------------------

    def _token(self, token: int, out: list[Delta]) -> None:
        if self._broken:
            out.append(TextDelta(self._encoding.decode([token])))
            return
        parser = self._parser
        ending = token in self._ends
        if ending and self._channel is None and self._recipient is None:  # a message with no content
            self._recipient = parser.current_recipient
            if self._is_call():
                self._call = []
        try:
            parser.process(token)
        except Exception as exc:  # noqa: BLE001 - HarmonyError: not harmony; keep it as text
            log.debug("harmony parser refused token %d: %s", token, exc)
            self._broken = True
            if self._call is not None:
                out.append(TextDelta("".join(self._call)))
                self._call = None
            out.append(TextDelta(self._encoding.decode([token])))
            return
        if self._channel is None:
            self._header.append(token)
        if ending:
            self._header = []
            if self._call is not None:
                self._close_call(out, final=False)
            self._channel = self._recipient = None
            return
        delta = parser.last_content_delta
        if not delta:
            return
        if self._channel is None:  # the first content of a message: its header is complete
            self._header = []
            self._channel = parser.current_channel or "final"
            self._recipient = parser.current_recipient
            if self._is_call():
                self._call = []
        if self._call is not None:
            self._call.append(delta)
        elif self._channel == "analysis":
            out.append(ReasoningDelta(delta))
        else:
            out.append(TextDelta(delta))

    def _is_call(self) -> bool:
        r = self._recipient
        return bool(r) and r not in ("assistant", "user", "all")

    def _name(self) -> str:
        r = self._recipient or ""
        if r in self._tools:
            return r
        return r[len("functions."):] if r.startswith("functions.") else r

    def _close_call(self, out: list[Delta], *, final: bool) -> None:
        """The open call ended (`final`: cut by the end of generation)."""
        content = "".join(self._call or ())
        self._call = None
        name = self._name()
        tool = self._tools.get(name)
        arguments = content if content.strip() else "{}"
        if _object_text(arguments):
            pass
        elif tool is not None and tool.is_custom and not final:
            arguments = json.dumps({"input": content}, ensure_ascii=False)
        else:
            out.append(TextDelta(content))
            return
        out += [ToolCallStart(name), ToolCallArguments(arguments), ToolCallEnd()]
        self.saw_tool_call = True
        self.call_names.append(name)
