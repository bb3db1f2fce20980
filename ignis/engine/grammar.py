"""Grammar-constrained decoding: what the output must match, and one matcher per sequence.

    SamplingParams(grammar=Grammar.json_schema({"type": "object", ...}))

A `Grammar` is a compiled llguidance grammar (JSON Schema, any JSON object, Lark or a
regex; Lark may embed JSON schemas with ``%json {...}``). At submit the engine builds a
`GrammarState` for the sequence: an `llguidance.LLMatcher` over the tokenizer's
`LLTokenizer` (built once per tokenizer and logits width, from the `tokenizers`
pipeline JSON ignis already has). Per step the sampler asks each constrained row for
its next-token bitmask (`fill_masks`) and applies it to the logits before penalties,
temperature and the filters (kernels.token_mask); the engine `advance`s the matcher
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
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

import llguidance
import numpy as np

if TYPE_CHECKING:
    from ignis.model.tokenizer import Tokenizer

__all__ = ["Grammar", "GrammarError", "GrammarState", "fill_masks", "ll_tokenizer", "mask_words"]

GrammarKind = Literal["json_schema", "json_object", "lark", "regex"]

# The JSON compiler's layout: ", " and ": " between items, no other whitespace. A model's
# habitual JSON fits, and a grammar that allows free whitespace lets a weak model pad
# forever (an output that only ends at max_tokens).
JSON_OPTIONS: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarError(ValueError):
    """A grammar llguidance cannot compile (the message is llguidance's)."""


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
            compiled = llguidance.LLMatcher.grammar_from_json_schema(text, overrides=JSON_OPTIONS)
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
        error = llguidance.LLMatcher.validate_grammar(self.compiled, tokenizer)
        if error:
            raise GrammarError(error)

    def prepared(self, tokenizer: llguidance.LLTokenizer) -> Grammar:
        """This grammar with its matcher for `tokenizer` built now (call it where the time
        is not the engine's: the server's worker thread); GrammarError when it does not
        compile."""
        matcher = llguidance.LLMatcher(tokenizer, self.compiled, log_level=0)
        if matcher.is_error():
            raise GrammarError(matcher.get_error())
        return replace(self, prototype=(tokenizer, matcher))

    def validate(self) -> None:
        """SamplingParams.validate's check of the value itself (the compile is `check`)."""
        if self.kind not in ("json_schema", "json_object", "lark", "regex") or not isinstance(self.compiled, str):
            raise ValueError(f"not a grammar: {self!r}")


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

    __slots__ = ("grammar", "mask_words", "matcher", "num_tokens", "vocab_size")

    def __init__(self, grammar: Grammar, tokenizer: llguidance.LLTokenizer) -> None:
        self.grammar = grammar
        if grammar.prototype is not None and grammar.prototype[0] is tokenizer:
            self.matcher = grammar.prototype[1].deep_copy()
        else:
            self.matcher = llguidance.LLMatcher(tokenizer, grammar.compiled, log_level=0)
        if self.matcher.is_error():
            raise GrammarError(self.matcher.get_error())
        self.num_tokens = 0  # tokens consumed: the output tokens so far
        self.vocab_size = tokenizer.vocab_size  # ids llguidance knows
        self.mask_words = mask_words(tokenizer.vocab_size)  # the bitmask's width, as llguidance fills it

    def advance(self, token: int) -> str | None:
        """Consume a sampled token; an error message when the grammar rejects it."""
        if not self.matcher.consume_token(token):
            return f"the sampled token {token} does not match the output grammar: {self.matcher.get_error()}"
        self.num_tokens += 1
        return None

    @property
    def finished(self) -> bool:
        """The grammar is complete and allows nothing more (not even whitespace)."""
        return self.matcher.is_stopped()

    def error(self) -> str | None:
        return self.matcher.get_error() or None if self.matcher.is_error() else None


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
