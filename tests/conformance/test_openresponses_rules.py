"""Conformance: the rules of Open Responses' compliance suite that apply to a text-only
server that stores no response, as our own tests, run as a user would run the suite:
against `make serve`'s server (the product command, the embedded SmolLM2 with its served
defaults) in a subprocess, every rule at once (the suite runs its tests concurrently too),
every response, event and socket frame checked against the vendored schema
(tests/openresponses.py) and the SDK's types.

The rules, by the suite's ids:

- HTTP: basic-response, streaming-response, system-prompt, multi-turn, assistant-phase
  (each: a response with output, status completed); tool-calling and its streaming form
  (the schema, and a call's events when the model makes one: whether a 135M model calls
  the tool is its choice); compact-response (a ``response.compaction`` with a
  ``compaction`` item) and compact-missing-model (400).
- WebSocket mode: websocket-response, websocket-sequential-responses,
  websocket-continuation, websocket-generate-false, websocket-reconnect-store-false-recovery,
  websocket-previous-response-not-found, websocket-failed-continuation-evicts-cache,
  websocket-compact-new-chain.
- Kept refused, with the errors they get: image-input (the models are text-only: 400 at
  the image part); previous_response_id over HTTP (ignis stores no response: 400
  ``previous_response_not_found``).
- Not applicable: response-output-phase-schema (the suite checks a fixture of its own,
  no request is sent).
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import pytest

from tests import openresponses
from tests.protocol.responses_sdk import check_grammar, validate_response
from tests.server.server_harness import TERMINAL, ServedProcess, client, http, validate_ws

MODEL = "smollm2-135m"
RULES: dict[str, Callable[[Any], None]] = {}
IMAGE = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
WEATHER = {"type": "function", "name": "get_weather", "description": "Get the current weather for a location",
           "parameters": {"type": "object", "properties": {"location": {"type": "string", "description":
                          "The city and state, e.g. San Francisco, CA"}}, "required": ["location"]}}


def rule(fn: Callable[[Any], None]) -> Callable[[Any], None]:
    RULES[fn.__name__.removeprefix("rule_").replace("_", "-")] = fn
    return fn


def msg(role: str, content: Any) -> dict[str, Any]:
    return {"type": "message", "role": role, "content": content}


# -- the transports, as the suite uses them -------------------------------------------


def create(server: Any, body: dict[str, Any]) -> dict[str, Any]:
    r = http(server, "POST", "/v1/responses", json={"model": MODEL, **body}, timeout=300)
    assert r.status_code == 200, r.text
    resp = r.json()
    validate_response(resp)
    return resp


def stream(server: Any, body: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    r = http(server, "POST", "/v1/responses", json={"model": MODEL, **body, "stream": True}, timeout=300)
    assert r.status_code == 200, r.text
    events = [json.loads(block.split("\n", 1)[1].removeprefix("data: ")) for block in r.text.split("\n\n") if block]
    final = check_grammar(events)  # every event: the SDK's types and the schema; OpenAI's order
    return events, final


def completed_with_output(resp: dict[str, Any]) -> None:
    assert resp["output"], resp
    assert resp["status"] == "completed", (resp["status"], resp.get("incomplete_details"), resp.get("error"))


class Socket:
    """One connection, turn by turn as the suite drives it: send a ``response.create``,
    read frames to its terminal event or error, each frame checked."""

    def __init__(self, server: Any) -> None:
        self.cm = client(server, timeout=300).responses.connect()

    def __enter__(self) -> Socket:
        self.conn = self.cm.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.cm.__exit__(*exc)

    def turn(self, frame: dict[str, Any], *, check_frame: bool = True) -> list[dict[str, Any]]:
        frame = {"type": "response.create", "model": MODEL, "store": False, **frame}
        if check_frame:
            openresponses.check_create_frame(frame)
        self.conn.send(frame)
        events: list[dict[str, Any]] = []
        deadline = time.monotonic() + 300
        while True:
            raw = self.conn._connection.recv(timeout=max(1.0, deadline - time.monotonic()))
            ev = json.loads(raw)
            validate_ws(ev)  # the SDK's socket event union and the schema (WebSocketErrorEvent for errors)
            events.append(ev)
            if ev["type"] == "error" or ev["type"] in TERMINAL:
                return events


def final(events: list[dict[str, Any]]) -> dict[str, Any]:
    assert events[-1]["type"] in TERMINAL, events[-1]
    check_grammar(events)
    return events[-1]["response"]


def error_code(events: list[dict[str, Any]]) -> str | None:
    last = events[-1]
    if last["type"] == "error":
        return last["error"]["code"]
    return (last["response"].get("error") or {}).get("code")


# -- HTTP rules -------------------------------------------------------------------------


@rule
def rule_basic_response(server: Any) -> None:
    completed_with_output(create(server, {"input": [msg("user", "Say hello in exactly 3 words.")]}))


@rule
def rule_streaming_response(server: Any) -> None:
    events, resp = stream(server, {"input": [msg("user", "Count from 1 to 5.")]})
    assert len(events) > 3
    completed_with_output(resp)


@rule
def rule_system_prompt(server: Any) -> None:
    completed_with_output(create(server, {"input": [msg("system", "You are a pirate. Always respond in pirate speak."),
                                                    msg("user", "Say hello.")]}))


@rule
def rule_multi_turn(server: Any) -> None:
    completed_with_output(create(server, {"input": [
        msg("user", "My name is Alice."),
        msg("assistant", "Hello Alice! Nice to meet you. How can I help you today?"),
        msg("user", "What is my name?")]}))


@rule
def rule_assistant_phase(server: Any) -> None:
    completed_with_output(create(server, {"input": [
        {**msg("assistant", "I should answer with the saved number."), "phase": "commentary"},
        {**msg("assistant", "The number is four."), "phase": "final_answer"},
        msg("user", "Repeat only the number.")]}))


@rule
def rule_tool_calling(server: Any) -> None:
    resp = create(server, {"input": [msg("user", "What's the weather like in San Francisco?")], "tools": [WEATHER]})
    assert resp["output"] and resp["status"] in ("completed", "incomplete")
    for item in resp["output"]:
        if item["type"] == "function_call":  # the model's choice; when it calls, the call is whole
            assert item["name"] == "get_weather" and isinstance(json.loads(item["arguments"]), dict)


@rule
def rule_tool_calling_streaming(server: Any) -> None:
    events, resp = stream(server, {"input": [msg("user", "What's the weather like in San Francisco?")],
                                   "tools": [WEATHER]})
    calls = [i for i in resp["output"] if i["type"] == "function_call"]
    types = [e["type"] for e in events]
    assert ("response.function_call_arguments.done" in types) == bool(calls)


@rule
def rule_image_input(server: Any) -> None:
    body = {"model": MODEL, "input": [msg("user", [{"type": "input_text", "text": "What do you see?"},
                                                   {"type": "input_image", "image_url": IMAGE}])]}
    r = http(server, "POST", "/v1/responses", json=body)
    err = r.json()["error"]
    assert (r.status_code, err["param"], err["code"]) == (400, "input[0].content[1].type", "unsupported_value"), err


@rule
def rule_http_previous_response_id(server: Any) -> None:
    r = http(server, "POST", "/v1/responses", json={"model": MODEL, "input": "Hi", "previous_response_id": "resp_x"})
    assert (r.status_code, r.json()["error"]["code"]) == (400, "previous_response_not_found")


@rule
def rule_compact_response(server: Any) -> None:
    body = {"model": MODEL, "prompt_cache_key": "openresponses-compact-test", "input": [
        msg("user", "We agreed to launch on Tuesday and notify support first."),
        msg("assistant", "Understood. The launch is Tuesday, with support notified beforehand.")]}
    r = http(server, "POST", "/v1/responses/compact", json=body, timeout=300)
    assert r.status_code == 200, r.text
    out = r.json()
    openresponses.check_compaction(out)
    assert out["object"] == "response.compaction" and out["output"][-1]["type"] == "compaction"


@rule
def rule_compact_missing_model(server: Any) -> None:
    r = http(server, "POST", "/v1/responses/compact", json={"input": [msg("user", "Compact this conversation.")]})
    assert r.status_code in (400, 422) and r.json()["error"]["param"] == "model"


# -- WebSocket-mode rules ---------------------------------------------------------------


@rule
def rule_websocket_response(server: Any) -> None:
    with Socket(server) as s:
        completed_with_output(final(s.turn({"input": [msg("user", "Count from 1 to 3.")]})))


@rule
def rule_websocket_sequential_responses(server: Any) -> None:
    with Socket(server) as s:
        for word in ("first", "second"):
            completed_with_output(final(s.turn({"input": f"Reply with exactly: {word}"})))


@rule
def rule_websocket_continuation(server: Any) -> None:
    with Socket(server) as s:
        first = final(s.turn({"input": "Remember the code word: cobalt. Reply with OK."}))
        assert first["id"]
        second = final(s.turn({"previous_response_id": first["id"],
                               "input": "What is the code word? Reply with only the code word."}))
        completed_with_output(second)


@rule
def rule_websocket_generate_false(server: Any) -> None:
    with Socket(server) as s:
        warm = final(s.turn({"generate": False, "input": "Prepare to answer with exactly: warmed"}))
        assert warm["id"] and warm["output"] == [] and warm["status"] == "completed"
        turn = final(s.turn({"previous_response_id": warm["id"], "input": "Reply with exactly: warmed"}))
        completed_with_output(turn)
        assert turn["usage"]["input_tokens_details"]["cached_tokens"] > 0  # the prewarm's prefix


@rule
def rule_websocket_reconnect_store_false_recovery(server: Any) -> None:
    with Socket(server) as s:
        first = final(s.turn({"input": "Remember the code word: copper. Reply with OK."}))
    with Socket(server) as s:
        miss = s.turn({"previous_response_id": first["id"],
                       "input": "Try to continue after reconnect. Reply with exactly: reconnected"})
        assert error_code(miss) == "previous_response_not_found"
        completed_with_output(final(s.turn({"input": [msg("user", "The previous store:false chain could not "
                                                                  "continue after reconnect. Start a new response "
                                                                  "and reply with exactly: recovered")]})))


@rule
def rule_websocket_previous_response_not_found(server: Any) -> None:
    with Socket(server) as s:
        events = s.turn({"previous_response_id": f"resp_openresponses_missing_{time.time_ns()}",
                         "input": "This should fail because the previous response is missing."})
        assert error_code(events) == "previous_response_not_found"


@rule
def rule_websocket_failed_continuation_evicts_cache(server: Any) -> None:
    with Socket(server) as s:
        first = final(s.turn({"input": "Remember the code word: ember. Reply with OK."}))
        failed = s.turn({"previous_response_id": first["id"], "input": [
            {"type": "function_call_output", "call_id": "call_openresponses_missing",
             "output": "No matching tool call exists in the previous response."}]})
        assert failed[-1]["type"] == "error" or failed[-1]["response"]["status"] == "failed", failed[-1]
        retry = s.turn({"previous_response_id": first["id"],
                        "input": "Try to continue after the failed turn. Reply with exactly: stale"})
        assert error_code(retry) == "previous_response_not_found"


@rule
def rule_websocket_compact_new_chain(server: Any) -> None:
    body = {"model": MODEL, "input": [
        msg("user", [{"type": "input_text", "text": "Remember the compaction code word: slate."}]),
        msg("assistant", [{"type": "output_text", "text": "OK."}]),
        msg("user", [{"type": "input_text", "text": "Compress this conversation for later continuation."}])]}
    r = http(server, "POST", "/v1/responses/compact", json=body, timeout=300)
    assert r.status_code == 200, r.text
    output = r.json()["output"]
    with Socket(server) as s:
        events = s.turn({"input": [*output, msg("user", "Continue from here. Reply with exactly: compacted")],
                         "tools": []}, check_frame=False)  # the suite passes the compacted window back as is
        completed_with_output(final(events))


# -- run them all at once -----------------------------------------------------------------


@pytest.fixture(scope="module")
def results() -> dict[str, BaseException | None]:
    """Every rule against one `make serve` server, concurrently; rule id -> its failure."""
    def run(item: tuple[str, Callable[[Any], None]]) -> tuple[str, BaseException | None]:
        try:
            item[1](server)
        except BaseException as exc:  # noqa: BLE001 - reported by the rule's own test
            return item[0], exc
        return item[0], None

    with ServedProcess("+model=smollm2-135m") as server:  # make serve: the embedded model, its served defaults
        with ThreadPoolExecutor(len(RULES)) as pool:
            out = dict(pool.map(run, RULES.items()))
    assert "ignis.access" in server.output and "Traceback" not in server.output, server.output[-3000:]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("rule_id", list(RULES))
def test_open_responses_rule(results, rule_id):
    failure = results[rule_id]
    if failure is not None:
        raise failure
