"""Incremental detokenization with stop strings, for one request.

Text comes from ignis.model.tokenizer.IncrementalDecoder (correct across multi-byte
UTF-8 characters split over byte-level BPE tokens). Stop strings are matched on that
text, never on token ids: a stop string can span tokens, or start in the middle of one.

Holding back: text is released only once no stop string can still begin inside it,
i.e. we keep back the longest suffix that is a proper prefix of some stop string. An
occurrence can then never start in text already released (that suffix would have
been held), so the search only ever looks at the held suffix plus the new piece.

Rewound tokens: when a stop string matches, the text is cut where it starts; tokens
whose text begins at or after the cut contributed nothing to the answer and are
counted as rewound (usage.rewound_tokens).
"""

from __future__ import annotations

from collections.abc import Sequence

from ignis.model.tokenizer import IncrementalDecoder


class TextStream:
    def __init__(self, tokenizer: object, stop: Sequence[str] = (), *, skip_special_tokens: bool = True) -> None:
        self._decoder = IncrementalDecoder(tokenizer, skip_special_tokens=skip_special_tokens)  # type: ignore[arg-type]
        self._stops = tuple(stop)
        self._max_hold = max((len(s) for s in self._stops), default=1) - 1
        self._held = ""  # decoded but not yet released
        self._total = 0  # characters decoded so far, held ones included
        self._token_starts: list[int] = []  # text offset where each token's text begins
        self.stop_string: str | None = None  # the stop string that matched
        self.rewound = 0

    def add(self, token_id: int) -> str:
        """Text this token releases ("" while held back). Do not call after a stop matched."""
        if self._stops:
            self._token_starts.append(self._total)
        return self._push(self._decoder.add(token_id), final=False)

    def flush(self) -> str:
        """At the end of the request: whatever is still held (no stop can complete now)."""
        if self.stop_string is not None:
            return ""
        return self._push(self._decoder.flush(), final=True)

    def _push(self, piece: str, *, final: bool) -> str:
        if not self._stops:
            self._total += len(piece)
            return piece
        if not piece and not final:
            return ""
        base = self._total - len(self._held)  # text offset of buf[0]
        buf = self._held + piece
        self._total += len(piece)
        cut, which = -1, None
        for s in self._stops:
            i = buf.find(s)
            if i != -1 and (cut == -1 or i < cut):
                cut, which = i, s
        if which is not None:
            self.stop_string = which
            self._held = ""
            self.rewound = sum(1 for start in self._token_starts if start >= base + cut)
            return buf[:cut]
        keep = 0
        if not final:
            for m in range(min(len(buf), self._max_hold), 0, -1):
                tail = buf[-m:]
                if any(s.startswith(tail) for s in self._stops):
                    keep = m
                    break
        self._held = buf[len(buf) - keep :]
        return buf[: len(buf) - keep]
