"""The output grammar a request gets (ignis/server/structured.py), read by llguidance over
the tiny model's tokenizer: under ``tool_choice: "auto"`` with a strict tool the text is
free and each call the model opens is held to its tool's schema; with
``parallel_tool_calls: false`` at most one call."""

from __future__ import annotations

import json
from typing import Any

import llguidance
import pytest

from ignis.engine.grammar import ll_tokenizer
from ignis.output_parser import ParserConfig
from ignis.server.structured import output_grammar
from protocol.conversation import FunctionTool, ToolChoice
from protocol.sampling import SamplingFields
from protocol.structured import TextFormat

PICK = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": False}
TOOLS = [FunctionTool("pick", parameters=PICK, strict=True), FunctionTool("free", parameters={"type": "object"})]
PARSER = ParserConfig(reasoning=False)


def _grammar(tok: Any, *, parallel: bool = True, tools: list[FunctionTool] = TOOLS) -> Any:
    return output_grammar(PARSER, TextFormat(), tools, ToolChoice(), SamplingFields(), parallel=parallel,
                          tokenizer=tok, vocab_size=tok.vocab_size, format_param="text.format",
                          tool_param=lambda name: "tools[0].parameters")


def _ids(tok: Any, text: str) -> list[int]:
    """`text` as the model would write it: a tag that is one added token is that token."""
    ids: list[int] = []
    for k, piece in enumerate(text.replace("</tool_call>", "\0</tool_call>\0").replace("<tool_call>", "\0<tool_call>\0")
                              .split("\0")):
        if piece in tok.added_tokens and k % 2 == 1:
            ids.append(tok.added_tokens[piece])
        elif piece:
            ids += tok.encode(piece)
    return ids


def _accepts(tok: Any, grammar: Any, text: str) -> bool:
    m = llguidance.LLMatcher(ll_tokenizer(tok, tok.vocab_size), grammar.compiled, log_level=0)
    return m.consume_tokens(_ids(tok, text)) and m.is_accepting()


def call(name: str, args: dict[str, Any]) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(args)}}}\n</tool_call>'


@pytest.fixture(scope="module")
def tok(tiny_server_model: Any) -> Any:
    return tiny_server_model.tokenizer


def test_auto_without_strict_tools_has_no_grammar(tok: Any) -> None:
    assert _grammar(tok, tools=[TOOLS[1]]) is None


@pytest.mark.parametrize(("text", "ok"), [
    ("Just an answer, no call.", True),
    ("Let me pick. " + call("pick", {"n": 3}), True),
    (call("pick", {"n": 3}) + "\n" + call("free", {"anything": [1, "x"]}) + " done", True),
    ("Let me pick. " + call("pick", {"n": "three"}), False),  # off the strict schema
    (call("pick", {"n": 3, "extra": 1}), False),
    (call("nope", {}), False),  # not a tool
    ("<tool_call>\nI changed my mind", False),  # an opened call must be a call
])
def test_auto_with_a_strict_tool_constrains_each_opened_call(tok: Any, text: str, ok: bool) -> None:
    assert _accepts(tok, _grammar(tok), text) is ok


def test_one_call_when_parallel_calls_are_off(tok: Any) -> None:
    grammar = _grammar(tok, parallel=False)
    assert _accepts(tok, grammar, "Sure. " + call("pick", {"n": 1}))
    assert not _accepts(tok, grammar, call("pick", {"n": 1}) + call("pick", {"n": 2}))
    assert not _accepts(tok, grammar, call("pick", {"n": 1}) + " and more text")


def test_a_stop_string_under_auto_keeps_the_stop_and_drops_the_grammar(tok: Any) -> None:
    grammar = output_grammar(PARSER, TextFormat(), TOOLS, ToolChoice(), SamplingFields(stop=(" ",)), parallel=True,
                             tokenizer=tok, vocab_size=tok.vocab_size, format_param="text.format",
                             tool_param=lambda name: "tools[0].parameters")
    assert grammar is None
