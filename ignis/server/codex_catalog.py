"""Codex's model metadata, served beside OpenAI's model list on GET /v1/models.

Codex CLI (0.171) reads what it knows of a model (context window, input modalities,
the kind of ``apply_patch`` tool to send, reasoning levels, base instructions) from a
catalog. For a custom provider it uses a catalog file (``model_catalog_json``) or,
when the provider sets ``model_catalog_url``, ``GET <url>?client_version=...`` with the
provider's key, expecting ``{"models": [...]}``; it never asks the provider's
``/v1/models`` on its own. So the list carries both shapes: OpenAI's ``data`` (what the
SDKs read) and Codex's ``models`` (what Codex reads; it ignores ``data``), and a Codex
config needs only ``model_catalog_url = "<base_url>/models"``.

Each entry describes the served model as it is here: its context (``engine
max_model_len``), text input only, the freeform ``apply_patch`` (a custom tool whose Lark
grammar the server enforces), parallel calls, reasoning levels only when the chat template
has a thinking mode, and short base instructions of ours (a user's
``model_instructions_file`` replaces them). Codex refuses the whole catalog when a field
it requires is missing: the ones below are those it required in 0.171.
"""

from __future__ import annotations

from typing import Any

__all__ = ["catalog_entry", "INSTRUCTIONS"]

INSTRUCTIONS = (
    "You are Codex, a coding agent working in the user's terminal and workspace. Answer briefly. "
    "To look at or change files, run shell commands with the exec_command tool and edit files with "
    "apply_patch. When the task is done, say in one or two sentences what you did."
)
_LEVELS = [
    {"effort": "low", "description": "A short think before answering"},
    {"effort": "medium", "description": "A longer think before answering"},
    {"effort": "high", "description": "The longest think before answering"},
]


def catalog_entry(name: str, *, context_window: int, reasoning: bool, priority: int = 1) -> dict[str, Any]:
    """The Codex catalog entry of a served model name."""
    return {
        "slug": name,
        "display_name": name,
        "description": f"{name}, served by ignis",
        "context_window": context_window,
        "max_context_window": context_window,
        "input_modalities": ["text"],
        "apply_patch_tool_type": "freeform",
        "supports_parallel_tool_calls": True,
        "support_verbosity": False,
        "prefer_websockets": True,
        # Tool output kept in the prompt: a quarter of the context at most.
        "truncation_policy": {"mode": "tokens", "limit": max(256, min(10000, context_window // 4))},
        "supported_reasoning_levels": _LEVELS if reasoning else [],
        "default_reasoning_level": "medium" if reasoning else None,
        "shell_type": "shell_command",
        "visibility": "list",
        "supported_in_api": True,
        "priority": priority,
        "experimental_supported_tools": [],
        "model_messages": {"instructions_template": INSTRUCTIONS},
    }
