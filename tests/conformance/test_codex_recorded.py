"""Conformance: recorded Codex CLI 0.171 traffic (tests/protocol/data/codex_requests.jsonl,
from ../shared/conformance/codex) replayed against a live server over the scripted
model (SmolLM2's tokenizer and template; replies from tests/clients/script.yaml). Every
HTTP body and socket frame goes up as Codex sent it; every answer is checked against
the OpenAI SDK's own types and for what the script makes the model say: a user asking
to run `echo hello` gets an `exec_command` function call, a tool result gets the final
text. Socket continuations report cached tokens.

One change to what Codex sent, in the open: the previous_response_id of a continuation
names this server's response instead of the recording server's, and a tool output's
call_id the call this server made (Codex answers the call it was given; an output that
answers no call of the conversation is refused). Cases recorded without
the function-only model catalog carry a `namespace` tool (accepted: its functions are
offered as ``multi_agent_v1.NAME``) and a `web_search` tool, which ignis still refuses
(a hosted tool: ignis runs no tools itself; Codex's `web_search = "disabled"` leaves it
out). They are checked for that refusal (400 naming the web_search tool), then replayed
without it, namespace included.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx2 as httpx
import pytest

from tests.protocol.responses_sdk import check_grammar, validate_event
from tests.server.server_harness import KEY, Frames, client, http

DATA = Path(__file__).resolve().parent.parent / "protocol" / "data" / "codex_requests.jsonl"
RECORDED = [json.loads(line) for line in DATA.read_text().splitlines()]


HOSTED = {"web_search"}  # the recorded tool types ignis refuses


def _without_hosted(body):
    tools = body.get("tools")
    if tools and any(t.get("type") in HOSTED for t in tools):
        return dict(body, tools=[t for t in tools if t.get("type") not in HOSTED]), True
    return body, False


def _answering(items, latest):
    """`items` with each tool output's call_id that of the call in `latest`'s output it
    answers (in order), as Codex answers the calls it was given."""
    calls = iter([i["call_id"] for i in latest["output"] if i["type"] in ("function_call", "custom_tool_call")])
    out = []
    for item in items:
        if item.get("type") in ("function_call_output", "custom_tool_call_output"):
            item = dict(item, call_id=next(calls))
        out.append(item)
    return out


def _names_hosted_tool(body, param):
    i = int(param.split("[")[1].split("]")[0])
    return param == f"tools[{i}].type" and body["tools"][i]["type"] in HOSTED


def _http_bodies():
    seen, out = set(), []
    for e in RECORDED:
        if e["transport"] != "http":
            continue
        key = json.dumps(e["body"], sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append(e)
    return out


def _sse(srv, body):
    with httpx.stream("POST", srv.base_url + "/v1/responses", json=body, timeout=120,
                      headers={"Authorization": f"Bearer {KEY}", "openai-beta": "responses=experimental"}) as resp:
        assert resp.status_code == 200, resp.read()
        text = resp.read().decode()
    events = []
    for block in filter(None, text.split("\n\n")):
        name, data = block.split("\n")
        ev = json.loads(data.removeprefix("data: "))
        assert name == f"event: {ev['type']}"
        validate_event(ev)
        events.append(ev)
    return events


@pytest.mark.parametrize("entry", _http_bodies(), ids=lambda e: f"{e['case']}#{e['n']}")
def test_recorded_http_bodies(scripted_server, entry):
    srv = scripted_server
    body = entry["body"]
    trimmed, had_hosted = _without_hosted(body)
    if had_hosted:
        r = http(srv, "POST", "/v1/responses", json=body)
        assert r.status_code == 400
        err = r.json()["error"]
        assert _names_hosted_tool(body, err["param"]) and err["code"] == "unsupported_value"
    assert trimmed["stream"] is True and trimmed["store"] is False
    events = _sse(srv, trimmed)
    final = check_grammar(events)
    assert final["status"] in ("completed", "incomplete")
    assert final["usage"]["input_tokens"] > 1000  # Codex's instructions and tools are in the prompt
    check_scripted_answer(body, final)


def check_scripted_answer(body, final):
    """What script.yaml makes the model answer to the latest input item."""
    assert final["status"] == "completed"
    last = body["input"][-1]
    kinds = [o["type"] for o in final["output"]]
    fmt = (body.get("text") or {}).get("format") or {}
    if fmt.get("type") == "json_schema":  # codex exec --output-schema: the answer is JSON of the schema
        import jsonschema

        assert final["text"]["format"] == {"description": None, **fmt} and kinds == ["message"]  # every field echoed
        jsonschema.validate(json.loads(final["output"][0]["content"][0]["text"]), fmt["schema"])
    elif last["type"] == "function_call_output":
        assert kinds == ["message"]
        assert final["output"][0]["content"][0]["text"] == "The command printed hello."
    elif "echo hello" in last["content"][0]["text"]:
        assert kinds == ["reasoning", "function_call"]
        call = final["output"][1]
        assert call["name"] == "exec_command" and json.loads(call["arguments"]) == {"cmd": "echo hello"}
        # Codex asks for include: ["reasoning.encrypted_content"] to send reasoning back.
        assert final["output"][0]["encrypted_content"]
    else:
        assert kinds == ["message"] and final["output"][0]["content"][0]["text"] == "Hi!"


def _cases(transport="socket"):
    cases: dict[str, list] = {}
    for e in RECORDED:
        if e["transport"] == transport:
            cases.setdefault(e["case"], []).append(e)
    return cases


@pytest.mark.parametrize("case", sorted(_cases()))
def test_recorded_socket_frames(scripted_server, case):
    srv = scripted_server
    frames = _cases()[case]
    with client(srv).responses.connect() as conn:  # Authorization: Bearer, as Codex sends it
        f = Frames(conn)
        latest = None
        for e in frames:
            frame, had_hosted = _without_hosted(e["frame"])
            if had_hosted and e is frames[0]:
                conn._connection.send(json.dumps(e["frame"]))
                err = f.next()
                assert err["type"] == "error" and _names_hosted_tool(e["frame"], err["error"]["param"])
            continued = "previous_response_id" in frame
            if case == "ws_prev_not_found" and e["n"] == 1:
                # Recorded: the server did not hold that id; Codex then resent everything.
                conn._connection.send(json.dumps(frame))
                [err] = f.terminal()
                assert err["type"] == "error" and err["error"]["code"] == "previous_response_not_found"
                continue
            if continued:
                assert latest is not None
                frame = dict(frame, previous_response_id=latest["id"], input=_answering(frame["input"], latest))
            conn._connection.send(json.dumps(frame))
            events = f.terminal(timeout=120)
            assert events[-1]["type"] != "error", events[-1]
            final = check_grammar(events)
            assert final["status"] in ("completed", "incomplete")
            if frame.get("generate") is False:
                assert final["status"] == "completed" and final["output"] == []
            else:
                check_scripted_answer(frame, final)
            if continued:
                cached = final["usage"]["input_tokens_details"]["cached_tokens"]
                assert cached > 0, (case, e["n"])
                if latest["output"] or latest["usage"]["output_tokens"]:
                    # After a turn: that whole prompt is a prefix of this one. (After the
                    # prewarm, the tiny template folds Codex's second developer message
                    # into the first system block, ahead of its tool list: a shorter match.)
                    assert cached >= (latest["usage"]["input_tokens"] // 16 - 1) * 16, (case, e["n"])
            latest = final
