"""What one request asks of the sampler and of the stop logic.

Plain Python values, validated once at submit; the sampler turns the rows of a step
into ignis_kernels.sampling.SamplingTensors. Neutral values (temperature 0 = greedy, top_p 1,
top_k 0, penalties off) let the sampler skip work no row needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ignis.engine.grammar import Grammar
from ignis.engine.thinking import ThinkBudget

MAX_TOP_LOGPROBS = 20  # OpenAI's limit, and vLLM's default one


@dataclass
class SamplingParams:
    max_tokens: int | None = None  # None = up to the context length
    temperature: float = 1.0  # < 1e-5 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1 = off
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # None = a random seed chosen at submit. The draw depends on (seed, step) only, so a
    # seeded request gives the same tokens whatever else shares its steps.
    seed: int | None = None
    stop: Sequence[str] = field(default_factory=tuple)  # stop strings, cut from the text
    stop_token_ids: Sequence[int] = field(default_factory=tuple)  # besides the model's EOS ids
    ignore_eos: bool = False
    # EOS and stop_token_ids cannot be drawn before this many output tokens (vLLM's
    # min_tokens; stop strings still apply).
    min_tokens: int = 0
    skip_special_tokens: bool = True  # in the detokenized text
    logprobs: bool = False  # report the logprob of each sampled token
    # Also report this many most likely tokens of each step (0..20, OpenAI's range);
    # > 0 turns `logprobs` on.
    top_logprobs: int = 0
    # A think block closed after at most this many tokens (ignis/engine/thinking.py);
    # with a grammar, the grammar carries the budget itself. None = unbounded.
    think_budget: ThinkBudget | None = None
    # The whole output must match this grammar (JSON schema, Lark, regex); see
    # ignis/engine/grammar.py. None = free.
    grammar: Grammar | None = None

    def __post_init__(self) -> None:
        if isinstance(self.top_logprobs, int) and self.top_logprobs > 0:
            self.logprobs = True

    @classmethod
    def greedy(cls, max_tokens: int | None = None, **kwargs: object) -> SamplingParams:
        return cls(max_tokens=max_tokens, temperature=0.0, **kwargs)  # type: ignore[arg-type]

    @property
    def is_greedy(self) -> bool:
        return self.temperature < 1e-5

    @property
    def uses_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    def validate(self) -> None:
        """Raise ValueError on a value the engine cannot honour (the server maps it to a 400)."""
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not self.temperature >= 0.0:  # also catches NaN
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 <= self.top_p <= 1.0:
            raise ValueError(f"top_p must be in [0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            raise ValueError(f"min_tokens must be an int >= 0, got {self.min_tokens!r}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1, 0 (off) or positive, got {self.top_k}")
        if not self.repetition_penalty > 0.0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if isinstance(self.stop, str):
            raise ValueError("stop must be a list of strings, not a string")
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop strings must be non-empty strings, got {s!r}")
        if (
            not isinstance(self.top_logprobs, int)
            or isinstance(self.top_logprobs, bool)
            or not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS
        ):
            raise ValueError(f"top_logprobs must be an int in [0, {MAX_TOP_LOGPROBS}], got {self.top_logprobs!r}")
        if self.think_budget is not None:
            if not isinstance(self.think_budget, ThinkBudget):
                raise ValueError(f"think_budget must be a ThinkBudget, got {type(self.think_budget).__name__}")
            self.think_budget.validate()
        if self.grammar is not None:
            if not isinstance(self.grammar, Grammar):
                raise ValueError(f"grammar must be a Grammar, got {type(self.grammar).__name__}")
            self.grammar.validate()
            if self.stop:
                raise ValueError("stop strings cannot be combined with a grammar: a stop string would cut the "
                                 "grammar's text before it is complete")
            if self.min_tokens:
                raise ValueError("min_tokens cannot be combined with a grammar: the grammar decides where the "
                                 "output ends")
            if self.think_budget is not None:
                raise ValueError("a thinking budget beside a grammar: put the budget in the grammar (a max_tokens "
                                 "on its think rule)")
        for t in self.stop_token_ids:
            if not isinstance(t, int) or t < 0:
                raise ValueError(f"stop_token_ids must be non-negative ints, got {t!r}")
