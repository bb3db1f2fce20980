"""Responses API conversation items, as frozen dataclasses, and their encoders.

One dataclass per item type ignis understands; `to_dict()` gives the wire form
(the form a client sends back and the form inside a response's ``output``). The
decoder (`protocol.decode.decode_item`) is the inverse: for every item,
``decode_item(item.to_dict()) == item``.

Sequences are tuples (items are immutable); optional fields that are None are left
out of the wire form.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Union

__all__ = [
    "InputText",
    "OutputText",
    "SummaryText",
    "ReasoningText",
    "ContentPart",
    "Message",
    "FunctionCall",
    "FunctionCallOutput",
    "CustomToolCall",
    "CustomToolCallOutput",
    "Reasoning",
    "Compaction",
    "Item",
    "ROLES",
    "ITEM_STATUSES",
]

ROLES = ("user", "system", "developer", "assistant")
ITEM_STATUSES = ("in_progress", "completed", "incomplete")
Role = Literal["user", "system", "developer", "assistant"]
ItemStatus = Literal["in_progress", "completed", "incomplete"]


def _with_set(d: dict[str, Any], **optional: Any) -> dict[str, Any]:
    """`d` plus the `optional` fields that are set: the wire form leaves out the others."""
    d.update((k, v) for k, v in optional.items() if v is not None)
    return d


def _text(content: str | tuple[Any, ...]) -> str:
    """String content as is, text parts concatenated."""
    return content if isinstance(content, str) else "".join(p.text for p in content)


def _parts(content: str | tuple[Any, ...]) -> str | list[dict[str, Any]]:
    """String content as is, parts in their wire form."""
    return content if isinstance(content, str) else [p.to_dict() for p in content]


@dataclass(frozen=True, slots=True)
class InputText:
    text: str

    def to_dict(self) -> dict[str, Any]:
        return {"type": "input_text", "text": self.text}


@dataclass(frozen=True, slots=True)
class OutputText:
    """Assistant text. `annotations` and `logprobs` are kept verbatim (JSON objects)."""

    text: str
    annotations: tuple[Any, ...] = ()
    logprobs: tuple[Any, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        logprobs = None if self.logprobs is None else list(self.logprobs)
        return _with_set({"type": "output_text", "text": self.text, "annotations": list(self.annotations)}, logprobs=logprobs)


@dataclass(frozen=True, slots=True)
class SummaryText:
    text: str

    def to_dict(self) -> dict[str, Any]:
        return {"type": "summary_text", "text": self.text}


@dataclass(frozen=True, slots=True)
class ReasoningText:
    text: str

    def to_dict(self) -> dict[str, Any]:
        return {"type": "reasoning_text", "text": self.text}


ContentPart = Union[InputText, OutputText]


@dataclass(frozen=True, slots=True)
class Message:
    """A message; `content` is a plain string or a tuple of text parts.

    Any role may carry either text part type: both are plain text to the model.
    `phase` (assistant messages: "commentary" | "final_answer") is kept verbatim.
    """

    role: Role
    content: str | tuple[ContentPart, ...]
    id: str | None = None
    status: ItemStatus | None = None
    phase: str | None = None

    @property
    def text(self) -> str:
        """The content as one string (parts concatenated)."""
        return _text(self.content)

    def to_dict(self) -> dict[str, Any]:
        d = {"type": "message", "role": self.role, "content": _parts(self.content)}
        return _with_set(d, id=self.id, status=self.status, phase=self.phase)


@dataclass(frozen=True, slots=True)
class FunctionCall:
    """A tool call the model made; `arguments` is the JSON text exactly as generated."""

    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: ItemStatus | None = None
    namespace: str | None = None  # the namespace tool it belongs to

    def to_dict(self) -> dict[str, Any]:
        d = {"type": "function_call", "call_id": self.call_id, "name": self.name, "arguments": self.arguments}
        return _with_set(d, id=self.id, status=self.status, namespace=self.namespace)


@dataclass(frozen=True, slots=True)
class FunctionCallOutput:
    """A tool result; `output` is a string or a tuple of `InputText` parts; `name`
    (optional on the wire) is the called function's name."""

    call_id: str
    output: str | tuple[InputText, ...]
    id: str | None = None
    status: ItemStatus | None = None
    name: str | None = None

    @property
    def text(self) -> str:
        return _text(self.output)

    def to_dict(self) -> dict[str, Any]:
        d = {"type": "function_call_output", "call_id": self.call_id, "output": _parts(self.output)}
        return _with_set(d, id=self.id, status=self.status, name=self.name)


@dataclass(frozen=True, slots=True)
class CustomToolCall:
    """A call to a custom (freeform) tool; `input` is the text the model wrote for it."""

    call_id: str
    name: str
    input: str
    id: str | None = None
    namespace: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = {"type": "custom_tool_call", "call_id": self.call_id, "name": self.name, "input": self.input}
        return _with_set(d, id=self.id, namespace=self.namespace)


@dataclass(frozen=True, slots=True)
class CustomToolCallOutput:
    """A custom tool's result: a string or a tuple of `InputText` parts."""

    call_id: str
    output: str | tuple[InputText, ...]
    id: str | None = None

    @property
    def text(self) -> str:
        return _text(self.output)

    def to_dict(self) -> dict[str, Any]:
        d = {"type": "custom_tool_call_output", "call_id": self.call_id, "output": _parts(self.output)}
        return _with_set(d, id=self.id)


@dataclass(frozen=True, slots=True)
class Reasoning:
    """A reasoning item.

    `content` is None when the client sent ``content: null`` (Codex does, keeping
    only `encrypted_content`). `recovered_text` is not on the wire: the decoder
    fills it from an `encrypted_content` that ignis can read
    (`protocol.encrypted.open_reasoning`). `text` is what the model should see
    again: the `content` text when given, else the recovered text, else None.
    """

    id: str
    summary: tuple[SummaryText, ...] = ()
    content: tuple[ReasoningText, ...] | None = None
    encrypted_content: str | None = None
    status: ItemStatus | None = None
    recovered_text: str | None = None

    @property
    def text(self) -> str | None:
        if self.content:
            return "".join(p.text for p in self.content)
        return self.recovered_text

    def to_dict(self) -> dict[str, Any]:
        d = {
            "type": "reasoning",
            "id": self.id,
            "summary": [p.to_dict() for p in self.summary],
            "content": None if self.content is None else [p.to_dict() for p in self.content],
        }
        return _with_set(d, encrypted_content=self.encrypted_content, status=self.status)


@dataclass(frozen=True, slots=True)
class Compaction:
    """A ``compaction`` item (`POST /v1/responses/compact`'s output): the earlier
    conversation's summary, sealed in `encrypted_content` (`protocol.encrypted`). `summary`
    is not on the wire: the decoder fills it from the token (or refuses the item)."""

    encrypted_content: str
    id: str | None = None
    summary: str = ""

    def to_dict(self) -> dict[str, Any]:
        return _with_set({"type": "compaction", "encrypted_content": self.encrypted_content}, id=self.id)


Item = Union[Message, FunctionCall, FunctionCallOutput, CustomToolCall, CustomToolCallOutput, Reasoning, Compaction]
