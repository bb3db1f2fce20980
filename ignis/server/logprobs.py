"""Per-token logprobs of a turn: each token's text and bytes (`token_logprobs`), and
which answer-text delta each token belongs on (`LogprobRouter`)."""

from __future__ import annotations

from collections import deque
from ignis.engine import RequestOutput
from ignis.model.tokenizer import Tokenizer
from protocol.deltas import Delta, TextDelta
from protocol.events import TokenLogprob

__all__ = ["LogprobRouter", "token_logprobs"]


def token_logprobs(tokenizer: Tokenizer, out: RequestOutput) -> list[TokenLogprob]:
    """The step's tokens with their logprobs and, when asked, their alternatives. Text:
    the id decoded alone, specials included (OpenAI's token field; part of a UTF-8
    character reads U+FFFD). Bytes: the token's own (`Tokenizer.token_bytes`, for
    byte-level vocabularies; an added token's are its UTF-8), or None where the
    vocabulary has none (the encoder then sends the text's UTF-8)."""

    def one(t: int, lp: float, alts: tuple[TokenLogprob, ...] = ()) -> TokenLogprob:
        text, raw = tokenizer.piece(t)  # cached on the tokenizer
        return TokenLogprob(text, float(lp), alts, raw)

    tops = out.top_logprobs or [()] * len(out.token_ids)
    return [
        one(t, lp, tuple(one(a, alp) for a, alp in top))
        for t, lp, top in zip(out.token_ids, out.logprobs, tops, strict=False)
    ]


class LogprobRouter:
    """Puts each token's logprob on the `TextDelta` its text ends up in; the tokens of
    reasoning, of tool-call blocks and of dropped whitespace get none (OpenAI reports
    logprobs of output text only).

    Positions are character offsets into the text fed to the parser (the outputs'
    ``text``, concatenated). `add` gives each token a stretch of it, and `attach` puts
    a token on the `TextDelta` that holds the first character of its stretch that is
    answer text (the parser's `text_spans`); a token none of whose stretch is answer
    text gets dropped, as do tokens with no text at the end (a stop token, the tokens
    of a stop string).

    The stretches: an output's text is split among its tokens (and those carried from
    earlier outputs) by their own texts (decoded alone), in order, while those match
    it exactly. A token whose own text ends in an unfinished character (U+FFFD) the
    engine held back also covers the next character (where that character comes).
    Tokens left once the text is used up (their text held back: the rest of a
    character split across tokens, a possible stop string) wait for the next output
    with text. At the first token that does not match, it and the tokens after it
    share the rest of the output's text.

    So it is exact for one token per output (the engine sends one per step) whose text
    alone is its text in the stream, which holds for whole characters and for a
    character split across tokens. The approximation is in the sharing: tokens whose
    text alone differs from their text in context (a SentencePiece word's leading
    space; a special token left out of the text, which goes with the next token) all
    go with the delta of the shared stretch's first answer character, or are all
    dropped when none of it is answer text.
    """

    __slots__ = ("_queue", "_carry", "_pos")

    def __init__(self) -> None:
        # (start, end, token), start and end non-decreasing
        self._queue: deque[tuple[int, int, TokenLogprob]] = deque()
        self._carry: list[TokenLogprob] = []
        self._pos = 0

    def add(self, tokens: list[TokenLogprob], text: str) -> None:
        """One engine output: its tokens and the text it adds to the parser's input."""
        tokens = self._carry + tokens if self._carry else tokens
        self._carry = []
        if not text:
            self._carry = tokens
            return
        start, end = self._pos, self._pos + len(text)
        self._pos = end
        queue = self._queue
        cursor = 0
        for k, t in enumerate(tokens):
            if cursor == len(text):  # text used up: the rest wait for more
                self._carry = tokens[k:]
                return
            piece = t.token
            if piece and text.startswith(piece, cursor):
                queue.append((start + cursor, start + cursor + len(piece), t))
                cursor += len(piece)
            elif piece[-1:] == "\ufffd" and cursor + len(piece) - 1 == len(text) and text.startswith(piece[:-1], cursor):
                queue.append((start + cursor, end + 1, t))  # and the held-back character
                cursor = len(text)
            else:
                queue.extend((start + cursor, end, u) for u in tokens[k:])
                return

    def attach(self, deltas: list[Delta], spans: list[tuple[int, int]]) -> list[Delta]:
        """`deltas` (one feed's, coalesced) with the logprobs of their answer tokens; `spans`:
        the parser's `text_spans` for them (their texts are the `TextDelta`s', in order)."""
        queue = self._queue
        spans_iter = iter(spans)
        out: list[Delta] = []
        for d in deltas:
            if type(d) is not TextDelta:
                out.append(d)
                continue
            need = len(d.text)
            lps: list[TokenLogprob] = []
            while need > 0:
                s, e = next(spans_iter, (0, 0))
                if e <= s:  # (no span left: cannot happen with OutputParser)
                    break
                need -= e - s
                while queue and queue[0][0] < e:
                    _, t_end, t = queue.popleft()
                    if t_end > s:  # some of it is in this span: its first answer char
                        lps.append(t)
                    # else: all of it before this span and in no earlier one: not answer
            out.append(TextDelta(d.text, tuple(lps)) if lps else d)
        return out

    def settle(self, offset: int) -> None:
        """Drop the tokens that end before `offset` (the parser's `settled`): their text
        was emitted or dropped, and what was answer text took them already."""
        queue = self._queue
        while queue and queue[0][1] <= offset:
            queue.popleft()
