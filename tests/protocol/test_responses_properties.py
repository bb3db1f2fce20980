"""Property tests: whatever arrives, the decoders answer with a request or a Refusal
that points somewhere (never another exception)."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol.decode import decode_item, decode_json, decode_request
from protocol.errors import Refusal
from protocol.items import FunctionCall, FunctionCallOutput, InputText, Message, OutputText, Reasoning, ReasoningText, SummaryText
from protocol.request import ResponsesRequest
from protocol.socket_events import CancelEvent, CreateEvent, SocketError, decode_frame
from tests import fuzz

DATA = Path(__file__).parent / "data" / "codex_requests.jsonl"
SEEDS = []
for _line in DATA.read_text().splitlines():
    _e = json.loads(_line)
    if _e["case"] in ("http_reasoning", "ws_reasoning", "http_tool"):
        b = _e["body"] if _e["transport"] == "http" else {k: v for k, v in _e["frame"].items() if k not in ("type", "generate", "stream_id")}
        b = dict(b, tools=[t for t in b["tools"] if t["type"] == "function"][:2])  # keep examples small
        b["input"] = b["input"][-4:]
        SEEDS.append(b)
for _b in SEEDS:  # every seed decodes as is
    decode_request(_b, transport="socket")

json_scalars = fuzz.json_scalars(text=12, huge=True)
json_values = fuzz.json_values(max_leaves=12, text=12, keys=8, width=4, huge=True)

FIELD_NAMES = [
    "model", "input", "tools", "tool_choice", "text", "reasoning", "include", "temperature", "top_p",
    "max_output_tokens", "stop", "seed", "top_k", "thinking", "metadata", "stream", "truncation",
    "previous_response_id", "parallel_tool_calls", "stream_options", "background",
]


def decode_or_refusal(body, transport="http"):
    try:
        req = decode_request(body, transport=transport)
    except Refusal as r:
        fuzz.check_refusal(r)
        return r
    assert isinstance(req, ResponsesRequest)
    return req


FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(json_values)
def test_arbitrary_json_values(value):
    decode_or_refusal(value if isinstance(value, dict) else {"model": "m", "input": value})
    if isinstance(value, dict):
        return
    try:
        decode_json(json.dumps(value))
    except Refusal as r:
        assert r.code == "invalid_json"


@FAST
@given(st.dictionaries(st.sampled_from(FIELD_NAMES), json_values, max_size=6))
def test_arbitrary_known_fields(body):
    decode_or_refusal(body)


# Codex's recorded bodies, a few keys at a time dropped, replaced, retyped or added to.
mutated_bodies = fuzz.mutated_bodies(st.sampled_from(SEEDS), values=json_values, keys=st.text(min_size=1, max_size=8))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_bodies, st.sampled_from(["http", "socket"]))
def test_mutated_real_bodies(body, transport):
    decode_or_refusal(body, transport)


@FAST
@given(st.one_of(st.text(max_size=40), st.binary(max_size=40), mutated_bodies.map(lambda b: json.dumps(dict(b, type="response.create")))))
def test_frames_never_raise(data):
    ev = decode_frame(data)
    assert isinstance(ev, (CreateEvent, CancelEvent, SocketError))
    if isinstance(ev, SocketError):
        fuzz.check_refusal(ev.refusal)


# --- round trips ----------------------------------------------------------------------

texts = st.text(max_size=20)
opt_id = st.one_of(st.none(), st.text(min_size=1, max_size=10))
status = st.one_of(st.none(), st.sampled_from(["in_progress", "completed", "incomplete"]))
input_text = st.builds(InputText, texts)
output_text = st.builds(
    OutputText, texts,
    st.lists(st.dictionaries(st.text(max_size=5), json_scalars, max_size=3), max_size=2).map(tuple),
    st.one_of(st.none(), st.lists(st.dictionaries(st.text(max_size=5), json_scalars, max_size=3), max_size=2).map(tuple)),
)
items = st.one_of(
    st.builds(
        Message, st.sampled_from(["user", "system", "developer", "assistant"]),
        st.one_of(texts, st.lists(st.one_of(input_text, output_text), max_size=3).map(tuple)),
        opt_id, status, st.one_of(st.none(), st.sampled_from(["commentary", "final_answer"])),
    ),
    st.builds(FunctionCall, texts, texts, texts, opt_id, status),
    st.builds(FunctionCallOutput, texts, st.one_of(texts, st.lists(input_text, max_size=3).map(tuple)), opt_id, status, opt_id),
    st.builds(
        Reasoning, st.text(max_size=10),
        st.lists(st.builds(SummaryText, texts), max_size=2).map(tuple),
        st.one_of(st.none(), st.lists(st.builds(ReasoningText, texts), max_size=2).map(tuple)),
        st.one_of(st.none(), st.text(max_size=10).filter(lambda s: not s.startswith("ig1."))), status,
    ),
)


@settings(max_examples=200, deadline=None)
@given(items)
def test_item_round_trip(item):
    assert decode_item(json.loads(json.dumps(item.to_dict()))) == item
