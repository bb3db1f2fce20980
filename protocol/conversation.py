"""The internal conversation: what both endpoints decode into and the template renders.

A chat-completions ``messages`` array and a Responses ``input`` item list both
become ONE list of `ChatMessage` (plus the `FunctionTool` list and a `ToolChoice`,
which are also what the decoded requests of both endpoints hold).
The server renders that list with the model's chat template and tokenizes it once,
so the same conversation gives the same token ids whichever endpoint it came
through, and the prefix cache hits across endpoints.

Normalisation rules (both decoders must follow them):

- ``role`` is one of `ROLES`. ``developer`` stays ``developer`` here; a renderer
  whose template has no developer role maps it to ``system`` (one place, not two).
- ``content`` is always a ``str`` (``""`` when the wire had null or no content,
  e.g. an assistant turn that only called tools). A list of text parts is joined
  with `join_text` (`TEXT_PART_SEPARATOR`, i.e. concatenated in order, as the
  HF templates that iterate over parts do). Client text is never parsed into
  special tokens: it stays text.
- ``reasoning`` is the thinking text of an assistant turn (chat:
  ``reasoning_content``; Responses: a ``reasoning`` item's summary/content text),
  or None when there was none. The renderer decides whether the template shows it.
- ``tool_calls`` are the function calls an assistant turn made, in order; one
  assistant turn holds all calls made between two non-assistant messages.
  ``ToolCall.arguments`` is the JSON text exactly as sent (not re-serialised, so
  the tokens match what the model produced); `ToolCall.arguments_object` parses it
  for templates that want an object.
- Tools are functions to the template: a Responses ``custom`` tool is a function with
  one string argument, ``input``, and a tool inside a ``namespace`` is named
  ``NAMESPACE.NAME`` (`FunctionTool`); their calls are rendered the same way.
- ``tool_call_id`` (role ``tool`` only) is the id of the call it answers
  (chat: ``tool_call_id``; Responses: ``function_call_output.call_id``).
- ``name``: for role ``tool``, the name of the function whose result this is,
  resolved from the answered call (templates such as Llama's and Gemma's want it);
  for the other roles, the optional participant name a chat client sent (Responses
  has none).

Pure stdlib: no ignis, sanic, torch or asyncio.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal, Mapping

__all__ = [
    "Role",
    "ROLES",
    "TEXT_PART_SEPARATOR",
    "join_text",
    "ToolCall",
    "ChatMessage",
    "CustomFormat",
    "FunctionTool",
    "ToolChoice",
    "to_template_messages",
    "to_template_tools",
]

Role = Literal["system", "developer", "user", "assistant", "tool"]
ROLES: tuple[str, ...] = ("system", "developer", "user", "assistant", "tool")

# Text parts of one message are concatenated in order, with nothing in between.
TEXT_PART_SEPARATOR = ""


def join_text(parts: Iterable[str]) -> str:
    """The content string of a message given as several text parts."""
    return TEXT_PART_SEPARATOR.join(parts)


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One function call made by the assistant."""

    id: str  # the call id the tool result refers to (chat tool_calls[].id / Responses call_id)
    name: str
    arguments: str  # JSON text, as the model wrote it

    def arguments_object(self) -> Any:
        """The arguments parsed as JSON, or the raw string when they are not valid JSON."""
        try:
            return json.loads(self.arguments)
        except (ValueError, RecursionError):
            return self.arguments

    def to_template(self, *, arguments_as_object: bool = False) -> dict[str, Any]:
        """OpenAI/HF shape: ``{"id", "type": "function", "function": {"name", "arguments"}}``."""
        args = self.arguments_object() if arguments_as_object else self.arguments
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": args}}


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One turn of the internal conversation (see the module notes for each field)."""

    role: Role
    content: str = ""
    reasoning: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None

    def to_template(self, *, arguments_as_object: bool = False) -> dict[str, Any]:
        """The dict a HF chat template expects for this message.

        Always ``role`` and ``content``; ``reasoning_content`` when there is reasoning,
        ``tool_calls`` when there are calls, ``tool_call_id`` and ``name`` when set.
        `arguments_as_object`: parse call arguments to objects (Llama 3.x templates
        apply ``tojson`` to them; Qwen's accept either).
        """
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.reasoning is not None:
            out["reasoning_content"] = self.reasoning
        if self.tool_calls:
            out["tool_calls"] = [c.to_template(arguments_as_object=arguments_as_object) for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out


@dataclass(frozen=True, slots=True)
class CustomFormat:
    """A custom tool's input format: free text (`syntax` None), or a grammar (``lark``
    or ``regex``) its `definition` spells."""

    syntax: Literal["lark", "regex"] | None = None
    definition: str | None = None

    def to_wire(self) -> dict[str, Any]:
        if self.syntax is None:
            return {"type": "text"}
        return {"type": "grammar", "syntax": self.syntax, "definition": self.definition}


@dataclass(frozen=True, slots=True)
class FunctionTool:
    """A tool the model may call (chat ``tools[i].function``; Responses ``tools[i]``).

    `name` is the name the model sees and calls: a tool inside a Responses ``namespace``
    tool is ``NAMESPACE.NAME`` (`namespace` set; `wire_name` is its own name). A
    `format` makes it a custom (freeform) tool: shown to the model as a function with
    one string argument, ``input``, whose text the format constrains."""

    name: str
    description: str | None = None
    parameters: Mapping[str, Any] | None = None  # a JSON schema (an object), as sent
    # True: `parameters` lies in OpenAI's strict subset, and a call the server's grammar
    # constrains follows it (ignis.server.structured).
    strict: bool | None = None
    namespace: str | None = None
    format: CustomFormat | None = None  # set: a custom tool
    where: str | None = field(default=None, compare=False)  # its place in the request, for refusals

    @property
    def is_custom(self) -> bool:
        return self.format is not None

    @property
    def wire_name(self) -> str:
        """The tool's own name (without its namespace)."""
        return self.name if self.namespace is None else self.name[len(self.namespace) + 1:]

    def to_template(self) -> dict[str, Any]:
        """HF/OpenAI shape: ``{"type": "function", "function": {"name", "description"?, "parameters"}}``.

        ``parameters`` defaults to an empty object schema, as OpenAI treats a missing one;
        a custom tool's is one string, ``input``, described by its format.
        """
        fn: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            fn["description"] = self.description
        if self.format is not None:
            fn["parameters"] = {"type": "object", "properties": {"input": _input_schema(self.format)},
                                "required": ["input"], "additionalProperties": False}
        else:
            fn["parameters"] = dict(self.parameters) if self.parameters is not None else {"type": "object", "properties": {}}
        return {"type": "function", "function": fn}

    def to_wire(self) -> dict[str, Any]:
        """The Responses echo (a response object's ``tools[i]``, or a namespace's), fields as sent."""
        if self.format is not None:
            return {"type": "custom", "name": self.wire_name, "description": self.description,
                    "format": self.format.to_wire()}
        return {
            "type": "function",
            "name": self.wire_name,
            "description": self.description,
            "parameters": self.parameters,
            "strict": self.strict,
        }


def _input_schema(fmt: CustomFormat) -> dict[str, Any]:
    if fmt.syntax is None:
        return {"type": "string", "description": "The tool's input, as free text."}
    return {"type": "string", "description": f"The tool's input, which must match this {fmt.syntax} grammar:\n"
                                            f"{fmt.definition}"}


@dataclass(frozen=True, slots=True)
class ToolChoice:
    """Whether and which tool the model must call.

    ``mode``: ``none`` (never call), ``auto`` (model decides), ``required`` (call at
    least one). ``name``: the one function it must call (chat ``{"type": "function",
    "function": {"name"}}``, Responses ``{"type": "function", "name"}``), with mode
    ``required``. ``allowed``: Responses ``allowed_tools``, the names it may call
    (None: every tool); `protocol.responses_conversation.to_conversation` cuts the tool
    list to them instead, so what the renderer gets has None here.
    """

    mode: Literal["none", "auto", "required"] = "auto"
    name: str | None = None
    allowed: tuple[str, ...] | None = None
    kind: Literal["function", "custom"] = "function"  # the named tool's type, for the echo

    def to_wire(self) -> str | dict[str, Any]:
        """The Responses echo (a response object's ``tool_choice``), in the form sent."""
        if self.allowed is not None:
            return {
                "type": "allowed_tools",
                "mode": self.mode,
                "tools": [{"type": "function", "name": n} for n in self.allowed],
            }
        if self.name is not None:
            return {"type": self.kind, "name": self.name}
        return self.mode


def to_template_messages(messages: Iterable[ChatMessage], *, arguments_as_object: bool = False) -> list[dict[str, Any]]:
    """The whole conversation as HF chat-template dicts."""
    return [m.to_template(arguments_as_object=arguments_as_object) for m in messages]


def to_template_tools(tools: Iterable[FunctionTool]) -> list[dict[str, Any]]:
    """The tool list as HF chat-template dicts (empty list when there are none)."""
    return [t.to_template() for t in tools]
