"""`protocol.sampling.SamplingFields` -> the engine's `SamplingParams`, fitted to the context.

- The prompt must leave room for at least one output token, else 400
  ``context_length_exceeded`` naming `param` (``input`` / ``messages``).
- ``max_output_tokens`` is clipped to what the context has left; a response that then
  hits the end of the context ends ``incomplete`` (``max_output_tokens``), as one that
  hits its own limit does. No limit given = up to the context length. The server's
  output limit (``server.max_output_tokens``) is a default that also caps larger
  values: `RequestDefaults.fill` applies it, so the response echoes it.
- Defaults (`RequestDefaults`): a field the request omits takes the served model's
  default: `model.sampling` (the Hydra model group or the command line), then the
  checkpoint's own (generation_config.json, GGUF ``general.sampling.*``), then OpenAI's
  (temperature 1, top_p 1, the rest off). They are filled in before the response is
  built, so the response echoes the values used.
- ``top_logprobs`` (from the fields) is honoured when `logprobs` is on: the caller says
  whether logprobs are reported (Responses: the include, or ``top_logprobs`` itself;
  chat: ``logprobs: true``, which chat's decoder demands with ``top_logprobs``).
- ``grammar``: the output grammar of a JSON format, a demanded call, or strict and
  custom tools (`structured.output_grammar`); ``think_budget``: a thinking budget that
  no grammar carries (`tool_forcing.think_budget`).
- ``thinking`` is a template switch (`render`), not sampling.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ignis.engine import SamplingParams
from ignis.model.generation_config import SAMPLING_DEFAULT_KEYS
from ignis.engine.grammar import Grammar
from ignis.engine.thinking import ThinkBudget
from ignis.server.errors import context_too_long
from protocol.errors import Refusal
from protocol.sampling import SamplingFields

__all__ = ["engine_params", "check_context", "RequestDefaults"]

_SEED_MOD = 2**63
# OpenAI's own defaults, reported in every response as OpenAI reports them.
_OPENAI = {"temperature": 1.0, "top_p": 1.0}
_KEYS = SAMPLING_DEFAULT_KEYS


@dataclass(frozen=True)
class RequestDefaults:
    """The sampling values a request gets for the fields it omits, and where each came from."""

    values: Mapping[str, float | int]
    sources: Mapping[str, str]
    server_cap: int | None = None  # server.max_output_tokens

    @classmethod
    def resolve(cls, configured: Any = None, checkpoint: Mapping[str, float | int] | None = None, *,
                server_cap: int | None = None) -> RequestDefaults:
        """`configured`: `model.sampling` (ignis.config.SamplingDefaults, or None);
        `checkpoint`: `LoadedModel.generation_defaults`."""
        values: dict[str, float | int] = {}
        sources: dict[str, str] = {}
        for key in _KEYS:
            for source, table in (("model.sampling", _as_dict(configured)), ("checkpoint", checkpoint or {}),
                                  ("OpenAI", _OPENAI)):
                if table.get(key) is not None:
                    values[key], sources[key] = table[key], source
                    break
        if server_cap is not None and values.get("max_output_tokens", server_cap) >= server_cap:
            values["max_output_tokens"], sources["max_output_tokens"] = server_cap, "server.max_output_tokens"
        return cls(values, sources, server_cap)

    def fill(self, fields: SamplingFields) -> SamplingFields:
        """`fields` with each omitted value set to its default, and the output limit capped
        by server.max_output_tokens."""
        given = {k: getattr(fields, k) for k in _KEYS}
        changes = {k: v for k, v in self.values.items() if given[k] is None}
        wanted = given["max_output_tokens"]
        if wanted is not None and self.server_cap is not None and wanted > self.server_cap:
            changes["max_output_tokens"] = self.server_cap
        return dataclasses.replace(fields, **changes) if changes else fields

    def describe(self) -> str:
        """One line for the start-up log: each default and its source."""
        parts = [f"{k}={self.values[k]:g} ({self.sources[k]})" for k in _KEYS if k in self.values]
        return ", ".join(parts) + "; the rest off" if parts else "none"


def _as_dict(configured: Any) -> dict[str, Any]:
    if configured is None:
        return {}
    if isinstance(configured, Mapping):
        return dict(configured)
    return {k: getattr(configured, k, None) for k in _KEYS}


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
    think_budget: ThinkBudget | None = None,
    grammar: Grammar | None = None,
) -> SamplingParams:
    check_context(prompt_len, max_model_len, param)
    room = max_model_len - prompt_len  # the server's own cap is applied once, by RequestDefaults.fill
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
        think_budget=think_budget,
        grammar=grammar,
        ignore_eos=bool(fields.ignore_eos),
        min_tokens=fields.min_tokens or 0,
    )
    try:
        params.validate()
    except ValueError as exc:  # the decoders check ranges first; this is a safety net
        raise Refusal(f"Invalid sampling parameters: {exc}", param=None, code="invalid_value") from None
    return params
