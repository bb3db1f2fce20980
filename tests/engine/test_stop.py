"""Incremental detokenization and stop strings (ignis.engine.stop.TextStream), on the tiny
byte-level BPE tokenizer: its small vocabulary splits multi-byte characters over tokens."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ignis.engine.stop import TextStream
from ignis.model.tokenizer import IncrementalDecoder


@pytest.fixture(scope="module")
def tok(tiny):
    return tiny.tokenizer


def stream_all(tok, ids, stops=()):
    ts = TextStream(tok, stops)
    pieces = []
    for t in ids:
        pieces.append(ts.add(t))
        if ts.stop_string is not None:
            break
    pieces.append(ts.flush())
    return "".join(pieces), pieces, ts


def test_multibyte_characters_across_tokens(tok) -> None:
    text = "Héllo wörld, 日本語 and 🙂🚀 — ok."
    ids = tok.encode(text)
    out, pieces, _ = stream_all(tok, ids)
    assert out == text == tok.decode(ids)
    assert "" in pieces[:-1]  # some token ended inside a character: nothing released for it
    assert all("\ufffd" not in p for p in pieces)


def test_stop_string_spanning_tokens_cuts_the_text(tok) -> None:
    text = "The capital of France is Paris. The quick brown fox."
    ids = tok.encode(text)
    out, _, ts = stream_all(tok, ids, ["Paris."])
    assert out == "The capital of France is "
    assert ts.stop_string == "Paris."
    # Tokens whose text starts at or after the cut are rewound.
    dec = IncrementalDecoder(tok)
    starts, total = [], 0
    for t in ids:
        starts.append(total)
        total += len(dec.add(t))
        if total >= len("The capital of France is Paris."):
            break
    assert ts.rewound == sum(1 for s in starts if s >= len("The capital of France is "))
    assert ts.rewound >= 1


def test_possible_stop_prefix_is_held_then_released(tok) -> None:
    text = "ab Par is fine"
    ids = tok.encode(text)
    ts = TextStream(tok, ["Paris"])
    released = ""
    decoded = IncrementalDecoder(tok)
    so_far = ""
    for t in ids:
        released += ts.add(t)
        so_far += decoded.add(t)
        assert so_far.startswith(released)
        if so_far.endswith(" Par"):
            assert released.endswith("ab ")  # "Par" could still become "Paris"
    released += ts.flush()
    assert released == text and ts.stop_string is None and ts.rewound == 0


def test_earliest_stop_wins(tok) -> None:
    ids = tok.encode("one two three four")
    out, _, ts = stream_all(tok, ids, ["four", "two"])
    assert out == "one " and ts.stop_string == "two"


ALPHABET = "ab é日🙂\n."


@settings(max_examples=60, deadline=None)
@given(
    text=st.text(alphabet=ALPHABET, min_size=0, max_size=30),
    stops=st.lists(st.text(alphabet=ALPHABET, min_size=1, max_size=4), min_size=0, max_size=3),
)
def test_matches_a_direct_search(tiny, text: str, stops: list[str]) -> None:
    tok = tiny.tokenizer
    ids = tok.encode(text)
    out, _, ts = stream_all(tok, ids, stops)
    # Oracle: decode piece by piece; the first time any stop occurs, cut at its earliest start.
    dec = IncrementalDecoder(tok)
    acc, starts, expected, rewound = "", [], None, 0
    for t in ids:
        starts.append(len(acc))
        acc += dec.add(t)
        found = [acc.find(s) for s in stops if s in acc]
        if found:
            cut = min(found)
            expected, rewound = acc[:cut], sum(1 for s in starts if s >= cut)
            break
    if expected is None:
        acc += dec.flush()
        found = [acc.find(s) for s in stops if s in acc]
        expected = acc[: min(found)] if found else acc
    assert out == expected
    if ts.stop_string is not None:
        assert ts.rewound == rewound
