"""A custom tool call's input decoded while its arguments stream (protocol/custom_input.py):
whatever the chunking, the deltas join to the input, and `final_input` agrees."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.custom_input import InputStream, final_input


@settings(max_examples=200, deadline=None)
@given(text=st.text(), cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12),
       ascii_only=st.booleans())
def test_any_chunking_decodes_to_the_input(text: str, cuts: list[int], ascii_only: bool) -> None:
    arguments = json.dumps({"input": text}, ensure_ascii=ascii_only)
    stream, got, last = InputStream(), [], 0
    for cut in sorted({min(c, len(arguments)) for c in cuts} | {len(arguments)}):
        got.append(stream.feed(arguments[last:cut]))
        last = cut
    assert "".join(got) == text
    assert final_input(arguments) == text


def test_other_shapes_stream_nothing_and_end_as_their_text() -> None:
    stream = InputStream()
    assert stream.feed('{"path": "a.py", ') == "" and stream.feed('"input": "x"}') == ""
    assert final_input('{"path": "a.py", "input": "x"}') == "x"
    assert final_input("not json at all") == "not json at all"
    assert final_input('{"input": 3}') == '{"input": 3}'


def test_nothing_after_the_string_closes() -> None:
    stream = InputStream()
    assert stream.feed('{"input": "ab"') == "ab"
    assert stream.feed(', "more": "cd"}') == ""
