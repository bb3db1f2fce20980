"""Tokenizing rendered prompts piece by piece, remembering the pieces.

An agent's conversation grows by a few items a turn and is rendered again in full every
turn (over HTTP the client resends all of it; over the socket the server keeps it).
Rendering it with the chat template is cheap (~0.1 ms for a 20-item Codex history);
tokenizing the text is not (~15 ms for 14k tokens of SmolLM2's BPE on one core). So
`TokenCache.encode(text)` cuts the text right before each added token the template wrote
(``<|im_start|>``, ``<|im_end|>``, ``<think>``...), looks every piece up, and tokenizes only
the pieces it has not seen, all in one batch call. Turn N + 1 tokenizes what turn N
did not have: the new items, the generation prompt, and whatever the template wrote
differently this time (e.g. a system prompt that names the date).

Exactness: a Hugging Face tokenizer first splits the text at its added tokens, then
normalizes, pre-tokenizes and tokenizes every split between them on its own. A piece
that begins with its added token is, alone, exactly the splits it is in the whole text
(not the text's first split, which some pre-tokenizers treat apart: Metaspace's
``prepend_scheme="first"``); the piece before the first added token is the first split
in both. So the pieces' ids, joined, are the ids of the whole text. That needs the cut
to fall where the tokenizer cuts: the cache turns itself off (every call is a plain
encode) for a vocabulary whose added tokens strip the whitespace around them, match
single words only, are normalized, or are whitespace themselves, or when a probe text
tokenizes differently in pieces than whole.

A long miss (a tool's output) is cut further, at spaces between two letters, where the
tokenizer's pre-tokenizer starts a piece anyway (`Tokenizer.cuts_at_word_spaces`, checked
here on a probe text too), so the tokenizer spreads even one long text over every core.

Thread-safe (the server renders in worker threads); bounded by the tokens it holds,
2M by default (about 25 MB with the pieces' text, ~12 bytes a token measured on English; least
recently used pieces go first).
Ids are stored as tuples of shared int objects: joining a prompt's pieces is then a copy
of pointers (~15 us for 15k tokens, against ~150 us from arrays).
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from itertools import pairwise
from typing import TYPE_CHECKING

from ignis.model.client_text import markup_pattern

if TYPE_CHECKING:
    from ignis.model.tokenizer import Tokenizer

log = logging.getLogger(__name__)

__all__ = ["TokenCache", "TokenCount"]

# A miss at least twice this long is cut into parts of about this many characters.
_PART_CHARS = 512
_WORD_SPACE = re.compile(r"(?<=[^\W\d_]) (?=[^\W\d_])")  # a space between two letters


@dataclass
class TokenCount:
    """What one prompt cost: tokens the tokenizer ran over, and tokens found in the cache."""

    tokenized: int = 0
    reused: int = 0


class TokenCache:
    def __init__(self, tokenizer: Tokenizer, *, max_tokens: int = 1 << 21) -> None:
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        self._lock = threading.Lock()
        # (added tokens parsed?, text) -> ids, least recently used first
        self._store: OrderedDict[tuple[bool, str], tuple[int, ...]] = OrderedDict()
        self._ints = tuple(range(tokenizer.vocab_size))  # one int object per id, shared
        self._held = 0
        self.tokenized = 0  # totals since construction
        self.reused = 0
        tokens = frozenset(t for t in tokenizer.control_tokens if t)
        # Longest first: at one position the longest token wins, as the tokenizer's
        # leftmost-longest matching does.
        self._cut = markup_pattern(tokens)
        self._ids = {t: tokenizer.added_tokens[t] for t in tokens}
        self.why_off = self._unsupported()
        if self.why_off is None and not self._probe():
            self.why_off = "a probe text tokenizes differently in pieces"
        if self.why_off is not None:
            log.info("prompt token cache off: %s", self.why_off)
        self.cuts_words = (
            self.enabled and tokenizer.cuts_at_word_spaces
            and not any(" " in t for t in tokenizer.added_tokens) and self._probe_word_cuts()
        )

    @property
    def enabled(self) -> bool:
        return self.why_off is None

    # -- the public calls --------------------------------------------------------------

    def encode(self, text: str, count: TokenCount | None = None) -> list[int]:
        """`tokenizer.encode(text, special=True, add_bos=False)`, from cached pieces."""
        if not self.enabled:
            ids = self.tokenizer.encode(text, special=True, add_bos=False)
            self._count(count, len(ids), 0)
            return ids
        out: list[int] = []
        for ids in self._lookup(self._pieces(text), special=True, count=count):
            out.extend(ids)
        return out

    def encode_plain(self, texts: list[str], count: TokenCount | None = None) -> list[list[int]]:
        """`tokenizer.encode(t, special=False, add_bos=False)` of each text, cached."""
        if not self.enabled:
            out = [self.tokenizer.encode(t, special=False, add_bos=False) for t in texts]
            self._count(count, sum(map(len, out)), 0)
            return out
        return [list(ids) for ids in self._lookup(texts, special=False, count=count)]

    def added_token_spans(self, text: str) -> list[tuple[int, int, int]]:
        """`tokenizer.added_token_spans(text)`, found without tokenizing the text."""
        if not self.enabled or self._cut is None:
            return self.tokenizer.added_token_spans(text)
        return [(m.start(), m.end(), self._ids[m.group(0)]) for m in self._cut.finditer(text)]

    def clear(self) -> None:
        with self._lock:
            self._store.clear()
            self._held = 0

    # -- internals -----------------------------------------------------------------------

    def _pieces(self, text: str) -> list[str]:
        if self._cut is None:
            return [text]
        starts = [m.start() for m in self._cut.finditer(text)]
        if not starts or starts[0] != 0:
            starts.insert(0, 0)
        starts.append(len(text))
        return [text[a:b] for a, b in pairwise(starts) if b > a]

    def _parts(self, text: str) -> list[str]:
        """`text` cut at a space between two letters every ~_PART_CHARS characters."""
        if not self.cuts_words or len(text) < 2 * _PART_CHARS:
            return [text]
        parts, start = [], 0
        while len(text) - start >= 2 * _PART_CHARS and (m := _WORD_SPACE.search(text, start + _PART_CHARS)):
            parts.append(text[start : m.start()])
            start = m.start()
        parts.append(text[start:])
        return parts

    def _tokenize(self, texts: list[str], *, special: bool) -> list[tuple[int, ...]]:
        """The ids of each text, in one batch call over the texts' parts."""
        parts = [self._parts(t) for t in texts]
        batch = iter(self.tokenizer.encode_batch([p for ps in parts for p in ps], special=special))
        ints = self._ints
        out = []
        for ps in parts:
            ids = [i for _ in ps for i in next(batch)]
            try:
                out.append(tuple(map(ints.__getitem__, ids)))
            except IndexError:  # an id past the vocabulary size (holes in added ids): unshared
                out.append(tuple(ids))
        return out

    def _lookup(self, pieces: list[str], *, special: bool, count: TokenCount | None) -> list[tuple[int, ...]]:
        """The ids of each piece: from the store, else tokenized (all misses in one batch)."""
        store = self._store
        found: list[tuple[int, ...] | None] = []
        with self._lock:
            for p in pieces:
                hit = store.get((special, p))
                if hit is not None:
                    store.move_to_end((special, p))
                found.append(hit)
        missing = list(dict.fromkeys(p for p, hit in zip(pieces, found) if hit is None))
        fresh: dict[str, tuple[int, ...]] = {}
        if missing:
            fresh = dict(zip(missing, self._tokenize(missing, special=special), strict=True))
            with self._lock:
                for p, ids in fresh.items():
                    if (special, p) not in store:
                        store[(special, p)] = ids
                        self._held += len(ids)
                while self._held > self.max_tokens and store:
                    _, old = store.popitem(last=False)
                    self._held -= len(old)
        out = [fresh[p] if hit is None else hit for p, hit in zip(pieces, found)]
        tokenized = sum(map(len, fresh.values()))
        self._count(count, tokenized, sum(map(len, out)) - tokenized)
        return out

    def _count(self, count: TokenCount | None, tokenized: int, reused: int) -> None:
        with self._lock:
            self.tokenized += tokenized
            self.reused += reused
        if count is not None:
            count.tokenized += tokenized
            count.reused += reused

    def _unsupported(self) -> str | None:
        spec = json.loads(self.tokenizer.pipeline_json())
        for t in spec.get("added_tokens") or ():
            if t["content"].isspace():
                return f"whitespace added token {t['content']!r}"
            if t.get("lstrip") or t.get("rstrip") or t.get("single_word"):
                return f"added token {t['content']!r} strips whitespace or matches single words"
            if t.get("normalized"):
                return f"normalized added token {t['content']!r}"
        return None

    def _probe_word_cuts(self) -> bool:
        words = "Hello, world: naïve ünïcode x2 don't  stop\n\tat 3.14 É ü" * 16
        text = "".join(f"{m}user\n{words}" for m in list(self._ids)[:4]) or words
        cut = _WORD_SPACE.split(text)
        return len(cut) > 1 and self._joins_to_whole(text, [p if i == 0 else " " + p for i, p in enumerate(cut)])

    def _probe(self) -> bool:
        marks = list(self._ids)[:24]
        text = "Hello, world" + "".join(f"{m}user\n  café x{i} ün\n\n" for i, m in enumerate(marks)) + " end"
        return self._joins_to_whole(text, self._pieces(text))

    def _joins_to_whole(self, text: str, parts: list[str]) -> bool:
        """Whether `parts` (which join to `text`) tokenize to the ids of `text` whole."""
        whole = self.tokenizer.encode(text, special=True, add_bos=False)
        return whole == [i for ids in self.tokenizer.encode_batch(parts, special=True) for i in ids]
