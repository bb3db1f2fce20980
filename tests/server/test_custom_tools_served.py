"""Custom tools served (the scripted model, SmolLM2's tokenizer and template): a call's
input comes back as a custom_tool_call item held to the tool's grammar; a reply the
grammar refuses never comes back as a call; grammars a client cannot use are 400s at
their definition."""

from __future__ import annotations

from typing import Any

import pytest

from tests.protocol.responses_sdk import validate_response
from tests.server.grammars import APPLY_PATCH
from tests.server.server_harness import http

PATCH_TOOL = {"type": "custom", "name": "apply_patch", "description": "Edit files.",
              "format": {"type": "grammar", "syntax": "lark", "definition": APPLY_PATCH}}
EXEC = {"type": "function", "name": "exec_command", "parameters": {"type": "object"}}


def post(srv: Any, text: str, tools: list[dict[str, Any]], **extra: Any) -> Any:
    return http(srv, "POST", "/v1/responses", json={"model": "scripted", "input": text, "tools": tools, **extra})


def test_a_patch_comes_back_as_a_custom_tool_call(scripted_server: Any) -> None:
    r = post(scripted_server, "Add a note file, please.", [EXEC, PATCH_TOOL])
    assert r.status_code == 200, r.text
    resp = r.json()
    validate_response(resp)
    assert resp["status"] == "completed"
    [call] = [o for o in resp["output"] if o["type"] == "custom_tool_call"]
    assert call["name"] == "apply_patch"
    assert call["input"] == "*** Begin Patch\n*** Add File: notes.txt\n+written by ignis\n*** End Patch\n"
    assert resp["tools"][1] == PATCH_TOOL  # echoed as sent


def test_a_patch_the_grammar_refuses_never_passes_for_a_call(scripted_server: Any) -> None:
    # The script's patch has no hunk: from "*** Begin Patch\n" on, the grammar takes the
    # scripted model (one-hot logits) off its script, and the answer runs to its limit.
    r = post(scripted_server, "Add a broken note, please.", [PATCH_TOOL], max_output_tokens=40)
    assert r.status_code == 200, r.text
    resp = r.json()
    validate_response(resp)
    assert resp["status"] in ("incomplete", "failed"), resp["status"]
    assert not [o for o in resp["output"] if o["type"] == "custom_tool_call"]


@pytest.mark.parametrize(("definition", "words"), [
    ('start: "a" undefined_rule', "invalid grammar"),
    ('start: WS "a"\n%import common.WS\n%ignore WS', "unsupported grammar"),
])
def test_grammars_a_client_cannot_use_are_400s(scripted_server: Any, definition: str, words: str) -> None:
    tool = {"type": "custom", "name": "t", "format": {"type": "grammar", "syntax": "lark", "definition": definition}}
    r = post(scripted_server, "Say hi", [EXEC, tool])
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "tools[1].format.definition" and words in err["message"].lower(), err


@pytest.mark.parametrize(("definition", "status"), [
    ("start: /" + "(" * 240 + "a" + ")" * 240 + "/", 400),  # the rewrite nests past llguidance's limit
    ("start: /a{0,65535}/ /.{0,5000}/", 200),  # huge counted repetitions: rules, not 65k copies
])
def test_hostile_grammars_are_answered_not_choked_on(scripted_server: Any, definition: str, status: int) -> None:
    """A client's grammar is input: nesting too deep is a 400 saying so; huge repetition
    counts compile at once and the response comes back; the server serves on."""
    tool = {"type": "custom", "name": "t", "format": {"type": "grammar", "syntax": "lark", "definition": definition}}
    r = post(scripted_server, "Say hi", [tool], max_output_tokens=8)
    assert r.status_code == status, r.text
    if status == 400:
        assert "nested" in r.json()["error"]["message"]
    else:
        validate_response(r.json())
    assert post(scripted_server, "Say hi", [EXEC]).status_code == 200  # the server serves on
