"""Per-token logprobs in `ignis.server.turn`: each token carries its own bytes
(`token_logprobs`, cached per tokenizer), and `drive` puts each token's logprob on the
answer text it ends up in, never on reasoning or on a tool call (`LogprobRouter` over
the parser's `text_spans`). Engine outputs are made as the engine makes them: one token
each, text from the engine's own `TextStream` (held back across a split character or a
possible stop string)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from pydantic import TypeAdapter

from ignis.engine import EngineFinish, RequestOutput
from ignis.engine.outputs import EngineUsage
from ignis.engine.stop import TextStream
from ignis.output_parser import OutputParser, ParserConfig
from ignis.server.logprobs import LogprobRouter, token_logprobs
from ignis.server.turn import drive
from protocol.chat_response import ChatStream
from protocol.deltas import ReasoningDelta, TextDelta, ToolCallStart
from protocol.events import TokenLogprob
from tests.protocol.responses_sdk import check_grammar, validate_response
from tests.server.server_harness import client, http, make_config


@pytest.fixture(scope="module")
def tok(tiny_server_model: Any) -> Any:
    return tiny_server_model.tokenizer


def _lp(k: int) -> float:
    return -(k + 1) / 1024  # exact in binary: identifies the k-th sampled token


class Recorder:
    """An encoder that keeps the deltas `drive` feeds it."""

    def __init__(self) -> None:
        self.deltas: list[Any] = []
        self.ending: tuple[str, ...] = ()

    def feed(self, d: Any) -> list[dict[str, Any]]:
        self.deltas.append(d)
        return []

    def finish(self, reason: str, usage: Any = None) -> list[dict[str, Any]]:
        self.ending = ("finish", reason)
        return []

    def fail(self, message: str, code: str | None = None, usage: Any = None) -> list[dict[str, Any]]:
        self.ending = ("fail", message)
        return []

    def cancel(self, usage: Any = None) -> list[dict[str, Any]]:
        self.ending = ("cancel",)
        return []


def engine_outputs(tok: Any, ids: list[int], *, stop: tuple[str, ...] = (), alt: int | None = None) -> list[RequestOutput]:
    """One RequestOutput per token as the engine sends them, then the final one with the
    stop token (EOS) unless a stop string ended it; logprob of token k: `_lp(k)`."""
    ts = TextStream(tok, stop)
    outs: list[RequestOutput] = []

    def one(k: int, i: int, text: str, **kw: Any) -> RequestOutput:
        top = [[(i, _lp(k))] + ([(alt, -9.0)] if alt is not None else [])]
        return RequestOutput("r", [i], text, logprobs=[_lp(k)], top_logprobs=top, **kw)

    usage = EngineUsage(prompt_tokens=3, cached_tokens=0, output_tokens=len(ids) + 1)
    for k, i in enumerate(ids):
        text = ts.add(i)
        if ts.stop_string is not None:
            outs.append(one(k, i, text, finished=True, finish_reason=EngineFinish.STOP, usage=usage))
            return outs
        outs.append(one(k, i, text))
    outs.append(one(len(ids), tok.eos_token_id, ts.flush(), finished=True, finish_reason=EngineFinish.STOP, usage=usage))
    return outs


async def _run(outs: list[RequestOutput], tok: Any, encoder: Any, config: ParserConfig) -> Any:
    async def stream():
        for o in outs:
            yield o

    async def emit(events: list[dict[str, Any]]) -> None:
        pass

    return await drive(stream(), OutputParser(config), encoder, emit, tokenizer=tok, started=0.0, logprobs=True)


def run_drive(tok: Any, outs: list[RequestOutput], config: ParserConfig = ParserConfig()) -> Recorder:
    rec = Recorder()
    asyncio.run(_run(outs, tok, rec, config))
    return rec


def encode_segments(tok: Any, segments: list[tuple[str, str]]) -> tuple[list[int], list[int]]:
    """The ids of the segments (each encoded alone, so token boundaries follow them) and
    the indices of the tokens of the "answer" segments."""
    ids: list[int] = []
    answer: list[int] = []
    for kind, text in segments:
        seg = tok.encode(text, special=True)
        if kind == "answer":
            answer += range(len(ids), len(ids) + len(seg))
        ids += seg
    return ids, answer


def attached(rec: Recorder) -> list[TokenLogprob]:
    return [t for d in rec.deltas if type(d) is TextDelta for t in d.logprobs or ()]


# -- bytes -------------------------------------------------------------------------


def testtoken_logprobs_carry_the_tokens_own_bytes(tok: Any) -> None:
    partial = next(i for i in range(tok.vocab_size) if _not_utf8(tok.token_bytes(i)))
    think = tok.added_tokens["<think>"]
    out = RequestOutput("r", [partial, think, 65], logprobs=[-0.5, -1.0, float("nan")],
                        top_logprobs=[[(partial, -0.5), (think, -2.0)], [], [(65, -3.0)]])
    a, b, c = token_logprobs(tok, out)
    raw = tok.token_bytes(partial)
    assert a.token == tok.decode([partial]) and "\ufffd" in a.token  # its text alone: a replacement
    assert a.token_bytes == raw and a.output_dict()["bytes"] == list(raw) != list(a.token.encode())
    assert [(x.token, x.token_bytes, x.logprob) for x in a.top_logprobs] == [(a.token, raw, -0.5), ("<think>", b"<think>", -2.0)]
    assert a.output_dict()["top_logprobs"][0]["bytes"] == list(raw)
    assert (b.token, b.token_bytes, b.top_logprobs) == ("<think>", b"<think>", ())  # an added token: its UTF-8
    assert c.token_bytes == tok.token_bytes(65) and c.output_dict()["logprob"] == -9999.0


def _not_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def test_pieces_are_decoded_once_per_id(tok: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each id's (text, bytes) is decoded once per tokenizer (Tokenizer.piece caches it)."""
    asked: list[int] = []
    piece = tok.piece
    monkeypatch.setattr(tok, "piece", lambda t: asked.append(t) or piece(t))
    out = RequestOutput("r", [70, 71], logprobs=[-0.1, -0.2], top_logprobs=[[(70, -0.1), (72, -3.0)], [(71, -0.2), (70, -1.0)]])
    first = token_logprobs(tok, out)
    assert token_logprobs(tok, out) == first and sorted(set(asked)) == [70, 71, 72]
    assert piece(72) is piece(72)  # the same cached tuple: decoded once


def test_no_byte_level_vocabulary_falls_back_to_the_text() -> None:
    class Plain:  # a vocabulary without token bytes (not byte-level BPE)
        def piece(self, token_id: int) -> tuple[str, bytes | None]:
            return "\u2581h\u00e9", None

    [t] = token_logprobs(Plain(), RequestOutput("r", [5], logprobs=[-0.25]))
    assert t.token_bytes is None and t.output_dict()["bytes"] == list("\u2581h\u00e9".encode())


# -- which tokens go with the answer ---------------------------------------------------


THINK_ANSWER_CALL = [
    ("think", "<think>\nPlan: \u00fcn\u00efcode \u2600 first.\n</think>\n\n"),
    ("answer", "Z\u00fcrich \u2600\ufe0f \U0001f600 ok,\n"),
    ("call", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Z\u00fcrich"}}\n</tool_call>'),
    ("answer", "\nDone \u2713 <"),
    ("call", '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'),
    ("dropped", "\n"),
]


def test_only_answer_tokens_get_logprobs(tok: Any) -> None:
    ids, answer = encode_segments(tok, THINK_ANSWER_CALL)
    rec = run_drive(tok, engine_outputs(tok, ids, alt=ids[0]))
    kinds = [type(d).__name__ for d in rec.deltas]
    assert kinds[0] == "ReasoningDelta" and "ToolCallStart" in kinds and rec.ending == ("finish", "tool_calls")
    text = "".join(d.text for d in rec.deltas if type(d) is TextDelta)
    assert text == "Z\u00fcrich \u2600\ufe0f \U0001f600 ok,\n\nDone \u2713 <"
    got = attached(rec)
    # exactly the answer's tokens, in order (the reasoning's, the calls', the dropped
    # whitespace's and the stop token's are not there)...
    assert [t.logprob for t in got] == [_lp(k) for k in answer]
    assert not any("think" in t.token or "tool_call" in t.token for t in got)
    # ...with their own bytes, which rebuild the text (split characters included)
    assert b"".join(t.token_bytes for t in got) == text.encode()
    assert any("\ufffd" in t.token for t in got)  # the vocabulary does split these characters
    assert all(len(t.top_logprobs) == 2 and t.top_logprobs[0].token_bytes == t.token_bytes for t in got)


def test_starting_in_reasoning_and_a_malformed_call(tok: Any) -> None:
    segments = [
        ("think", "The user \u00e9 wants a call.</think>\n"),
        ("answer", "Sure. "),
        ("answer", '<tool_call>{"name": "f", "arguments": [1]}</tool_call>'),  # malformed: text
        ("answer", " \u00e9nd"),
    ]
    ids, answer = encode_segments(tok, segments)
    rec = run_drive(tok, engine_outputs(tok, ids), ParserConfig(starts_in_reasoning=True))
    assert not any(type(d) is ToolCallStart for d in rec.deltas)
    assert "".join(d.text for d in rec.deltas if type(d) is ReasoningDelta) == "The user \u00e9 wants a call."
    assert [t.logprob for t in attached(rec)] == [_lp(k) for k in answer]


def test_plain_config_every_token_but_the_stop_token(tok: Any) -> None:
    text = "<think>not reasoning</think> <tool_call>{}</tool_call> \u00e9\u2600"
    ids = tok.encode(text, special=True)
    rec = run_drive(tok, engine_outputs(tok, ids), ParserConfig(reasoning=False, tools=False))
    assert "".join(d.text for d in rec.deltas) == text
    assert [t.logprob for t in attached(rec)] == [_lp(k) for k in range(len(ids))]


def test_a_stop_string_drops_the_tokens_after_the_cut(tok: Any) -> None:
    ids = tok.encode("ab \u00e9N cd <tool_call> ENDx more", special=True)
    rec = run_drive(tok, engine_outputs(tok, ids, stop=("END",)), ParserConfig(tools=False))
    text = "".join(d.text for d in rec.deltas if type(d) is TextDelta)
    assert text == "ab \u00e9N cd <tool_call> "
    # the tokens that hold some of the answer: those that start before the cut
    starts, pos = [], 0
    for i in ids:
        starts.append(pos)
        pos += len(tok.token_bytes(i))
    cut = len(text.encode())
    assert [t.logprob for t in attached(rec)] == [_lp(k) for k, s in enumerate(starts) if s < cut]


def test_logprobs_off_attach_nothing(tok: Any) -> None:
    ids, _ = encode_segments(tok, THINK_ANSWER_CALL)

    async def go() -> Recorder:
        rec = Recorder()

        async def stream():
            for o in engine_outputs(tok, ids):
                yield o

        async def emit(events: list[dict[str, Any]]) -> None:
            pass

        await drive(stream(), OutputParser(ParserConfig()), rec, emit, tokenizer=tok, started=0.0)
        return rec

    assert attached(asyncio.run(go())) == []


def test_chat_content_logprobs_are_the_answer_only(tok: Any) -> None:
    """The chat encoder end to end: ``logprobs.content`` starts with the answer, not with
    ``<think>`` (whose text went to ``reasoning_content``)."""
    ids, answer = encode_segments(tok, THINK_ANSWER_CALL)
    enc = ChatStream(model="tiny", logprobs=True, emit=False)
    asyncio.run(_run(engine_outputs(tok, ids), tok, enc, ParserConfig()))
    c = enc.completion()
    msg, content = c["choices"][0]["message"], c["choices"][0]["logprobs"]["content"]
    assert msg["reasoning_content"].startswith("Plan") and msg["content"].startswith("Z\u00fcrich")
    assert [t["logprob"] for t in content] == [_lp(k) for k in answer]
    assert bytes(b for t in content for b in t["bytes"]).decode() == msg["content"]


# -- the router alone: the approximations -------------------------------------------


def _t(text: str, raw: bytes | None = None) -> TokenLogprob:
    return TokenLogprob(text, -0.5, token_bytes=raw)


def _route(config: ParserConfig, steps: list[tuple[list[TokenLogprob], str]]) -> list[Any]:
    parser, router, out = OutputParser(config), LogprobRouter(), []
    for tokens, text in steps:
        router.add(tokens, text)
        deltas = parser.feed(text)
        if deltas:
            out += router.attach(deltas, parser.text_spans)
        router.settle(parser.settled)
    return out + router.attach(parser.finish(), parser.text_spans)


def test_router_split_character_after_dropped_whitespace() -> None:
    """' ' + half of U+2600 in one token (the engine sends ' ', holds the rest): the space
    is dropped after the think block, the token still goes with the character."""
    head, mid, tail = _t(" \ufffd", b" \xe2"), _t("\ufffd", b"\x98"), _t("\ufffd", b"\x80")
    out = _route(ParserConfig(), [([_t("<think>")], "<think>"), ([_t("r")], "r"), ([_t("</think>")], "</think>"),
                                  ([head], " "), ([mid], ""), ([tail], "\u2600"), ([_t("!")], "!")])
    assert out[0] == ReasoningDelta("r")
    texts = [d for d in out if type(d) is TextDelta]
    assert "".join(d.text for d in texts) == "\u2600!"
    assert [t for d in texts for t in d.logprobs or ()] == [head, mid, tail, _t("!")]


def test_router_shares_an_output_when_pieces_do_not_match() -> None:
    """Several tokens in one output, text alone differing from the text in context (a
    SentencePiece word's space): they share the output's text; one that matches gets its
    own stretch."""
    a, b, c = _t("Hello"), _t("world"), _t("!")
    out = _route(ParserConfig(), [([a], "Hello"), ([b, c], " world!")])
    assert [t for d in out if type(d) is TextDelta for t in d.logprobs or ()] == [a, b, c]
    # shared within reasoning: both dropped
    x, y = _t("<think>"), _t("hmm!")
    out = _route(ParserConfig(), [([x, y], "<think>hmm"), ([_t("</think>")], "</think>"), ([_t("ok")], "ok")])
    assert [t.token for d in out if type(d) is TextDelta for t in d.logprobs or ()] == ["ok"]


def test_router_text_held_back_across_outputs() -> None:
    """Tokens whose text comes in a later output (held back) wait for it; tokens that never
    get text (a stop token) are dropped."""
    e, n, x, eos = _t("E"), _t("N"), _t("x"), _t("<|im_end|>")
    out = _route(ParserConfig(), [([_t("a")], "a"), ([e], ""), ([n], ""), ([x], "ENx"), ([eos], "")])
    texts = [d for d in out if type(d) is TextDelta]
    assert "".join(d.text for d in texts) == "aENx"
    assert [t.token for d in texts for t in d.logprobs or ()] == ["a", "E", "N", "x"]


# -- a real server: the scripted model says a think block, text with split characters,
# and a tool call --------------------------------------------------------------------

ANSWER = "Z\u00fcrich \u2600\ufe0f \U0001f600 ok.\n"  # text before a call keeps its newline
SCRIPT = {
    "rules": [{"contains": "logprobs please", "reply": (
        "<think>Plan: \u00fcn\u00efcode \u2600.</think>\n\n" + ANSWER +
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Z\u00fcrich"}}\n</tool_call>')}],
    "default": "none",
}
TOOL = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}


@pytest.fixture(scope="module")
def scripted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from ignis.model import load_model
    from ignis.server.background import BackgroundServer

    path = tmp_path_factory.mktemp("logprobs") / "script.json"
    path.write_text(json.dumps(SCRIPT))
    model = load_model(kind="scripted", script=str(path), device="cpu", name="scripted")
    srv = BackgroundServer(make_config(engine={"num_kv_blocks": 512, "max_num_seqs": 4}), model).start()
    yield srv
    srv.stop()


def _rebuilt(entries: list[dict[str, Any]]) -> str:
    return bytes(b for e in entries for b in e["bytes"]).decode("utf-8")


def _check_entries(entries: list[dict[str, Any]], text: str) -> None:
    """Logprobs of the answer text only, whose bytes rebuild it exactly (each token's own
    bytes: a token holding part of a character reads U+FFFD as text)."""
    assert _rebuilt(entries) == text
    assert any("\ufffd" in e["token"] for e in entries)
    assert not any(tag in e["token"] for e in entries for tag in ("think", "tool_call", "Plan", "get_weather"))
    for e in entries:
        assert bytes(e["bytes"]).decode("utf-8", "replace") == e["token"]
        assert all(bytes(a["bytes"]).decode("utf-8", "replace") == a["token"] for a in e["top_logprobs"])


def test_responses_logprobs_are_the_answers_with_their_bytes(scripted: Any) -> None:
    body = {"model": "scripted", "input": "logprobs please", "tools": [TOOL], "top_logprobs": 2,
            "include": ["message.output_text.logprobs"]}
    r = http(scripted, "POST", "/v1/responses", json=body)
    assert r.status_code == 200, r.text
    resp = r.json()
    validate_response(resp)
    assert [item["type"] for item in resp["output"]] == ["reasoning", "message", "function_call"]
    [part] = resp["output"][1]["content"]
    assert part["text"] == ANSWER
    _check_entries(part["logprobs"], ANSWER)

    r = http(scripted, "POST", "/v1/responses", json={**body, "stream": True})
    events = [json.loads(b.split("\n")[1][6:]) for b in r.text.split("\n\n") if b]
    final = check_grammar(events)
    deltas = [lp for ev in events if ev["type"] == "response.output_text.delta" for lp in ev["logprobs"]]
    [part] = final["output"][1]["content"]
    _check_entries(part["logprobs"], ANSWER)
    assert [e["token"] for e in deltas] == [e["token"] for e in part["logprobs"]]


def test_chat_logprobs_are_the_answers_with_their_bytes(scripted: Any) -> None:
    kw = dict(model="scripted", messages=[{"role": "user", "content": "logprobs please"}], logprobs=True, top_logprobs=2,
              tools=[{"type": "function", "function": {k: v for k, v in TOOL.items() if k != "type"}}])
    c = client(scripted)
    r = c.chat.completions.create(**kw)
    TypeAdapter(ChatCompletion).validate_python(r.model_dump(mode="json"))
    msg = r.choices[0].message
    assert msg.content == ANSWER and msg.tool_calls and r.choices[0].finish_reason == "tool_calls"
    content = [t.model_dump(mode="json") for t in r.choices[0].logprobs.content]
    assert not content[0]["token"].startswith("<think>")  # that text is in reasoning_content
    _check_entries(content, ANSWER)
    chunks = list(c.chat.completions.create(**kw, stream=True))
    for ch in chunks:
        TypeAdapter(ChatCompletionChunk).validate_python(ch.model_dump(mode="json"))
    streamed = [t.model_dump(mode="json") for ch in chunks if ch.choices and ch.choices[0].logprobs
                for t in ch.choices[0].logprobs.content or ()]
    assert streamed == content
