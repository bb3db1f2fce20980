"""Object ids, prefixed as OpenAI prefixes them, with random hex from `secrets`.

``resp_`` responses, ``msg_`` messages, ``rs_`` reasoning items, ``fc_`` function-call
items, ``ctc_`` custom tool calls, ``call_`` function-call ids (what a tool result points back to); chat
completions are ``chatcmpl-``.
"""

from __future__ import annotations

import secrets

__all__ = ["new_id", "response_id", "message_id", "reasoning_id", "function_call_id", "custom_tool_call_id", "call_id", "completion_id"]

_HEX_BYTES = 24  # 48 hex digits, as long as OpenAI's


def new_id(prefix: str) -> str:
    """``prefix`` + ``_`` + 48 random hex digits."""
    return f"{prefix}_{secrets.token_hex(_HEX_BYTES)}"


def response_id() -> str:
    return new_id("resp")


def message_id() -> str:
    return new_id("msg")


def reasoning_id() -> str:
    return new_id("rs")


def function_call_id() -> str:
    return new_id("fc")


def custom_tool_call_id() -> str:
    return new_id("ctc")


def call_id() -> str:
    return new_id("call")


def completion_id() -> str:
    """``chatcmpl-`` + 48 random hex digits (chat completions use a dash)."""
    return f"chatcmpl-{secrets.token_hex(_HEX_BYTES)}"
