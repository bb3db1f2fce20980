"""`protocol.sampling.SamplingFields` -> the engine's `SamplingParams`, fitted to the context.

- The prompt must leave room for at least one output token, else 400
  ``context_length_exceeded`` naming `param` (``input`` / ``messages``).
- ``max_output_tokens`` is clipped to what the context has left; a response that then
  hits the end of the context ends ``incomplete`` (``max_output_tokens``), as one that
  hits its own limit does. No limit given = up to the context length, or to the
  server's output limit (``server.max_output_tokens``), which also caps larger ones.
- Defaults are OpenAI's: temperature 1, top_p 1 (no model-specific defaults).
- ``top_logprobs`` (from the fields) is honoured when `logprobs` is on: the caller says
  whether logprobs are reported (Responses: the include, or ``top_logprobs`` itself;
  chat: ``logprobs: true``, which chat's decoder demands with ``top_logprobs``).
- ``constraint``: the forced start of a required tool call and the thinking budget
  (`constraints.constrain_output`).
- ``thinking`` is a template switch (`render`), not sampling.
"""

from __future__ import annotations

from ignis.engine import SamplingParams
from ignis.engine.constraint import OutputConstraint
from ignis.server.errors import context_too_long
from protocol.errors import Refusal
from protocol.sampling import SamplingFields

__all__ = ["engine_params", "check_context"]

_SEED_MOD = 2**63


def check_context(prompt_len: int, max_model_len: int, param: str, *, prewarm: bool = False) -> None:
    limit = max_model_len if prewarm else max_model_len - 1
    if prompt_len > limit:
        raise context_too_long(prompt_len, max_model_len, param)


def engine_params(
    fields: SamplingFields,
    *,
    prompt_len: int,
    max_model_len: int,
    logprobs: bool = False,
    param: str = "input",
    constraint: OutputConstraint | None = None,
    max_output_tokens: int | None = None,
) -> SamplingParams:
    check_context(prompt_len, max_model_len, param)
    room = max_model_len - prompt_len
    if max_output_tokens is not None:  # the server's output limit (server.max_output_tokens)
        room = min(room, max_output_tokens)
    wanted = fields.max_output_tokens
    params = SamplingParams(
        max_tokens=min(wanted, room) if wanted is not None else room,
        temperature=1.0 if fields.temperature is None else float(fields.temperature),
        top_p=1.0 if fields.top_p is None else float(fields.top_p),
        top_k=fields.top_k or 0,
        min_p=fields.min_p or 0.0,
        repetition_penalty=1.0 if fields.repetition_penalty is None else float(fields.repetition_penalty),
        presence_penalty=fields.presence_penalty or 0.0,
        frequency_penalty=fields.frequency_penalty or 0.0,
        seed=None if fields.seed is None else int(fields.seed) % _SEED_MOD,
        stop=tuple(fields.stop or ()),
        logprobs=logprobs,
        top_logprobs=(fields.top_logprobs or 0) if logprobs else 0,
        constraint=constraint,
    )
    try:
        params.validate()
    except ValueError as exc:  # the decoders check ranges first; this is a safety net
        raise Refusal(f"Invalid sampling parameters: {exc}", param=None, code="invalid_value") from None
    return params
