"""The Playground in Debian's chromium, headless, against a real server with the tiny
random model: a key refused then accepted, three agents streaming in parallel over
one socket (checked on /metrics), a continuation by previous_response_id, a server
error in the pane, stop, the previous_response_not_found fallback, an idle close and
the reconnect that resends the history, the hidden-tab close, six agents at once, a
socket closed under a running turn. With the scripted model: reasoning and tool cards (tests/clients/script.yaml, the scripted_server of tests/conftest.py).

A screenshot is saved as an artifact (the test's tmp dir, and $IGNIS_ARTIFACTS when
set); its path is printed."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from tests.server.server_harness import KEY, http, metric

pytest.importorskip("playwright")
from playwright.sync_api import Locator, Page, expect  # noqa: E402

FINISHED = re.compile(r"^(completed|incomplete)$")
SHORT = "16"  # max_output_tokens of an ordinary turn: the tiny model never stops early


class Frames:
    """Every socket frame the page sends and receives, in order (parsed JSON)."""

    def __init__(self, page: Page) -> None:
        self.sent: list[dict[str, Any]] = []
        self.received: list[dict[str, Any]] = []
        page.on("websocket", self._attach)

    def _attach(self, ws: Any) -> None:
        ws.on("framesent", lambda payload: self.sent.append(json.loads(payload)))
        ws.on("framereceived", lambda payload: self.received.append(json.loads(payload)))

    def creates(self, stream_id: str) -> list[dict[str, Any]]:
        return [f for f in self.sent if f["type"] == "response.create" and f.get("stream_id") == stream_id]


def pane(page: Page, n: int) -> Locator:
    return page.locator(f'.pane[data-stream-id="agent-{n}"]')


def send(p: Locator, text: str) -> None:
    p.locator("textarea").fill(text)
    p.locator(".send").click()


def last_turn(p: Locator) -> Locator:
    return p.locator(".turn").last


def answered(p: Locator) -> str:
    """Wait for the pane's last turn to finish with a streamed answer; return its text."""
    turn = last_turn(p)
    expect(turn).to_have_attribute("data-status", FINISHED)
    answer = turn.locator(".msg.assistant")
    assert int(answer.get_attribute("data-deltas")) >= 2, "the answer came in one piece, not streamed"
    text = answer.text_content()
    assert text.strip()
    return text


def streaming(page: Page, n: int, deltas: int = 5) -> None:
    """Wait until pane n's running turn has streamed `deltas` pieces of its answer."""
    page.wait_for_function(
        """([n, deltas]) => {
            const turns = document.querySelectorAll(`.pane[data-stream-id="agent-${n}"] .turn`);
            const msg = turns[turns.length - 1].querySelector('.msg.assistant');
            return msg !== null && Number(msg.dataset.deltas) >= deltas;
        }""", arg=[n, deltas])


def eventually(check: Any, timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while not check():
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


def setting(page: Page, name: str, value: str) -> None:
    page.fill(f"#set-{name}", value)


def save_screenshot(page: Page, tmp_path: Path, name: str = "playground.png") -> Path:
    path = tmp_path / name
    page.screenshot(path=str(path), full_page=True)
    if os.environ.get("IGNIS_ARTIFACTS"):
        dest = Path(os.environ["IGNIS_ARTIFACTS"])
        dest.mkdir(parents=True, exist_ok=True)
        path = Path(shutil.copy(path, dest / path.name))
    print(f"\nPlayground screenshot: {path}")
    return path


def test_playground_parallel_agents_stop_and_reconnect(start_server, browser_page: Page, tmp_path: Path) -> None:
    srv = start_server()  # requires server_harness.KEY
    page = browser_page
    frames = Frames(page)
    t0 = time.monotonic()
    try:
        _scenario(srv, page, frames)
    finally:
        save_screenshot(page, tmp_path)
    print(f"Playground scenario: {time.monotonic() - t0:.1f} s")


def _scenario(srv: Any, page: Page, frames: Frames) -> None:
    page.goto(srv.base_url + "/")
    # The server needs a key, and the side panel says so with the server's own words.
    expect(page.locator("#key-box")).to_have_class(re.compile("needed"))
    expect(page.locator("#key-status")).to_contain_text("401")

    # A wrong key: the upgrade is refused (a browser learns nothing why); the pane
    # shows the server's error, fetched over HTTP with the same key.
    page.fill("#set-key", "sk-wrong")
    page.click("#key-form button")
    send(pane(page, 1), "hello")
    expect(last_turn(pane(page, 1)).locator(".error")).to_contain_text("invalid_api_key")
    assert metric(srv, "ignis_responses_sockets_opened_total") == 0

    page.fill("#set-key", KEY)
    page.click("#key-form button")
    expect(page.locator("#set-model")).to_have_value("tiny")
    expect(page.locator("#key-box")).not_to_have_class(re.compile("needed"))
    setting(page, "temperature", "0")
    setting(page, "max_output_tokens", SHORT)

    # Three agents, started together: three streamed answers over one socket.
    page.click("#add-pane")
    page.click("#add-pane")
    for n in (1, 2, 3):
        pane(page, n).locator("textarea").fill(f"Agent {n}: what is {n} + {n}?")
    page.evaluate("() => document.querySelectorAll('.pane .send').forEach((b) => b.click())")
    first = {n: answered(pane(page, n)) for n in (1, 2, 3)}
    assert metric(srv, "ignis_responses_sockets_opened_total") == 1
    assert metric(srv, "ignis_responses_sockets") == 1
    # ... and they were in flight at the same time: every one was created before any ended.
    order = [(f["type"], f.get("stream_id")) for f in frames.received]
    created = [order.index(("response.created", f"agent-{n}")) for n in (1, 2, 3)]
    ended = [next(i for i, (kind, sid) in enumerate(order)
                  if sid == f"agent-{n}" and kind in ("response.completed", "response.incomplete")) for n in (1, 2, 3)]
    assert max(created) < min(ended), order
    expect(page.locator("#socket-state")).to_have_attribute("data-generation", "1")

    # A continuation on the same socket: previous_response_id and only the new item.
    send(pane(page, 3), "And times two?")
    answered(pane(page, 3))
    cont = frames.creates("agent-3")[-1]
    assert cont["previous_response_id"].startswith("resp_") and len(cont["input"]) == 1

    # A server error shows in the pane (a temperature the server refuses).
    setting(page, "temperature", "5")
    send(pane(page, 3), "Too hot?")
    expect(last_turn(pane(page, 3)).locator(".error")).to_contain_text("temperature")
    setting(page, "temperature", "0")

    # Stop a running turn: response.cancel, and the turn ends cancelled with what it had.
    setting(page, "max_output_tokens", "20000")
    send(pane(page, 2), "Tell me a very long story.")
    streaming(page, 2)
    expect(pane(page, 2).locator(".send")).to_have_text("Stop")
    pane(page, 2).locator(".send").click()
    expect(last_turn(pane(page, 2))).to_have_attribute("data-status", "cancelled")
    expect(pane(page, 2)).to_have_attribute("data-state", "idle")
    assert any(f["type"] == "response.cancel" and f.get("stream_id") == "agent-2" for f in frames.sent)
    # (Counted just after the terminal event is sent: poll.)
    assert eventually(lambda: metric(srv, "ignis_requests_total",
                                     'endpoint="responses",status="cancelled",transport="socket"') == 1)
    setting(page, "max_output_tokens", SHORT)

    # The server forgot the chain (here: an id it never had): the pane resends it all.
    page.evaluate("() => { const p = ignis.panes[0]; p.previous = {id: 'resp_gone', generation: p.previous.generation}; }")
    send(pane(page, 1), "Still there?")
    answered(pane(page, 1))
    expect(last_turn(pane(page, 1)).locator(".note")).to_contain_text("no longer knows the previous response")
    tried, resent = frames.creates("agent-1")[-2:]
    assert tried["previous_response_id"] == "resp_gone"
    assert "previous_response_id" not in resent
    history = resent["input"]  # the first question, its answer, the new question
    assert history[0]["content"] == "Agent 1: what is 1 + 1?" and history[-1]["content"] == "Still there?"
    assert [part["text"] for item in history if item.get("role") == "assistant" for part in item["content"]] == [first[1]]

    # Force an idle close; the next turn opens a new socket and resends the history.
    assert http(srv, "PATCH", "/admin/config", json={"socket_idle_close": 0.5}).status_code == 200
    expect(page.locator("#socket-state")).to_have_attribute("data-state", "closed")
    expect(page.locator("#socket-state")).to_contain_text("socket_idle_close")
    assert http(srv, "PATCH", "/admin/config", json={"socket_idle_close": 300}).status_code == 200
    send(pane(page, 2), "After the close?")
    answered(pane(page, 2))
    expect(last_turn(pane(page, 2)).locator(".note")).to_contain_text("new socket: resent the full history")
    expect(page.locator("#socket-state")).to_have_attribute("data-generation", "2")
    again = frames.creates("agent-2")[-1]
    assert "previous_response_id" not in again
    users = [item["content"] for item in again["input"] if item.get("role") == "user"]
    assert users == ["Agent 2: what is 2 + 2?", "Tell me a very long story.", "After the close?"]
    assert metric(srv, "ignis_responses_sockets_opened_total") == 2

    # A hidden tab closes a socket no turn uses (after a minute; shortened here).
    page.evaluate("""() => {
        ignis.connection.hiddenCloseMs = 200;
        Object.defineProperty(document, 'visibilityState', {configurable: true, get: () => 'hidden'});
        document.dispatchEvent(new Event('visibilitychange'));
    }""")
    expect(page.locator("#socket-state")).to_contain_text("tab hidden")
    page.evaluate("() => { delete document.visibilityState; document.dispatchEvent(new Event('visibilitychange')); }")

    # Six agents at once (three more, started together on a third socket).
    for _ in range(3):
        page.click("#add-pane")
    expect(page.locator(".pane")).to_have_count(6)
    for n in (4, 5, 6):
        pane(page, n).locator("textarea").fill(f"Agent {n}, say hello.")
    page.evaluate("""() => document.querySelectorAll('.pane').forEach((p, i) => {
        if (i >= 3) p.querySelector('.send').click();
    })""")
    for n in (4, 5, 6):
        answered(pane(page, n))
    assert metric(srv, "ignis_responses_sockets_opened_total") == 3

    # A socket that closes under a running turn ends it in the pane (and the server
    # aborts it in the engine).
    setting(page, "max_output_tokens", "20000")
    send(pane(page, 4), "Another long story, please.")
    streaming(page, 4)
    page.evaluate("() => ignis.connection.close('closed by the test')")
    expect(last_turn(pane(page, 4)).locator(".error")).to_contain_text("The socket closed during this turn")
    expect(pane(page, 4)).to_have_attribute("data-state", "idle")
    assert eventually(lambda: metric(srv, "ignis_engine_in_flight_requests") == 0)
    setting(page, "max_output_tokens", SHORT)


TOOLS = [{"type": "function", "name": "get_weather", "description": "The weather in a city.",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]


def test_playground_reasoning_and_tool_call_cards(scripted_server, browser_page: Page, tmp_path: Path) -> None:
    """Reasoning in a collapsible block, the call as a card, its result sent back from
    the card (a function_call_output chained by previous_response_id), then the answer."""
    page = browser_page
    frames = Frames(page)
    page.goto(scripted_server.base_url + "/")
    page.fill("#set-key", KEY)
    page.click("#key-form button")
    expect(page.locator("#set-model")).to_have_value("scripted")
    p = pane(page, 1)
    page.fill("#set-tools", "[{")  # unreadable tools: said in the pane, nothing sent
    send(p, "Anyone?")
    expect(last_turn(p).locator(".error")).to_contain_text("Tools: not JSON")
    expect(p).to_have_attribute("data-state", "idle")
    page.fill("#set-tools", json.dumps(TOOLS))
    send(p, "What is the weather in Paris?")
    turn = p.locator(".turn").nth(1)  # (locators are lazy: `last` would move on)
    expect(turn).to_have_attribute("data-status", "completed")
    reasoning = turn.locator("details.reasoning")
    expect(reasoning).to_have_count(1)
    assert reasoning.get_attribute("open") is None  # collapsed until asked
    expect(reasoning.locator("summary")).to_contain_text("Reasoning (")
    reasoning.locator("summary").click()
    expect(reasoning.locator(".reasoning-text")).to_have_text("The user asks for the weather; get_weather can tell.")
    card = turn.locator(".tool-card")
    expect(card.locator(".tool-name")).to_have_text("tool call · get_weather")
    assert json.loads(card.locator(".tool-args").text_content()) == {"city": "Paris"}
    assert frames.creates("agent-1")[-1]["tools"] == TOOLS

    card.locator(".tool-form input").fill("sunny, 21 C")
    card.locator(".tool-form button").click()
    reply = last_turn(p)
    expect(reply).to_have_attribute("data-status", "completed")
    expect(reply.locator(".msg.tool-result")).to_contain_text("sunny, 21 C")
    expect(reply.locator(".msg.assistant")).to_have_text("It is sunny in Paris.")
    expect(card.locator(".tool-form")).to_have_count(0)  # a result goes back once
    expect(card).to_contain_text("result sent")
    result = frames.creates("agent-1")[-1]
    assert result["previous_response_id"].startswith("resp_")
    assert [item["type"] for item in result["input"]] == ["function_call_output"]
    assert result["input"][0]["output"] == "sunny, 21 C"
    save_screenshot(page, tmp_path, "playground-tools.png")
