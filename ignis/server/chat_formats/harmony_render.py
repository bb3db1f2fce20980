"""The internal conversation -> harmony messages, rendered to token ids by `openai_harmony`
itself (the exact renderer gpt-oss was trained with).

What goes where (harmony's format, docs/format.md of openai/harmony):

- The system message is harmony's own: model identity, knowledge cutoff, the current date,
  ``Reasoning: low|medium|high`` from ``reasoning.effort`` (none/minimal -> low, xhigh/max ->
  high; unset -> medium, harmony's default), the channels.
- The leading ``system`` / ``developer`` messages (``instructions``, Codex's first developer
  message) are the developer message's instructions, joined by a blank line; the tools are
  its declarations: function tools in the ``functions`` namespace, a Responses ``namespace``
  tool's functions in a namespace of that name (its description as harmony's comment). A
  custom (freeform) tool is a function with one string argument, ``input``, as Codex declares
  ``apply_patch`` for gpt-oss; its grammar goes in the tool's description, which harmony
  comments line by line (a parameter's description keeps only its first line commented).
- Later system / developer messages stay developer messages (plain text).
- An assistant turn: its reasoning as an ``analysis`` message, its text as ``final`` (or
  ``commentary`` when calls follow it in the same turn: a preamble), each call a
  ``commentary`` message to ``functions.NAME`` (a namespaced tool: ``NAMESPACE.NAME``) with
  content type ``<|constrain|>json``; a tool result a message from that same name to the
  assistant on ``commentary``.
- Earlier reasoning, by the rule harmony's docs give ("drop any previous CoT content on
  subsequent sampling if the responses by the assistant ended in a message to the final
  channel"; kept through tool calls): every analysis message before the last ``final`` one
  is dropped, those after it are kept. This is also what gpt-oss's own chat template and
  vLLM do; openai_harmony's ``auto_drop_analysis`` only drops before the *first* final
  message, and only when the conversation ends with one, so it is turned off here and the
  rule applied before rendering.

Client text is plain text to harmony's renderer: it never becomes special tokens.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from protocol.conversation import ChatMessage, FunctionTool, ToolCall

__all__ = ["EFFORTS", "build_conversation", "recipient", "render_ids"]

# reasoning.effort -> harmony's ReasoningEffort value (None: harmony's default, medium)
EFFORTS: Mapping[str, str] = {
    "none": "Low", "minimal": "Low", "low": "Low", "medium": "Medium", "high": "High", "xhigh": "High", "max": "High",
}
_CALL_CONTENT_TYPE = "<|constrain|>json"


def recipient(name: str, tools: Mapping[str, FunctionTool]) -> str:
    """The harmony recipient of a call to `name` (a tool's qualified name)."""
    tool = tools.get(name)
    if tool is not None and tool.namespace is not None:
        return name
    return f"functions.{name}"


def _tool_description(tool: FunctionTool) -> Any:
    from openai_harmony import ToolDescription

    description = tool.description or ""
    if tool.format is None:
        return ToolDescription.new(tool.wire_name, description, dict(tool.parameters) if tool.parameters else None)
    fmt = tool.format
    if fmt.syntax is not None:
        rule = f"The input must match this {fmt.syntax} grammar:\n{fmt.definition}"
        description = f"{description}\n\n{rule}" if description else rule
    schema = {"type": "object", "properties": {"input": {"type": "string", "description": "The tool's input."}},
              "required": ["input"], "additionalProperties": False}
    return ToolDescription.new(tool.wire_name, description, schema)


def _developer(instructions: str, tools: Sequence[FunctionTool], namespaces: Mapping[str, str]) -> Any | None:
    from openai_harmony import DeveloperContent, ToolNamespaceConfig

    if not instructions and not tools:
        return None
    dev = DeveloperContent.new()
    if instructions:
        dev = dev.with_instructions(instructions)
    functions = [_tool_description(t) for t in tools if t.namespace is None]
    if functions:
        dev = dev.with_function_tools(functions)
    grouped: dict[str, list[Any]] = {}
    for t in tools:
        if t.namespace is not None:
            grouped.setdefault(t.namespace, []).append(_tool_description(t))
    for name, described in grouped.items():
        dev = dev.with_tools(ToolNamespaceConfig(name=name, description=namespaces.get(name) or None, tools=described))
    return dev


def _call_message(call: ToolCall, tools: Mapping[str, FunctionTool]) -> Any:
    from openai_harmony import Message, Role

    return (Message.from_role_and_content(Role.ASSISTANT, call.arguments).with_channel("commentary")
            .with_recipient(recipient(call.name, tools)).with_content_type(_CALL_CONTENT_TYPE))


def _last_final(messages: Sequence[ChatMessage]) -> int:
    """Index of the last assistant turn that ended in a final message (text, no calls); -1: none."""
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if m.role == "assistant" and m.content and not m.tool_calls:
            return i
    return -1


def build_conversation(
    messages: Sequence[ChatMessage],
    tools: Sequence[FunctionTool],
    *,
    effort: str | None = None,
    namespaces: Mapping[str, str] | None = None,
    today: Callable[[], str] | None = None,
) -> Any:
    """The harmony `Conversation` of this conversation (see the module notes)."""
    from openai_harmony import Author, Conversation, Message, ReasoningEffort, Role, SystemContent

    system = SystemContent.new().with_conversation_start_date(
        today() if today is not None else datetime.date.today().isoformat())
    if effort is not None:
        system = system.with_reasoning_effort(ReasoningEffort(EFFORTS.get(effort, "Medium")))
    lead = 0
    while lead < len(messages) and messages[lead].role in ("system", "developer"):
        lead += 1
    instructions = "\n\n".join(m.content for m in messages[:lead] if m.content)
    out = [Message.from_role_and_content(Role.SYSTEM, system)]
    dev = _developer(instructions, tools, namespaces or {})
    if dev is not None:
        out.append(Message.from_role_and_content(Role.DEVELOPER, dev))
    by_name = {t.name: t for t in tools}
    rest = messages[lead:]
    last_final = _last_final(rest)
    for i, m in enumerate(rest):
        if m.role == "user":
            out.append(Message.from_role_and_content(Role.USER, m.content))
        elif m.role in ("system", "developer"):
            out.append(Message.from_role_and_content(Role.DEVELOPER, m.content))
        elif m.role == "tool":
            author = Author.new(Role.TOOL, recipient(m.name, by_name) if m.name else "functions")
            out.append(Message.from_author_and_content(author, m.content).with_channel("commentary")
                       .with_recipient("assistant"))
        else:  # assistant
            if m.reasoning and i > last_final:
                out.append(Message.from_role_and_content(Role.ASSISTANT, m.reasoning).with_channel("analysis"))
            if m.content:
                channel = "commentary" if m.tool_calls else "final"
                out.append(Message.from_role_and_content(Role.ASSISTANT, m.content).with_channel(channel))
            out.extend(_call_message(c, by_name) for c in m.tool_calls)
    return Conversation.from_messages(out)


def render_ids(encoding: Any, conversation: Any, *, generation: bool = True) -> list[int]:
    """The conversation's token ids; with `generation`, ending with ``<|start|>assistant``."""
    from openai_harmony import RenderConversationConfig, Role

    config = RenderConversationConfig(auto_drop_analysis=False)  # the rule is applied above
    if generation:
        return list(encoding.render_conversation_for_completion(conversation, Role.ASSISTANT, config))
    return list(encoding.render_conversation(conversation, config))
