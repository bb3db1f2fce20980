"""A decoded Responses request (``POST /v1/responses`` body or ``response.create`` frame).

Built only by `protocol.decode.decode_request`; everything in it is already
checked. The parts the response object echoes back have a `to_wire()`. Tools and
the tool choice are the types both endpoints share (`protocol.conversation`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

from protocol.conversation import FunctionTool, ToolChoice
from protocol.items import Item
from protocol.sampling import SamplingFields
from protocol.structured import TextFormat

__all__ = [
    "ReasoningConfig",
    "TextConfig",
    "ResponsesRequest",
    "INCLUDE_ENCRYPTED_REASONING",
    "INCLUDE_LOGPROBS",
]

INCLUDE_ENCRYPTED_REASONING = "reasoning.encrypted_content"
INCLUDE_LOGPROBS = "message.output_text.logprobs"


@dataclass(frozen=True, slots=True)
class ReasoningConfig:
    effort: str | None = None
    summary: str | None = None  # "auto" | "concise" | "detailed" | None

    def to_wire(self) -> dict[str, Any]:
        return {"effort": self.effort, "summary": self.summary}


@dataclass(frozen=True, slots=True)
class TextConfig:
    """The output format (text, or JSON constrained by a grammar: protocol.structured),
    echoed as sent; `verbosity` is carried and echoed."""

    verbosity: str | None = None
    format: TextFormat = field(default_factory=TextFormat)

    def to_wire(self) -> dict[str, Any]:
        d: dict[str, Any] = {"format": self.format.to_wire()}
        if self.verbosity is not None:
            d["verbosity"] = self.verbosity
        return d


@dataclass(frozen=True, slots=True)
class ResponsesRequest:
    model: str
    # A string `input` becomes one user message with string content.
    input: tuple[Item, ...]
    instructions: str | None = None
    tools: tuple[FunctionTool, ...] = ()  # a namespace's tools flattened, named NAMESPACE.NAME
    namespaces: tuple[tuple[str, str], ...] = ()  # (name, description) of each namespace tool
    tool_choice: ToolChoice = field(default_factory=ToolChoice)
    parallel_tool_calls: bool = True
    sampling: SamplingFields = field(default_factory=SamplingFields)
    reasoning: ReasoningConfig | None = None
    text: TextConfig = field(default_factory=TextConfig)
    stream: bool = False
    include: tuple[str, ...] = ()
    include_obfuscation: bool | None = None  # stream_options; accepted, not acted on
    truncation: Literal["disabled", "auto"] = "disabled"
    previous_response_id: str | None = None  # only ever set on the socket transport
    # Accepted and changing nothing; echoed where OpenAI echoes them.
    store: bool | None = None
    metadata: Mapping[str, str] | None = None
    user: str | None = None
    prompt_cache_key: str | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_retention: str | None = None
    client_metadata: Mapping[str, Any] | None = None

    # Convenience views.
    @property
    def temperature(self) -> float | None:
        return self.sampling.temperature

    @property
    def top_p(self) -> float | None:
        return self.sampling.top_p

    @property
    def max_output_tokens(self) -> int | None:
        return self.sampling.max_output_tokens

    @property
    def top_logprobs(self) -> int | None:
        return self.sampling.top_logprobs

    @property
    def include_encrypted_reasoning(self) -> bool:
        return INCLUDE_ENCRYPTED_REASONING in self.include

    @property
    def include_logprobs(self) -> bool:
        return INCLUDE_LOGPROBS in self.include

    def tools_to_wire(self) -> list[dict[str, Any]]:
        """The ``tools`` echo: the tools as sent, a namespace's tools inside it again."""
        descriptions = dict(self.namespaces)
        out: list[dict[str, Any]] = []
        for tool in self.tools:
            if tool.namespace is None:
                out.append(tool.to_wire())
                continue
            if not (out and out[-1].get("type") == "namespace" and out[-1]["name"] == tool.namespace):
                out.append({"type": "namespace", "name": tool.namespace,
                            "description": descriptions.get(tool.namespace, ""), "tools": []})
            out[-1]["tools"].append(tool.to_wire())
        return out
