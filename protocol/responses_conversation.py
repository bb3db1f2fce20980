"""Responses request -> the internal conversation (`protocol.conversation`).

`to_conversation(request)` gives the same `ChatMessage` list a chat-completions
request with the same turns gives, so both endpoints render the same tokens.

Rules (beyond those in `protocol.conversation`):

- ``instructions`` become a first ``system`` message.
- ``message`` items keep their role; text parts are joined (`join_text`).
- A ``reasoning`` item's text (its ``content``, else the text recovered from
  ``encrypted_content``, else its summary text) becomes the ``reasoning`` of the
  next assistant turn; several are concatenated. Reasoning after the last
  assistant turn with nothing following is attached to that turn, or dropped
  when there is none.
- ``function_call`` items join the assistant turn right before them (the
  message or calls of the same turn), else open a new assistant turn with
  empty content.
- ``function_call_output`` becomes a ``tool`` message whose ``name`` is the name
  of the call it answers (else the output item's own ``name``, else None: the
  call may lie behind ``previous_response_id``).
- ``custom_tool_call`` is a call like a function's, its arguments ``{"input": INPUT}``
  (a custom tool is a one-string function to the template), and
  ``custom_tool_call_output`` a ``tool`` message like a function's result. A call
  with a ``namespace`` is named ``NAMESPACE.NAME``, as its tool is.
- A ``compaction`` item (the summary `POST /v1/responses/compact` wrote of the turns it
  replaced) becomes an assistant turn, `COMPACTION_PREFIX` + the summary: the model
  reads what it said and did before as its own earlier answer.
- Tools: every function tool. ``tool_choice``: "none" / "auto" / "required"
  map as is; ``{"type": "function", "name"}`` is required + that name; with
  ``allowed_tools`` the tool list is cut to the allowed tools (the template
  cannot express the restriction otherwise) and the mode kept.
"""

from __future__ import annotations

import json
from typing import NamedTuple

from protocol.conversation import (
    ChatMessage,
    FunctionTool,
    ToolCall,
    ToolChoice,
    join_text,
)
from protocol.errors import Refusal
from protocol.items import (
    Compaction,
    CustomToolCall,
    CustomToolCallOutput,
    FunctionCall,
    FunctionCallOutput,
    Item,
    Message,
    Reasoning,
)
from protocol.request import ResponsesRequest

__all__ = ["Conversation", "to_conversation", "reasoning_text", "check_call_outputs", "COMPACTION_PREFIX"]

COMPACTION_PREFIX = "Summary of the conversation so far: "


class Conversation(NamedTuple):
    messages: tuple[ChatMessage, ...]
    tools: tuple[FunctionTool, ...]
    tool_choice: ToolChoice


def reasoning_text(item: Reasoning) -> str | None:
    """What the model should see again of a reasoning item (None: nothing)."""
    text = item.text
    if text is None and item.summary:
        text = join_text(p.text for p in item.summary)
    return text or None


def _join_reasoning(a: str | None, b: str | None) -> str | None:
    if a is None:
        return b
    if b is None:
        return a
    return a + b


def to_conversation(request: ResponsesRequest) -> Conversation:
    tools, choice = _tools(request.tools, request.tool_choice)
    return Conversation(_messages(request), tools, choice)


def _messages(request: ResponsesRequest) -> tuple[ChatMessage, ...]:
    out: list[ChatMessage] = []
    if request.instructions is not None:
        out.append(ChatMessage("system", request.instructions))
    pending: str | None = None  # reasoning waiting for its assistant turn
    names: dict[str, str] = {}
    last_is_turn = False  # out[-1] is an assistant turn that calls may still join
    for item in request.input:
        if isinstance(item, Message):
            content = item.content if isinstance(item.content, str) else join_text(p.text for p in item.content)
            if item.role == "assistant":
                out.append(ChatMessage("assistant", content, reasoning=pending))
                pending = None
                last_is_turn = True
            else:
                out.append(ChatMessage(item.role, content))
                last_is_turn = False
        elif isinstance(item, Reasoning):
            pending = _join_reasoning(pending, reasoning_text(item))
        elif isinstance(item, (FunctionCall, CustomToolCall)):
            name = item.name if item.namespace is None else f"{item.namespace}.{item.name}"
            names[item.call_id] = name
            if isinstance(item, FunctionCall):
                call = ToolCall(item.call_id, name, item.arguments)
            else:
                call = ToolCall(item.call_id, name, json.dumps({"input": item.input}, ensure_ascii=False))
            if last_is_turn:
                out[-1] = _extend_turn(out[-1], pending, (call,))
            else:
                out.append(ChatMessage("assistant", "", reasoning=pending, tool_calls=(call,)))
                last_is_turn = True
            pending = None
        elif isinstance(item, Compaction):
            out.append(ChatMessage("assistant", COMPACTION_PREFIX + item.summary, reasoning=pending))
            pending = None
            last_is_turn = True
        elif isinstance(item, (FunctionCallOutput, CustomToolCallOutput)):
            own = item.name if isinstance(item, FunctionCallOutput) else None
            out.append(ChatMessage("tool", item.text, tool_call_id=item.call_id, name=names.get(item.call_id, own)))
            last_is_turn = False
    if pending is not None and last_is_turn:
        out[-1] = _extend_turn(out[-1], pending)
    return tuple(out)


def _extend_turn(turn: ChatMessage, reasoning: str | None, calls: tuple[ToolCall, ...] = ()) -> ChatMessage:
    """The assistant `turn` with more reasoning text and calls."""
    return ChatMessage(
        "assistant", turn.content, reasoning=_join_reasoning(turn.reasoning, reasoning), tool_calls=turn.tool_calls + calls
    )


def _tools(
    tools: tuple[FunctionTool, ...], choice: ToolChoice
) -> tuple[tuple[FunctionTool, ...], ToolChoice]:
    """``allowed_tools`` cuts the tool list (a template cannot express the restriction)."""
    if choice.allowed is None:
        return tools, choice
    allowed = set(choice.allowed)
    return tuple(t for t in tools if t.name in allowed), ToolChoice(choice.mode)


def check_call_outputs(items: tuple[Item, ...], *, first: int = 0, param: str = "input") -> None:
    """Every ``function_call_output`` / ``custom_tool_call_output`` in ``items[first:]``
    answers a call made before it in `items`, else 400 at that item (``items[:first]``:
    the history behind ``previous_response_id``, already checked)."""
    calls: set[str] = set()
    for i, item in enumerate(items):
        if isinstance(item, (FunctionCall, CustomToolCall)):
            calls.add(item.call_id)
        elif isinstance(item, (FunctionCallOutput, CustomToolCallOutput)) and i >= first and item.call_id not in calls:
            kind = "function call" if isinstance(item, FunctionCallOutput) else "custom tool call"
            raise Refusal(
                f"No tool call found for {kind} output with call_id '{item.call_id}': an output must answer a "
                "call made earlier in the conversation.",
                param=f"{param}[{i - first}].call_id",
                code="invalid_value",
            )
