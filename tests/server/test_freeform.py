"""A custom tool's grammar moved inside a JSON string (ignis/server/freeform.py): the
rewritten grammar accepts the JSON-escaped text of exactly what the client's grammar
accepts, checked with llguidance over a byte tokenizer (every byte its own token, so
acceptance is the grammar's alone)."""

from __future__ import annotations

import json

import llguidance
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ignis.server.freeform import FreeformError, escape_lark, json_string_rule
from tests.server.grammars import APPLY_PATCH

BYTES = llguidance.LLTokenizer("byte")


def _matches(grammar: str, text: str) -> bool:
    """Whether llguidance accepts exactly `text` (all of it, and may end there)."""
    m = llguidance.LLMatcher(BYTES, llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)
    assert not m.is_error(), m.get_error()
    return m.consume_tokens(list(text.encode("utf-8"))) and m.is_accepting()


def _as_arguments(syntax: str | None, definition: str | None) -> str:
    """The arguments object of a call to a custom tool, as the output grammar spells it."""
    return 'start: "{\\"input\\": " input "}"\ninput: ' + json_string_rule(syntax, definition)


def _raw(syntax: str, definition: str) -> str:
    return definition if syntax == "lark" else "start: /" + definition.replace("/", "\\/") + "/"


PATCHES = [
    '*** Begin Patch\n*** Update File: a.py\n@@ def f():\n- return 1\n+ return "two\\\t"\n*** End Patch\n',
    "*** Begin Patch\n*** Add File: notes/é.txt\n+naïve 中文\n+\n*** End Patch",
    "*** Begin Patch\n*** Delete File: old.txt\n*** Update File: x\n*** Move to: y\n@@\n ctx\n*** End of File\n*** End Patch\n",
]
NOT_PATCHES = [
    "*** Begin Patch\nhello\n*** End Patch\n",
    "*** Begin Patch\n*** End Patch\n",  # no hunk
    "*** Begin Patch\n*** Add File: x\n+a\n*** End Patch\n\n",  # a blank line after the end
    "*** Begin Patch\n*** Update File: a\n@@\n\tcode\n*** End Patch\n",  # a change line must start with + - or space
]


@pytest.mark.parametrize("patch", PATCHES)
def test_apply_patch_inside_json_accepts_escaped_patches(patch: str) -> None:
    assert _matches(APPLY_PATCH, patch)  # the client's grammar itself
    assert _matches(_as_arguments("lark", APPLY_PATCH), json.dumps({"input": patch}, ensure_ascii=False))


@pytest.mark.parametrize("text", NOT_PATCHES)
def test_apply_patch_inside_json_refuses_what_the_grammar_refuses(text: str) -> None:
    assert not _matches(APPLY_PATCH, text)
    assert not _matches(_as_arguments("lark", APPLY_PATCH), json.dumps({"input": text}, ensure_ascii=False))


def test_a_raw_newline_or_quote_never_passes() -> None:
    grammar = _as_arguments("lark", APPLY_PATCH)
    raw = '{"input": "*** Begin Patch\n*** Add File: x\n+a\n*** End Patch"}'  # unescaped newlines
    assert not _matches(grammar, raw)
    assert not _matches(_as_arguments("lark", 'start: /[^x]+/'), '{"input": "a"b"}')


GRAMMARS = [
    ("lark", 'start: item ("," item)*\nitem: WORD | NUMBER | ESCAPED_STRING\n%import common.WORD\n'
             '%import common.NUMBER\n%import common.ESCAPED_STRING'),
    ("lark", 'start: "SELECT"i " " /[a-z_]+/ (" " /where/i " " /[^;\\n]+/)? ";"'),
    ("lark", 'start: line+\nline: /[^\\n]*\\n/'),
    ("regex", r"\d{3}-[a-z]+(\n\t\S*)?"),
    ("regex", r'[^"\\]*"[\\]?'),
    ("regex", r"(?s:.{0,6})"),
]


@pytest.mark.parametrize(("syntax", "definition"), GRAMMARS)
@settings(max_examples=60, deadline=None)
@given(text=st.text(alphabet=st.sampled_from(list('ab1 ,;\n\t"\\é-_xSELECTselectWHERE') + ["\x00", "\x7f"]), max_size=14))
def test_escaped_grammar_agrees_with_the_original(syntax: str, definition: str, text: str) -> None:
    original = _matches(_raw(syntax, definition), text)
    escaped = _matches(_as_arguments(syntax, definition), json.dumps({"input": text}, ensure_ascii=False)
                       .replace("\\u007f", "\x7f").replace("\x7f", "\\u007f"))
    assert original == escaped, (text, original, escaped)


def test_plain_text_format_is_any_json_string() -> None:
    assert _matches(_as_arguments(None, None), json.dumps({"input": 'anything "at all"\n'}))


@pytest.mark.parametrize("grammar", [
    'start: "a" <|im_end|>',
    'start: %json {"type": "string"}',
    'start: WS "a"\n%import common.WS\n%ignore WS',
    "start: /(?<=a)b/",
    "start: /(a)\\1/",
    "start: X\n%import common.NOT_A_COMMON_ONE",
])
def test_what_cannot_live_in_a_string_is_refused(grammar: str) -> None:
    with pytest.raises(FreeformError):
        escape_lark(grammar)
