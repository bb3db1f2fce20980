"""Sampling and thinking fields shared by the Responses and chat-completions decoders.

`extract_sampling(body)` reads the sampling knobs out of a request dict, checks
types and ranges, and returns a `SamplingFields` (``None`` = not given, use the
engine/model default). Wire names differ by endpoint, so the wire-name -> field
mapping is a parameter: `RESPONSES_NAMES` (``max_output_tokens``, effort at
``reasoning.effort``) and `CHAT_NAMES` (``max_tokens`` / ``max_completion_tokens``,
effort at ``reasoning_effort``).

Ranges (OpenAI's where OpenAI has the field, ignis's otherwise):

=====================  ==========================================  ==================
field                  accepted                                    note
=====================  ==========================================  ==================
temperature            number, 0 <= t <= 2                         0 = greedy
top_p                  number, 0 <= p <= 1                         0 = keep only the
                                                                   most probable token
top_k                  integer >= 0, or -1                         0 and -1 = off
                                                                   (-1 normalised to 0)
min_p                  number, 0 <= p <= 1                         0 = off
repetition_penalty     number > 0                                  1 = off
presence_penalty       number, -2 <= x <= 2                        0 = off
frequency_penalty      number, -2 <= x <= 2                        0 = off
seed                   integer in [-2**63, 2**64)                  per-request RNG
stop                   string, or array of <= 4 non-empty strings  normalised to a
                                                                   tuple (``[]`` -> None)
max_output_tokens      integer >= 1                                OpenAI's Responses
                                                                   API wants >= 16;
                                                                   ignis allows 1
top_logprobs           integer, 0 <= n <= 20
ignore_eos             boolean                                     vLLM's benchmark
                                                                   extension: EOS does
                                                                   not end the output
min_tokens             integer >= 0, <= max_output_tokens          vLLM's: EOS and stop
                                                                   tokens cannot end the
                                                                   output before N tokens
thinking               see below
=====================  ==========================================  ==================

Thinking control (ignis extension, Anthropic-shaped)::

    "thinking": {"type": "enabled", "budget_tokens": 2048}   # on, at most 2048 tokens
    "thinking": {"type": "enabled"}                          # on, no budget
    "thinking": {"type": "disabled"}                         # off
    "thinking": true / false                                  # shorthand

``reasoning.effort`` (chat: ``reasoning_effort``) maps onto the same two fields:

=========  ===========  ===============
effort     thinking     thinking_budget
=========  ===========  ===============
none       False        None
minimal    True         256
low        True         1024
medium     True         4096
high       True         16384
xhigh      True         None (unbounded)
max        True         None (unbounded; newest SDKs list it)
null       None         None (model default)
=========  ===========  ===============

When both are given, the explicit ``thinking`` object wins (it is the more
specific knob). A budget counts reasoning tokens; when it runs out the engine
closes the reasoning block and the answer follows (an engine concern).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping

from protocol.checks import (
    check_array,
    check_bool,
    check_enum,
    check_int,
    check_known_keys,
    check_number,
    check_object,
    check_str,
    path,
    refuse_type,
    require,
)
from protocol.errors import Refusal

__all__ = [
    "SamplingFields",
    "RESPONSES_NAMES",
    "CHAT_NAMES",
    "EFFORTS",
    "EFFORT_THINKING",
    "thinking_for_effort",
    "extract_sampling",
    "MAX_STOP",
    "MAX_TOP_LOGPROBS",
]

MAX_STOP = 4
MAX_TOP_LOGPROBS = 20
_SEED_MIN = -(2**63)
_SEED_MAX = 2**64 - 1


@dataclass(frozen=True, slots=True)
class SamplingFields:
    """Sampling knobs of one request; ``None`` means "not given: use the default"."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # 0 = off (-1 on the wire is normalised to 0)
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] | None = None
    max_output_tokens: int | None = None
    top_logprobs: int | None = None
    thinking: bool | None = None  # None = the model's default
    thinking_budget: int | None = None  # reasoning-token budget; None = unbounded
    ignore_eos: bool | None = None  # vLLM extension (benchmarks): EOS does not end the output
    min_tokens: int | None = None  # vLLM extension: no EOS / stop token before this many

    def to_dict(self) -> dict[str, Any]:
        """The fields that were given (not None), as plain JSON-able values."""
        out = {k: v for k, v in asdict(self).items() if v is not None}
        if "stop" in out:
            out["stop"] = list(out["stop"])
        return out


# wire key -> SamplingFields attribute. Several wire keys may feed one field.
RESPONSES_NAMES: Mapping[str, str] = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "seed": "seed",
    "stop": "stop",
    "max_output_tokens": "max_output_tokens",
    "top_logprobs": "top_logprobs",
    "ignore_eos": "ignore_eos",
    "min_tokens": "min_tokens",
    "thinking": "thinking",
}

CHAT_NAMES: Mapping[str, str] = {
    **{k: v for k, v in RESPONSES_NAMES.items() if k != "max_output_tokens"},
    "max_tokens": "max_output_tokens",
    "max_completion_tokens": "max_output_tokens",
}

EFFORTS: tuple[str, ...] = ("none", "minimal", "low", "medium", "high", "xhigh", "max")

# effort -> (thinking, thinking_budget)
EFFORT_THINKING: Mapping[str, tuple[bool, int | None]] = {
    "none": (False, None),
    "minimal": (True, 256),
    "low": (True, 1024),
    "medium": (True, 4096),
    "high": (True, 16384),
    "xhigh": (True, None),
    "max": (True, None),
}


def thinking_for_effort(effort: str | None) -> tuple[bool | None, int | None]:
    """``reasoning.effort`` -> ``(thinking, thinking_budget)``; None -> (None, None)."""
    if effort is None:
        return (None, None)
    return EFFORT_THINKING[effort]


def _number(**bounds: float) -> Callable[[Any, str], float]:
    return lambda value, param: check_number(value, param, **bounds)


def _check_top_k(value: Any, param: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value == -1:
        return 0
    return check_int(value, param, ge=0)


def _check_stop(value: Any, param: str) -> tuple[str, ...] | None:
    if isinstance(value, str):
        return (check_str(value, param, min_len=1),)
    if not isinstance(value, list):
        refuse_type(param, "string", value)
    check_array(value, param, max_len=MAX_STOP)
    if not value:
        return None
    return tuple(check_str(s, path(param, i), min_len=1) for i, s in enumerate(value))


def _check_thinking(value: Any, param: str) -> tuple[bool, int | None]:
    if isinstance(value, bool):
        return (value, None)
    obj = check_object(value, param)
    check_known_keys(obj, param, {"type", "budget_tokens"})
    kind = check_enum(require(obj, "type", param), path(param, "type"), ("enabled", "disabled"))
    budget = obj.get("budget_tokens")
    if kind == "disabled":
        if budget is not None:
            raise Refusal(
                f"Invalid '{param}.budget_tokens': a budget needs thinking enabled.",
                param=f"{param}.budget_tokens",
                code="invalid_value",
            )
        return (False, None)
    if budget is not None:
        budget = check_int(budget, f"{param}.budget_tokens", ge=1)
    return (True, budget)


_CHECKS = {
    "temperature": _number(ge=0.0, le=2.0),
    "top_p": _number(ge=0.0, le=1.0),
    "min_p": _number(ge=0.0, le=1.0),
    "presence_penalty": _number(ge=-2.0, le=2.0),
    "frequency_penalty": _number(ge=-2.0, le=2.0),
    "repetition_penalty": _number(gt=0.0),
    "top_k": _check_top_k,
    "seed": lambda v, p: check_int(v, p, ge=_SEED_MIN, le=_SEED_MAX),
    "stop": _check_stop,
    "max_output_tokens": lambda v, p: check_int(v, p, ge=1),
    "top_logprobs": lambda v, p: check_int(v, p, ge=0, le=MAX_TOP_LOGPROBS),
    "ignore_eos": check_bool,
    "min_tokens": lambda v, p: check_int(v, p, ge=0),
    "thinking": _check_thinking,
}


def _get_dotted(body: Mapping[str, Any], dotted: str) -> tuple[Any, str]:
    """Value at ``a.b`` (None when any level is absent/null); refuses a non-object level."""
    parts = dotted.split(".")
    cur: Any = body
    for i, part in enumerate(parts):
        if cur is None:
            return None, dotted
        if i:
            check_object(cur, ".".join(parts[:i]))
        cur = cur.get(part)
    return cur, dotted


def extract_sampling(
    body: Mapping[str, Any],
    *,
    names: Mapping[str, str] = RESPONSES_NAMES,
    effort_param: str | None = "reasoning.effort",
    prefix: str = "",
) -> SamplingFields:
    """Check and extract the sampling/thinking fields of a request body.

    - `names`: wire key -> `SamplingFields` attribute (`RESPONSES_NAMES`, `CHAT_NAMES`
      or your own). Keys absent from the body, or null, leave the field None. When two
      wire keys feed one field (chat's ``max_tokens`` and ``max_completion_tokens``)
      and both are given with different values, the later one is refused.
    - `effort_param`: dotted path of the reasoning effort (``"reasoning.effort"``,
      chat ``"reasoning_effort"``), or None to not read one. See the module table.
    - `prefix`: param-path prefix for refusals when `body` is nested.

    Raises `Refusal` (status 400, OpenAI's codes) with `param` at the offending value.
    Does not look for unknown keys: that is the endpoint decoder's job.
    """
    values: dict[str, Any] = {}
    thinking: tuple[bool, int | None] | None = None
    for wire, field in names.items():
        raw = body.get(wire)
        if raw is None:
            continue
        param = path(prefix, wire)
        check = _CHECKS.get(field)
        if check is None:
            raise ValueError(f"extract_sampling: unknown field {field!r} for {wire!r}")
        value = check(raw, param)
        if field == "thinking":
            thinking = value
            continue
        if field in values and values[field] != value:
            raise Refusal(
                f"Invalid '{param}': conflicts with another field that sets the same value.",
                param=param,
                code="invalid_value",
            )
        values[field] = value
    if effort_param is not None:
        # Checked even when an explicit `thinking` wins: a wrong value never passes.
        effort, _ = _get_dotted(body, effort_param)
        if effort is not None:
            check_enum(effort, path(prefix, effort_param), EFFORTS)
        if thinking is None:
            thinking = thinking_for_effort(effort)
    if thinking is not None:
        values["thinking"], values["thinking_budget"] = thinking
    low, high = values.get("min_tokens"), values.get("max_output_tokens")
    if low is not None and high is not None and low > high:
        param = path(prefix, "min_tokens")
        raise Refusal(
            f"Invalid '{param}': {low} is more than the output limit ({high}).",
            param=param,
            code="invalid_value",
        )
    return SamplingFields(**values)
