"""`reasoning.encrypted_content` tokens."""

from __future__ import annotations

import zlib

from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import encrypted
from protocol.encrypted import PREFIX, _b64, open_reasoning, seal_reasoning


@settings(max_examples=100, deadline=None)
@given(st.text(), st.one_of(st.none(), st.binary(min_size=1, max_size=32)))
def test_round_trip(text, key):
    token = seal_reasoning(text, key)
    assert token.isascii() and token.startswith(PREFIX)
    assert open_reasoning(token, key) == text
    assert open_reasoning(token) == text  # no key: readable, signature unchecked


def test_signature():
    t = seal_reasoning("secret plan", b"k1")
    assert open_reasoning(t, b"k2") is None
    assert open_reasoning(seal_reasoning("x"), b"k1") is None  # unsigned, server wants signed
    body, sig = t.rsplit(".", 1)
    forged = seal_reasoning("other plan").split(".")[1]
    assert open_reasoning(f"{PREFIX}{forged}.{sig}", b"k1") is None


def test_garbage():
    for bad in ["", "gAAAA-fake", PREFIX, PREFIX + "!!!", PREFIX + "a.b.c.d", PREFIX + _b64(b"not zlib"),
                PREFIX + _b64(zlib.compress(b"[1]")), PREFIX + _b64(zlib.compress(b'{"v":2,"text":"x"}')), 5, None]:
        assert open_reasoning(bad) is None


def test_zip_bomb_refused(monkeypatch):
    monkeypatch.setattr(encrypted, "_MAX_INFLATED", 1024)
    bomb = PREFIX + _b64(zlib.compress(b'{"v":1,"text":"' + b"a" * 4096 + b'"}', 9))
    assert open_reasoning(bomb) is None
    assert open_reasoning(seal_reasoning("a" * 900)) == "a" * 900
