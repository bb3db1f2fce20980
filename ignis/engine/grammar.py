"""Grammar-constrained decoding: what the output must match, and one matcher per sequence.

    SamplingParams(grammar=Grammar.json_schema({"type": "object", ...}))

A `Grammar` is a compiled llguidance grammar (JSON Schema, any JSON object, Lark or a
regex; Lark may embed JSON schemas with ``%json {...}``). At submit the engine builds a
`GrammarState` for the sequence: an `llguidance.LLMatcher` over the tokenizer's
`LLTokenizer` (built once per tokenizer and logits width, from the `tokenizers`
pipeline JSON ignis already has). Per step the sampler asks each constrained row for
its next-token bitmask (`fill_masks`) and applies it to the logits before penalties,
temperature and the filters (ignis_kernels.token_mask); the engine `advance`s the matcher
with each sampled token. Semantics:

- The whole output is constrained, from its first token. EOS is allowed only where
  the grammar is complete; once the grammar can go no further (`finished`) the output
  ends there (finish reason STOP), EOS drawn or not.
- A row whose mask is empty (nothing the grammar allows exists in the vocabulary),
  or a token the matcher rejects, ends that request with an error; never a crash.
- The state depends only on the output tokens, and preemption by recompute keeps
  them, so a preempted sequence keeps its matcher as it is. Finished and aborted
  sequences drop theirs.
- With a grammar, stop strings (which could cut the grammar's text anywhere) and
  min_tokens (which would ban the end the grammar demands) are refused at submit.
- Speculative decoding: a draft is cut at its first token the grammar refuses
  (`valid_prefix`), and each draft position samples under the mask that follows the
  draft's tokens before it (`fill_draft_masks`: consumed by a copy of the matcher), so a kept
  draft is exactly what the grammar lets plain decoding sample.
- Every llguidance call that compiles runs on a thread with a large native stack
  (ignis/engine/grammar_thread.py), under `LIMITS`; masks are filled off the engine's
  thread (ignis/engine/grammar_masks.py). Error messages are llguidance's first line,
  cut to `MESSAGE_CHARS`: never the grammar itself, whatever its size.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

import llguidance
import numpy as np

from ignis.engine.grammar_thread import on_grammar_thread

if TYPE_CHECKING:
    from ignis.model.tokenizer import Tokenizer

__all__ = ["LIMITS", "MESSAGE_CHARS", "Grammar", "GrammarError", "GrammarState", "bounded_message",
           "fill_draft_masks", "fill_masks", "ll_tokenizer", "mask_words"]

GrammarKind = Literal["json_schema", "json_object", "lark", "regex"]

# The JSON compiler's layout: ", " and ": " between items, no other whitespace. A model's
# habitual JSON fits, and a grammar that allows free whitespace lets a weak model pad
# forever (an output that only ends at max_tokens).
JSON_OPTIONS: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


# llguidance's resource limits for every grammar (its defaults: parser items per step,
# lexer fuel and states, grammar size), with verbose errors off: those print the parser's
# state and the whole grammar into the message.
LIMITS = llguidance.LLParserLimits(verbose_errors=False)
# The longest grammar error message passed on (to a client, or a log line).
MESSAGE_CHARS = 300


def bounded_message(text: str, limit: int = MESSAGE_CHARS) -> str:
    """An llguidance message fit for a client and a log: its first line (the rest quotes the
    grammar, or dumps the parser's state), at most `limit` characters."""
    text = str(text)
    for marker in ("<state>", "<grammar>", "<backtrace>"):
        text = text.split(marker, 1)[0]
    first = text.strip().split("\n", 1)[0].strip() or "the grammar engine refused it"
    return first if len(first) <= limit else first[: limit - 3].rstrip() + "..."


class GrammarError(ValueError):
    """A grammar llguidance cannot compile (the message is llguidance's, bounded)."""

    def __init__(self, message: str) -> None:
        super().__init__(bounded_message(message))


@dataclass(frozen=True)
class Grammar:
    """A grammar for the output. `source` is what it was built from (for messages and
    equality); `compiled` is llguidance's grammar text. Build with the classmethods."""

    kind: GrammarKind
    source: str
    compiled: str
    # (tokenizer, matcher) built by `prepared` off the engine's thread; never advanced:
    # each sequence starts from a copy (a Codex request's grammar takes ~4 ms to build,
    # a copy ~2 us).
    prototype: tuple[llguidance.LLTokenizer, llguidance.LLMatcher] | None = field(
        default=None, compare=False, repr=False)

    @classmethod
    def json_schema(cls, schema: dict[str, Any] | str) -> Grammar:
        # Key order kept: llguidance (as OpenAI) writes properties in the schema's order.
        text = schema if isinstance(schema, str) else json.dumps(schema)
        try:
            compiled = on_grammar_thread(_from_json_schema, text)
        except (ValueError, TypeError) as exc:  # not a JSON object at all
            raise GrammarError(str(exc)) from None
        return cls("json_schema", text, compiled)

    @classmethod
    def json_object(cls) -> Grammar:
        """Any JSON object (OpenAI's ``json_object`` mode)."""
        g = cls.json_schema({"type": "object"})
        return cls("json_object", g.source, g.compiled)

    @classmethod
    def lark(cls, text: str) -> Grammar:
        return cls("lark", text, llguidance.LLMatcher.grammar_from_lark(text))

    @classmethod
    def regex(cls, pattern: str) -> Grammar:
        return cls("regex", pattern, llguidance.LLMatcher.grammar_from_regex(pattern))

    def check(self, tokenizer: llguidance.LLTokenizer | None = None) -> None:
        """Raise GrammarError with llguidance's message when it does not compile."""
        error = on_grammar_thread(_validate, self.compiled, tokenizer)
        if error:
            raise GrammarError(error)

    def prepared(self, tokenizer: llguidance.LLTokenizer) -> Grammar:
        """This grammar with its matcher for `tokenizer` built now (call it where the time
        is not the engine's: the server's worker thread); GrammarError when it does not
        compile."""
        return replace(self, prototype=(tokenizer, new_matcher(tokenizer, self.compiled)))

    def validate(self) -> None:
        """SamplingParams.validate's check of the value itself (the compile is `check`)."""
        if self.kind not in ("json_schema", "json_object", "lark", "regex") or not isinstance(self.compiled, str):
            raise ValueError(f"not a grammar: {self!r}")


def _from_json_schema(text: str) -> str:
    return llguidance.LLMatcher.grammar_from_json_schema(text, overrides=JSON_OPTIONS)


def _validate(compiled: str, tokenizer: llguidance.LLTokenizer | None) -> str:
    return llguidance.LLMatcher.validate_grammar(compiled, tokenizer, limits=LIMITS)


def _matcher(tokenizer: llguidance.LLTokenizer, compiled: str) -> llguidance.LLMatcher:
    return llguidance.LLMatcher(tokenizer, compiled, log_level=0, limits=LIMITS)


def new_matcher(tokenizer: llguidance.LLTokenizer, compiled: str) -> llguidance.LLMatcher:
    """A matcher for `compiled`, built on a compile thread; GrammarError when it does not compile."""
    matcher = on_grammar_thread(_matcher, tokenizer, compiled)
    if matcher.is_error():
        raise GrammarError(matcher.get_error())
    return matcher


def mask_words(vocab_size: int) -> int:
    """int32 words of one row's bitmask (one bit per token)."""
    return (vocab_size + 31) // 32


def ll_tokenizer(tokenizer: Tokenizer, vocab_size: int) -> llguidance.LLTokenizer:
    """llguidance's view of `tokenizer` for logits `vocab_size` wide: built on first use
    (~0.2-0.4 s for 49k tokens), then kept on the tokenizer (`Tokenizer.memo`: the server
    builds it in a worker thread while the engine may ask). It knows the tokenizer's ids
    only: llguidance gives ids past them (an embedding padded for speed) placeholder
    bytes and may allow them, so the sampler masks every id past the tokenizer's and
    past the logits. EOS: every id that ends generation for the model."""
    return tokenizer.memo(("ll_tokenizer", vocab_size), lambda: llguidance.LLTokenizer(
        tokenizer.pipeline_json(), n_vocab=tokenizer.vocab_size, eos_token=sorted(tokenizer.eos_token_ids) or None,
    ))


class GrammarState:
    """One sequence's matcher. Not thread-safe: the engine's thread alone uses it."""

    __slots__ = ("draft_fill", "fill", "grammar", "late", "mask_words", "matcher", "num_tokens", "quick",
                 "slow_drafts", "vocab_size")

    def __init__(self, grammar: Grammar, tokenizer: llguidance.LLTokenizer) -> None:
        self.grammar = grammar
        if grammar.prototype is not None and grammar.prototype[0] is tokenizer:
            self.matcher = grammar.prototype[1].deep_copy()  # ~2 us: fine on the engine's thread
        else:  # not prepared: compiled now (on a compile thread, the caller waiting)
            self.matcher = new_matcher(tokenizer, grammar.compiled)
        if self.matcher.is_error():
            raise GrammarError(self.matcher.get_error())
        self.num_tokens = 0  # tokens consumed: the output tokens so far
        self.vocab_size = tokenizer.vocab_size  # ids llguidance knows
        self.mask_words = mask_words(tokenizer.vocab_size)  # the bitmask's width, as llguidance fills it
        # The bitmask for the next token (ignis/engine/grammar_masks.py): a MaskFill started
        # for some position; whether a fill missed its step (then its sequence is scheduled
        # only once its mask is ready); whether its last fill was quick (it fills in the batch).
        self.fill: Any = None
        self.late = False
        self.quick = False
        # The masks at a speculative draft's positions after the first (grammar_masks.py), and
        # whether they once came slowly (then this sequence drafts no more).
        self.draft_fill: Any = None
        self.slow_drafts = False

    def advance(self, token: int) -> str | None:
        """Consume a sampled token; an error message when the grammar rejects it."""
        if not self.matcher.consume_token(token):
            return (f"the sampled token {token} does not match the output grammar: "
                    f"{bounded_message(self.matcher.get_error())}")
        self.num_tokens += 1
        return None

    def valid_prefix(self, tokens: list[int]) -> int:
        """How many of `tokens` the grammar would take in turn from here (nothing consumed)."""
        return self.matcher.validate_tokens(tokens)

    @property
    def accepting(self) -> bool:
        """The output so far is a complete match of the grammar (the engine reports an
        output as complete, finish reason STOP, only then)."""
        return not self.matcher.is_error() and self.matcher.is_accepting()

    @property
    def finished(self) -> bool:
        """The grammar is complete and allows nothing more (not even whitespace)."""
        return self.matcher.is_stopped()

    def error(self) -> str | None:
        return bounded_message(self.matcher.get_error()) if self.matcher.is_error() else None


_executor: llguidance.LLExecutor | None = None


def fill_masks(states: list[GrammarState], out: np.ndarray) -> None:
    """Write row k's next-token bitmask into out[k] ([R, W] int32, C-contiguous). Several
    rows go through llguidance's executor (its threads, the GIL released)."""
    global _executor
    if out.dtype != np.int32 or not out.flags["C_CONTIGUOUS"] or out.shape[0] < len(states):
        raise ValueError("out must be a C-contiguous int32 [R, W] array with a row per state")
    row_bytes = out.shape[1] * 4
    if len(states) == 1:
        states[0].matcher.unsafe_compute_mask_ptr(out.ctypes.data, row_bytes)
        return
    if _executor is None:
        _executor = llguidance.LLExecutor()
    _executor.unsafe_compute_mask_ptr([(s.matcher, k) for k, s in enumerate(states)], out.ctypes.data, row_bytes,
                                      out.shape[0])


def fill_draft_masks(state: GrammarState, draft: list[int], out: np.ndarray) -> None:
    """out[j] = the bitmask after the draft's first j + 1 tokens ([len(draft), W] int32,
    C-contiguous), filled by a copy of the state's matcher that consumes them one by one
    (the state's own stays where it is: llguidance cannot roll back grammars with
    max_tokens or stop lexemes, as tool grammars have). Rows past the grammar's first
    refusal stay zero."""
    if out.dtype != np.int32 or not out.flags["C_CONTIGUOUS"] or out.shape[0] < len(draft):
        raise ValueError("out must be a C-contiguous int32 [R, W] array with a row per draft token")
    m = state.matcher.deep_copy()  # ~2 us; a refusal puts only the copy in error
    for j, token in enumerate(draft):
        if not m.consume_token(token):
            break
        m.unsafe_compute_mask_ptr(out[j].ctypes.data, out.shape[1] * 4)


def is_grammar_failure(error: str | None) -> bool:
    """Whether a request's engine error came from its own output grammar (the sampler's
    and the matcher's failures, the mask's timeout: each names "the output grammar"),
    the client's schema or grammar rather than the server."""
    return error is not None and "output grammar" in error

