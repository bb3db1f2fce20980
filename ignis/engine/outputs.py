"""What the engine hands back: one RequestOutput per request per step (a delta), and the
EngineUsage that rides on the last one.

The names say "engine": the wire's finish reasons and usage are protocol's
(`protocol.deltas.FinishReason`, `protocol.response.Usage`), which the server derives
from these."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class EngineFinish(str, Enum):
    """Why the engine ended a request."""

    STOP = "stop"  # an EOS / stop token id, or a stop string
    LENGTH = "length"  # max_tokens, or the context length
    ABORT = "abort"  # abort(id), or the engine shutting down
    DEADLINE = "deadline"  # the request's deadline passed
    ERROR = "error"  # this request failed (see RequestOutput.error)
    PREWARM = "prewarm"  # a prewarm finished its prefill


@dataclass(frozen=True)
class EngineUsage:
    """A request's token counts as the engine saw them."""

    prompt_tokens: int
    cached_tokens: int  # prompt tokens served from the prefix cache
    output_tokens: int  # every sampled token, rewound ones included
    rewound_tokens: int = 0  # sampled tokens past a stop string's cut (their text is dropped)
    draft_tokens: int = 0  # speculative draft tokens checked for it
    accepted_draft_tokens: int = 0  # ... and kept

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens


@dataclass
class RequestOutput:
    """The news of one step for one request. token_ids and text are deltas: concatenate
    them over the stream. text may lag token_ids (an unfinished UTF-8 character, or a
    possible start of a stop string is held back), and the final output flushes it."""

    request_id: str
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finished: bool = False
    finish_reason: EngineFinish | None = None
    # What stopped it: the stop string, or the stop token id (None otherwise).
    stop_reason: str | int | None = None
    usage: EngineUsage | None = None  # set on the final output
    error: str | None = None  # set when finish_reason is ERROR
    logprobs: list[float] | None = None  # per token_ids entry, when params.logprobs
    # Per token_ids entry, when params.top_logprobs: that step's most likely tokens as
    # (token id, logprob), logprob descending (the sampled token may be absent).
    top_logprobs: list[list[tuple[int, float]]] | None = None


@dataclass
class Completion:
    """A whole request's result, the outputs of its stream folded together."""

    request_id: str
    token_ids: list[int]
    text: str
    finish_reason: EngineFinish | None
    stop_reason: str | int | None
    usage: EngineUsage | None
    error: str | None = None
    logprobs: list[float] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None

    @classmethod
    def fold(cls, request_id: str, outputs: list[RequestOutput]) -> Completion:
        last = outputs[-1] if outputs else RequestOutput(request_id)
        logprobs = [lp for o in outputs for lp in (o.logprobs or ())] if any(o.logprobs for o in outputs) else None
        tops = [t for o in outputs for t in (o.top_logprobs or ())] if any(o.top_logprobs for o in outputs) else None
        return cls(
            request_id=request_id,
            token_ids=[t for o in outputs for t in o.token_ids],
            text="".join(o.text for o in outputs),
            finish_reason=last.finish_reason,
            stop_reason=last.stop_reason,
            usage=last.usage,
            error=last.error,
            logprobs=logprobs,
            top_logprobs=tops,
        )
