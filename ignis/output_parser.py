"""Per-request output parser: the model's streamed text -> `protocol.deltas`.

The engine detokenizes each request's sampled tokens incrementally and hands the new
text to `OutputParser.feed` (chunk boundaries are arbitrary: a chunk may end inside
a tag, ``"<too"``). The parser answers with `ReasoningDelta`, `TextDelta` and
`ToolCallStart` / `ToolCallArguments` / `ToolCallEnd`; at the end of generation
`finish()` flushes whatever was held back. It never produces `Finish` / `Failure`
(the server does) and never raises on any text. `saw_tool_call` tells the server
to report finish reason ``tool_calls``.

Grammar (tags configurable per model through `ParserConfig`; Qwen3 / Hermes shown)::

    output    := [ws* "<think>"] reasoning ["</think>" ws*] answer     (reasoning=True)
               | reasoning ["</think>" ws*] answer                     (starts_in_reasoning)
    answer    := ( text | "<tool_call>" json "</tool_call>" )*

Documented choices
------------------
Reasoning
    * Only a think block at the very START of the output is reasoning: the opening
      tag may be preceded by whitespace (dropped), nothing else. Once any answer text
      or tool call has been emitted, or after the first block closed, ``<think>`` and
      ``</think>`` are plain text. With ``starts_in_reasoning`` (the prompt already
      ends with the opening tag) the output starts inside the block.
    * Inside the block everything up to the FIRST closing tag is reasoning, tool-call
      tags included (no tool calls are recognised inside reasoning).
    * Whitespace stripped (``str.isspace`` characters, as ``str.strip()``): the
      reasoning text's leading and trailing whitespace, and ALL whitespace right after
      the closing tag (the answer never starts with whitespace after a think block).
      Qwen3's template strips ``"\\n"`` at these places when it re-renders a turn; we
      strip any whitespace. Trailing whitespace inside the block is therefore held
      back until non-space reasoning follows (it is then emitted) or the block ends
      (it is dropped). An unterminated block at `finish()` is reasoning, with its
      trailing whitespace dropped; an empty block produces no delta.
    * ``reasoning=False``: think tags are plain text everywhere (and
      ``starts_in_reasoning`` is ignored).

Tool calls (Hermes style, several per turn)
    * ``<tool_call>`` opens a block wherever it appears in the answer (at any point,
      after text too); the block is buffered (not streamed) up to the FIRST
      ``</tool_call>`` and then parsed as ONE JSON object with a non-empty string
      ``"name"`` and ``"arguments"`` (falling back to ``"parameters"``) that is an
      object, a JSON string holding an object, or missing / null (= ``{}``). Other
      keys are ignored; duplicate keys: the last wins (as ``json.loads``); NaN and
      Infinity are not JSON and make the block malformed. JSON whitespace around the
      object is allowed.
    * Valid: ``ToolCallStart(name)`` (``call_id=None``: the stream encoder makes a
      fresh one), ONE ``ToolCallArguments`` with the arguments text, ``ToolCallEnd()``.
      Argument text = the model's ORIGINAL text of the arguments object, exactly as
      it appears in the block (key order, spacing, escapes preserved; so re-rendering
      the call reproduces the sampled tokens). When the arguments were given as a
      JSON string, its decoded content stripped of surrounding whitespace; when
      missing / null, ``"{}"``. It is always strict JSON text of an object.
    * Malformed (bad JSON, missing name, arguments not an object, ...): the whole
      block, tags included, becomes answer text, as does an unterminated block at
      `finish()`. Never an exception.
    * Whitespace: a whitespace-only stretch of answer text is dropped when it sits
      between two calls, before the first call at the start of the answer, or after
      the last call at the end of the output. Text that is not whitespace-only is
      kept whole (``"Let me look.\\n\\n"`` before a call keeps its newlines), and so
      is whitespace before a malformed block (that block is text, so the stretch is
      not whitespace-only). Whitespace after a call is held back until the parser
      knows which case applies.
    * ``tools=False``: ``<tool_call>`` is plain text.

Latency
    Text is emitted as soon as it cannot be part of a tag: only the longest suffix
    that is a proper prefix of a tag that could open (or close) here is held back,
    plus the whitespace the rules above may drop. ``"a < b"`` fed as ``"a <"`` gives
    ``"a "`` at once and ``"< b"`` with the next chunk. The deltas of one `feed` are
    coalesced; empty deltas are never emitted. The parser sees text only: logprobs
    are attached by the caller, which `text_spans` helps place.

Where the answer text came from
    Every `TextDelta` is a contiguous stretch of the input (text as fed, a malformed
    block with its tags and the whitespace before it included). After each `feed` /
    `finish`, `text_spans` lists the input stretches, as ``(start, end)`` character
    offsets into the concatenation of everything fed, of the answer text that call
    emitted, in order; their texts, concatenated, are that call's `TextDelta` texts.
    Reasoning, tool-call blocks and dropped whitespace are in no span. `settled` is the
    offset before which every character has been emitted or dropped for good.

Invariants (checked in tests/test_output_parser.py): the coalesced deltas do not
depend on how the text is chunked; with ``reasoning=False, tools=False`` the text out
equals the text in exactly; with any config, text containing neither opening tag
(and not ``starts_in_reasoning``) comes out unchanged as text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from json.decoder import scanstring
from typing import Any, Iterable, Sequence

from protocol.deltas import (
    Delta,
    ReasoningDelta,
    TextDelta,
    ToolCallArguments,
    ToolCallEnd,
    ToolCallStart,
)

__all__ = ["ParserConfig", "OutputParser", "coalesce", "parse_tool_call"]


@dataclass(frozen=True, slots=True)
class ParserConfig:
    """How one model marks reasoning and tool calls, and what this request enables.

    `reasoning` / `tools` are per request: ``tools=False`` when the request had no
    tools or ``tool_choice: "none"``. `required_tools`: the output must hold a valid
    call to one of these (``tool_choice: "required"`` or a named function; empty: no
    requirement); the parser only records the calls it sees (`call_names`), the
    server judges. Tags must be non-empty and must not start with whitespace."""

    think_start: str = "<think>"
    think_end: str = "</think>"
    tool_start: str = "<tool_call>"
    tool_end: str = "</tool_call>"
    starts_in_reasoning: bool = False
    reasoning: bool = True
    tools: bool = True
    required_tools: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for field in ("think_start", "think_end", "tool_start", "tool_end"):
            tag = getattr(self, field)
            if not isinstance(tag, str) or not tag or tag[0].isspace():
                raise ValueError(f"ParserConfig.{field} must be a non-empty string not starting with whitespace: {tag!r}")


def coalesce(deltas: Iterable[Delta]) -> list[Delta]:
    """Merge adjacent `ReasoningDelta`s, `TextDelta`s (logprobs concatenated) and
    `ToolCallArguments`; drop empty ones. Other deltas pass through unchanged."""
    out: list[Delta] = []
    for d in deltas:
        t = type(d)
        if t is TextDelta:
            if not d.text and not d.logprobs:
                continue
            if out and type(out[-1]) is TextDelta:
                prev = out[-1]
                lp = None if prev.logprobs is None and d.logprobs is None else (prev.logprobs or ()) + (d.logprobs or ())
                out[-1] = TextDelta(prev.text + d.text, lp)
                continue
        elif t is ReasoningDelta or t is ToolCallArguments:  # one string each: text, chunk
            piece = d.text if t is ReasoningDelta else d.chunk
            if not piece:
                continue
            if out and type(out[-1]) is t:
                last = out[-1]
                out[-1] = t((last.text if t is ReasoningDelta else last.chunk) + piece)
                continue
        out.append(d)
    return out


# -- tool-call JSON ----------------------------------------------------------------

_JSON_WS = re.compile(r"[ \t\n\r]*")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def _members(s: str) -> dict[str, tuple[Any, str]] | None:
    """The top-level members of the JSON object `s` (JSON whitespace around it
    allowed) as ``key -> (value, exact source text of the value)``, or None when `s`
    is not exactly one JSON object. May raise (callers catch everything)."""
    ws = _JSON_WS.match
    i = ws(s, 0).end()
    if s[i : i + 1] != "{":
        return None
    i = ws(s, i + 1).end()
    out: dict[str, tuple[Any, str]] = {}
    if s[i : i + 1] == "}":
        i += 1
    else:
        while True:
            if s[i : i + 1] != '"':
                return None
            key, i = scanstring(s, i + 1, True)
            i = ws(s, i).end()
            if s[i : i + 1] != ":":
                return None
            i = ws(s, i + 1).end()
            value, end = _DECODER.raw_decode(s, i)
            out[key] = (value, s[i:end])
            i = ws(s, end).end()
            c = s[i : i + 1]
            if c == ",":
                i = ws(s, i + 1).end()
            elif c == "}":
                i += 1
                break
            else:
                return None
    if ws(s, i).end() != len(s):
        return None
    return out


def parse_tool_call(body: str) -> tuple[str, str] | None:
    """``(name, arguments JSON text)`` for the body of a tool-call block (the text
    between the tags), or None when it is not a valid call. Never raises."""
    try:
        members = _members(body)
        if members is None:
            return None
        name = members.get("name", (None, ""))[0]
        if not isinstance(name, str) or not name:
            return None
        entry = members.get("arguments", members.get("parameters"))
        if entry is None or entry[0] is None:
            return name, "{}"
        value, raw = entry
        if isinstance(value, dict):
            return name, raw
        if isinstance(value, str):
            text = value.strip()
            if isinstance(_DECODER.decode(text), dict):
                return name, text
        return None
    except Exception:  # JSONDecodeError, RecursionError (deep nesting), int-digits limit, ...
        return None


# -- the parser --------------------------------------------------------------------

_WS_HOLD = 0  # answer start / after a call: hold whitespace, look for an opening tag
_TEXT = 1  # answer text; look for the tool-call tag
_REASONING = 2  # inside the think block
_AFTER_THINK = 3  # drop whitespace after the closing think tag
_TOOL = 4  # inside a tool-call block: buffer up to the closing tag
_DONE = 5  # finish() was called


def _held(s: str, tag: str) -> int:
    """Length of the longest suffix of `s` that is a proper prefix of `tag`."""
    for k in range(min(len(s), len(tag) - 1), 0, -1):
        if s.endswith(tag[:k]):
            return k
    return 0


class OutputParser:
    """Stateful, one per request. `feed` each new piece of detokenized text, then
    call `finish` once at the end of generation. See the module docstring."""

    __slots__ = (
        "config", "saw_tool_call", "call_names", "text_spans", "_state", "_buf", "_think_allowed", "_after_call", "_reasoning_start", "_pending_ws", "_parts",
        "_fed", "_block_start",
    )

    def __init__(self, config: ParserConfig | None = None) -> None:
        self.config = config = config if config is not None else ParserConfig()
        self._buf = ""
        self._after_call = False  # in _WS_HOLD: whitespace at the end is dropped
        self._reasoning_start = True  # in _REASONING: leading whitespace is dropped
        self._pending_ws = ""  # whitespace dropped before a tool block, restored if it is malformed
        self._parts: list[str] = []  # in _TOOL: the block's text before _buf
        # Characters fed so far: _buf is always the input's last len(_buf) characters,
        # so buf[k] sits at offset _fed - len(buf) + k.
        self._fed = 0
        self._block_start = 0  # in _TOOL: input offset of the block (its _pending_ws first)
        #: The input spans of the answer text the last `feed` / `finish` emitted.
        self.text_spans: list[tuple[int, int]] = []
        #: True once a `ToolCallStart` was emitted (finish reason ``tool_calls``).
        self.saw_tool_call = False
        #: The names of the valid calls emitted so far, in order.
        self.call_names: list[str] = []
        if config.reasoning and config.starts_in_reasoning:
            self._state = _REASONING
            self._think_allowed = False
        else:
            self._state = _WS_HOLD
            self._think_allowed = config.reasoning

    def feed(self, text: str) -> list[Delta]:
        """The deltas that `text` (the next piece of output) makes certain."""
        self.text_spans = []
        if not text or self._state == _DONE:
            return []
        self._buf += text
        self._fed += len(text)
        out: list[Delta] = []
        self._run(out, final=False)
        return coalesce(out)

    def feed_output(self, text: str, token_ids: Sequence[int] = ()) -> list[Delta]:
        """One engine output (the chat-format parser interface, ignis/server/chat_formats):
        Hermes output is read as text, so only `text` counts."""
        return self.feed(text) if text else []

    def finish(self) -> list[Delta]:
        """End of generation: flush what was held back. Later calls (and feeds) give []."""
        self.text_spans = []
        if self._state == _DONE:
            return []
        out: list[Delta] = []
        self._run(out, final=True)
        self._buf = ""
        self._state = _DONE
        return coalesce(out)

    @property
    def settled(self) -> int:
        """Input offset before which every character was emitted or dropped for good
        (what follows is held back: a possible tag, whitespace, a tool-call block)."""
        if self._state == _TOOL:
            return self._block_start
        return self._fed - len(self._buf)

    def _emit_text(self, out: list[Delta], text: str, start: int) -> None:
        """Answer text that sits at input offset `start`."""
        out.append(TextDelta(text))
        if text:
            self.text_spans.append((start, start + len(text)))

    # -- states ----------------------------------------------------------------------

    def _run(self, out: list[Delta], final: bool) -> None:
        step = (self._ws_hold, self._text, self._reasoning, self._after_think, self._tool)
        while step[self._state](out, final):
            pass

    def _ws_hold(self, out: list[Delta], final: bool) -> bool:
        cfg = self.config
        buf = self._buf
        rest = buf.lstrip()
        ws = buf[: len(buf) - len(rest)]
        tags = []  # (tag, is the think tag), think first
        if self._think_allowed:
            tags.append((cfg.think_start, True))
        if cfg.tools:
            tags.append((cfg.tool_start, False))
        for tag, think in tags:
            if rest.startswith(tag):
                self._buf = rest[len(tag) :]
                self._think_allowed = False
                if think:  # whitespace before the think block is dropped
                    self._state = _REASONING
                    self._reasoning_start = True
                else:  # restored if the block turns out malformed
                    self._state = _TOOL
                    self._pending_ws = ws
                    self._block_start = self._fed - len(buf)
                return True
        if not final and any(tag.startswith(rest) for tag, _ in tags):
            return False  # whitespace and maybe the start of a tag: wait
        self._think_allowed = False
        if final and not rest and self._after_call:
            self._buf = ""  # trailing whitespace after the last call
            return False
        self._state = _TEXT
        return True

    def _text(self, out: list[Delta], final: bool) -> bool:
        cfg = self.config
        buf = self._buf
        if cfg.tools:
            i = buf.find(cfg.tool_start)
            if i >= 0:
                if i:
                    self._emit_text(out, buf[:i], self._fed - len(buf))
                self._buf = buf[i + len(cfg.tool_start) :]
                self._state = _TOOL
                self._pending_ws = ""
                self._block_start = self._fed - len(buf) + i
                return True
            keep = 0 if final else _held(buf, cfg.tool_start)
        else:
            keep = 0
        cut = len(buf) - keep
        if cut:
            self._emit_text(out, buf[:cut], self._fed - len(buf))
            self._buf = buf[cut:]
        return False

    def _reasoning(self, out: list[Delta], final: bool) -> bool:
        cfg = self.config
        buf = self._buf
        if self._reasoning_start:
            buf = buf.lstrip()
            if not buf:
                self._buf = ""
                return False
            self._reasoning_start = False
        i = buf.find(cfg.think_end)
        if i >= 0:
            text = buf[:i].rstrip()
            if text:
                out.append(ReasoningDelta(text))
            self._buf = buf[i + len(cfg.think_end) :]
            self._state = _AFTER_THINK
            return True
        if final:
            text = buf.rstrip()
            if text:
                out.append(ReasoningDelta(text))
            self._buf = ""
            return False
        cut = len(buf) - _held(buf, cfg.think_end)
        while cut and buf[cut - 1].isspace():
            cut -= 1
        if cut:
            out.append(ReasoningDelta(buf[:cut]))
        self._buf = buf[cut:]
        return False

    def _after_think(self, out: list[Delta], final: bool) -> bool:
        self._buf = self._buf.lstrip()
        if not self._buf:
            return False
        self._state = _WS_HOLD
        self._after_call = False
        return True

    def _tool(self, out: list[Delta], final: bool) -> bool:
        # The block's text so far is "".join(self._parts) + self._buf; _buf keeps only
        # what may still hold the start of the closing tag, so feeding stays linear.
        cfg = self.config
        buf = self._buf
        i = buf.find(cfg.tool_end)
        if i < 0:
            if final:  # unterminated: not a call, plain text
                text = self._pending_ws + cfg.tool_start + "".join(self._parts) + buf
                self._emit_text(out, text, self._block_start)
                self._pending_ws = ""
                self._parts = []
                self._buf = ""
                self._state = _TEXT
            else:
                cut = len(buf) - (len(cfg.tool_end) - 1)
                if cut > 0:
                    self._parts.append(buf[:cut])
                    self._buf = buf[cut:]
            return False
        body = "".join(self._parts) + buf[:i]
        self._parts = []
        self._buf = buf[i + len(cfg.tool_end) :]
        call = parse_tool_call(body)
        if call is None:
            self._emit_text(out, self._pending_ws + cfg.tool_start + body + cfg.tool_end, self._block_start)
            self._state = _TEXT
        else:
            name, arguments = call
            out.append(ToolCallStart(name))
            out.append(ToolCallArguments(arguments))
            out.append(ToolCallEnd())
            self.saw_tool_call = True
            self.call_names.append(name)
            self._state = _WS_HOLD
            self._after_call = True
        self._pending_ws = ""
        return True
