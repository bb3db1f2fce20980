"""ignis.output_parser: streamed model text -> semantic deltas.

Fixed cases for each documented rule, then properties: chunking never changes the
(coalesced) result; the streaming parser agrees with a plain whole-string reference
written independently here; structured compositions come out exactly as composed;
arbitrary text never raises and is accounted for."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ignis.output_parser import OutputParser, ParserConfig, coalesce, parse_tool_call
from protocol.deltas import ReasoningDelta, TextDelta, ToolCallArguments, ToolCallEnd, ToolCallStart

R, T, A = ReasoningDelta, TextDelta, ToolCallArguments
END = ToolCallEnd()

QWEN = ParserConfig()
THINKING = ParserConfig(starts_in_reasoning=True)
NO_TOOLS = ParserConfig(tools=False)
NO_REASONING = ParserConfig(reasoning=False)
PLAIN = ParserConfig(reasoning=False, tools=False)
CONFIGS = [QWEN, THINKING, NO_TOOLS, NO_REASONING, PLAIN]

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def run(text_or_chunks, config=QWEN):
    """Coalesced deltas of feeding `text_or_chunks` (a str = one chunk), then finish."""
    chunks = [text_or_chunks] if isinstance(text_or_chunks, str) else text_or_chunks
    p = OutputParser(config)
    out = []
    for c in chunks:
        out += p.feed(c)
    out += p.finish()
    return coalesce(out)


def call(name, args_text):
    return [ToolCallStart(name), A(args_text), END]


def chunked(s, cuts):
    cuts = sorted(set(c for c in cuts if 0 < c < len(s)))
    return [s[i:j] for i, j in zip([0] + cuts, cuts + [len(s)])]


# -- fixed cases -------------------------------------------------------------------


def test_plain_text():
    assert run("Hello, world!") == [T("Hello, world!")]
    assert run("") == []
    assert run("  spaced  \n") == [T("  spaced  \n")]  # no think block: nothing stripped


def test_think_then_answer():
    s = "<think>\nLet me think.\nYes.\n</think>\n\nThe answer is 4."
    assert run(s) == [R("Let me think.\nYes."), T("The answer is 4.")]
    # whitespace before the opening tag is allowed (and dropped)
    assert run("\n <think>x</think>y") == [R("x"), T("y")]
    # an empty block says nothing
    assert run("<think>\n\n</think>\n\nHi") == [T("Hi")]
    # all whitespace right after </think> goes, later whitespace stays
    assert run("<think>r</think> \n\t Hi \n there\n") == [R("r"), T("Hi \n there\n")]


def test_think_streams_promptly():
    p = OutputParser(QWEN)
    assert p.feed("<th") == []
    assert p.feed("ink>\n") == []
    assert p.feed("step one") == [R("step one")]
    assert p.feed("\n") == []  # trailing whitespace: held until more reasoning comes
    assert p.feed("step two</th") == [R("\nstep two")]
    assert p.feed("ink>\n\n") == []
    assert p.feed("Done") == [T("Done")]
    assert p.finish() == []
    assert not p.saw_tool_call


def test_starts_in_reasoning():
    assert run("\nI should add.\n</think>\n\n2", THINKING) == [R("I should add."), T("2")]
    # the opening tag is not expected again: it is reasoning text
    assert run("<think>x</think>y", THINKING) == [R("<think>x"), T("y")]
    assert run("never closed\n", THINKING) == [R("never closed")]


def test_think_only_at_start():
    # after answer text, think tags are plain text
    assert run("Hi <think>no</think> there") == [T("Hi <think>no</think> there")]
    # a second block after the first is answer text
    assert run("<think>a</think>b<think>c</think>") == [R("a"), T("b<think>c</think>")]
    # a stray closing tag outside reasoning is text
    assert run("x</think>y") == [T("x</think>y")]
    # after a tool call too
    s = '<tool_call>{"name": "f", "arguments": {}}</tool_call><think>t</think>'
    assert run(s) == call("f", "{}") + [T("<think>t</think>")]
    assert run("hi " + s) == [T("hi ")] + call("f", "{}") + [T("<think>t</think>")]


def test_unterminated_think_flushes_as_reasoning():
    assert run("<think>\nstill going  \n") == [R("still going")]
    assert run("<think>partial </thi") == [R("partial </thi")]
    assert run("<think>") == []


def test_one_tool_call():
    s = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n</tool_call>'
    p = OutputParser(QWEN)
    out = coalesce(p.feed(s) + p.finish())
    assert out == call("get_weather", '{"city": "Paris", "unit": "c"}')
    assert p.saw_tool_call


def test_several_tool_calls_with_text_around():
    s = (
        "<think>\nNeed two lookups.\n</think>\n\n"
        "Let me check both.\n\n"
        '<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n'
        '<tool_call>\n{"name": "b", "arguments": {"y": [1, 2]}}\n</tool_call>\n'
        " \n"
        '<tool_call>{"name": "c", "arguments": {}}</tool_call>'
        "\nThat's all."
    )
    assert run(s) == (
        [R("Need two lookups."), T("Let me check both.\n\n")]
        + call("a", '{"x": 1}')
        + call("b", '{"y": [1, 2]}')  # whitespace between calls dropped
        + call("c", "{}")
        + [T("\nThat's all.")]  # not whitespace-only: kept whole
    )


def test_whitespace_around_calls():
    c = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    assert run("\n\n" + c + "\n\n") == call("f", "{}")  # before the first, after the last
    assert run("\n" + c, NO_REASONING) == call("f", "{}")
    assert run("hi\n" + c + "\n") == [T("hi\n")] + call("f", "{}")
    # whitespace before a malformed block is kept with it (that block is text)
    assert run(c + "\n<tool_call>oops</tool_call>") == call("f", "{}") + [T("\n<tool_call>oops</tool_call>")]
    # whitespace-only output without calls is text
    assert run("  \n") == [T("  \n")]


def test_argument_text_forms():
    # the model's own text of the object: spacing, key order, escapes preserved
    raw = '{ "b" : 2,\n "a": "\\u00e9\\n", "n": 1.50 }'
    assert parse_tool_call('{"name": "f", "arguments": %s}' % raw) == ("f", raw)
    # a JSON string holding an object: its content, stripped
    assert parse_tool_call(json.dumps({"name": "f", "arguments": ' {"q": "x"} '})) == ("f", '{"q": "x"}')
    # missing or null arguments: {}; "parameters" accepted as the key
    assert parse_tool_call('{"name": "now"}') == ("now", "{}")
    assert parse_tool_call('{"name": "now", "arguments": null}') == ("now", "{}")
    assert parse_tool_call('{"name": "f", "parameters": {"a": 1}}') == ("f", '{"a": 1}')
    assert parse_tool_call('{"arguments": {}, "name": "f", "id": 3}') == ("f", "{}")
    assert parse_tool_call('{"name": "f", "parameters": {"p": 1}, "arguments": {"a": 1}}') == ("f", '{"a": 1}')
    # duplicate keys: the last wins, as json.loads
    assert parse_tool_call('{"name": "f", "arguments": {"a": 1}, "arguments": {"b": 2}}') == ("f", '{"b": 2}')
    # non-ASCII names and arguments come out as they were written
    assert parse_tool_call('{"name": "météo", "arguments": {"ville": "Zürich"}}') == ("météo", '{"ville": "Zürich"}')


@pytest.mark.parametrize(
    "body",
    [
        "",
        "not json",
        '{"name": "f", "arguments": {"a": 1}',  # truncated
        '{"name": "f", "arguments": {"a": 1}} trailing',
        '{"name": "f", "arguments": {}}{"name": "g", "arguments": {}}',
        '{"arguments": {"a": 1}}',  # no name
        '{"name": "", "arguments": {}}',
        '{"name": 3, "arguments": {}}',
        '{"name": "f", "arguments": [1, 2]}',
        '{"name": "f", "arguments": "not an object"}',
        '{"name": "f", "arguments": "[1]"}',
        '{"name": "f", "arguments": 7}',
        '{"name": "f", "arguments": {"x": NaN}}',
        '{"name": "f", "arguments": {"x": Infinity}}',
        '["name", "f"]',
        '{"name": "f", "arguments": {"a": 1},}',
        "{'name': 'f', 'arguments': {}}",
        '{"name": "f\x01", "arguments": {}}',  # control character in a string
        "[" * 100_000,  # deep nesting (RecursionError inside json)
        '{"name": "f", "arguments": {"n": ' + "9" * 10_000 + "}}",
    ],
)
def test_malformed_tool_call_is_text(body):
    assert parse_tool_call(body) is None
    s = "Before <tool_call>" + body + "</tool_call> after"
    assert run(s) == [T(s)]
    p = OutputParser(QWEN)
    p.feed(s)
    p.finish()
    assert not p.saw_tool_call


def test_unterminated_tool_call_is_text():
    s = 'ok <tool_call>{"name": "f", "arguments": {"a": 1}}'
    assert run(s) == [T(s)]
    assert run("\n<tool_call>{") == [T("\n<tool_call>{")]  # held whitespace comes back too
    c = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    assert run(c + "\n\n<tool_call>{") == call("f", "{}") + [T("\n\n<tool_call>{")]
    assert run(c + "\n\n</tool_") == call("f", "{}") + [T("\n\n</tool_")]


def test_tool_tags_inside_reasoning_are_reasoning():
    s = '<think>maybe <tool_call>{"name": "f", "arguments": {}}</tool_call></think>no'
    assert run(s) == [R('maybe <tool_call>{"name": "f", "arguments": {}}</tool_call>'), T("no")]


def test_tags_disabled():
    c = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    assert run("<think>r</think>" + c, NO_TOOLS) == [R("r"), T(c)]
    assert run("<think>r</think>\n" + c, NO_REASONING) == [T("<think>r</think>\n")] + call("f", "{}")
    s = "\n<think>r</think>\n" + c + "\n"
    assert run(s, PLAIN) == [T(s)]
    # reasoning=False overrides starts_in_reasoning
    assert run("x</think>y", ParserConfig(reasoning=False, starts_in_reasoning=True)) == [T("x</think>y")]


def test_custom_tags():
    cfg = ParserConfig(think_start="<reasoning>", think_end="</reasoning>", tool_start="[CALL]", tool_end="[/CALL]")
    s = '<reasoning>hmm</reasoning>\nok [CALL]{"name": "f", "arguments": {"a": 1}}[/CALL]'
    assert run(s, cfg) == [R("hmm"), T("ok ")] + call("f", '{"a": 1}')
    with pytest.raises(ValueError):
        ParserConfig(tool_start="")
    with pytest.raises(ValueError):
        ParserConfig(think_end=" </think>")


def test_angle_brackets_in_text_come_out_promptly():
    p = OutputParser(QWEN)
    assert p.feed("a <") == [T("a ")]  # only "<" held
    assert p.feed(" b") == [T("< b")]
    assert p.feed(" x <th") == [T(" x <th")]  # mid-answer: <think> is no tag, nothing held
    assert p.feed(" y <tool") == [T(" y ")]
    assert p.feed("s>") == [T("<tools>")]
    assert p.feed("1 << 2 <") == [T("1 << 2 ")]
    assert p.finish() == [T("<")]
    # at the very start "<th" may still open the think block: held, then released
    p = OutputParser(QWEN)
    assert p.feed("<th") == []
    assert p.feed("e cat") == [T("<the cat")]
    # with tags disabled nothing is ever held
    p = OutputParser(PLAIN)
    assert p.feed("<") == [T("<")]
    assert p.feed("<think") == [T("<think")]


def test_held_back_is_shortest_necessary():
    p = OutputParser(NO_REASONING)
    assert p.feed("x<tool_cal") == [T("x")]
    assert p.feed("x") == [T("<tool_calx")]
    assert p.feed("<<tool_") == [T("<")]
    p = OutputParser(QWEN)
    p.feed("<think>")
    assert p.feed("a</") == [R("a")]
    assert p.feed("b") == [R("</b")]


def test_after_finish_nothing():
    p = OutputParser(QWEN)
    assert p.feed("hi") == [T("hi")]
    assert p.finish() == []
    assert p.finish() == []
    assert p.feed("more") == []


def test_feed_coalesces_and_never_emits_empty():
    p = OutputParser(QWEN)
    out = p.feed('<think>a</think>b<tool_call>{"name": "f", "arguments": {"k": "v"}}</tool_call>\nc')
    assert out == [R("a"), T("b")] + call("f", '{"k": "v"}') + [T("\nc")]
    assert p.saw_tool_call


def test_coalesce():
    from protocol.events import TokenLogprob

    lp1, lp2 = (TokenLogprob("a", -0.1),), (TokenLogprob("b", -0.2),)
    assert coalesce([T("a", lp1), T("b", lp2), T("")]) == [T("ab", lp1 + lp2)]
    assert coalesce([T("a"), T("b")]) == [T("ab")]
    assert coalesce([R("a"), R(""), R("b"), T("c"), A(""), A("{"), A("}"), END, R("x")]) == [R("ab"), T("c"), A("{}"), END, R("x")]
    assert coalesce([ToolCallStart("f"), END, ToolCallStart("g"), END]) == [ToolCallStart("f"), END, ToolCallStart("g"), END]


def test_long_block_fed_in_small_chunks_is_linear():
    import time

    s = '<tool_call>{"name": "w", "arguments": {"s": %s}}</tool_call>' % json.dumps("x" * 200_000)
    t = time.thread_time()  # CPU time: what a loaded machine's waits do not stretch
    out = run([s[i : i + 3] for i in range(0, len(s), 3)])
    assert time.thread_time() - t < 2.0
    assert out == call("w", '{"s": %s}' % json.dumps("x" * 200_000))


# -- a whole-string reference, written independently ---------------------------------


def _reject(name):
    raise ValueError(name)


def ref_call(body):
    """The documented validity rule, via json.loads (no exact-text extraction)."""
    try:
        obj = json.loads(body, parse_constant=_reject)
    except Exception:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj["arguments"] if "arguments" in obj else obj.get("parameters")
    if args is None or isinstance(args, dict):
        return obj["name"], args or {}
    if isinstance(args, str):
        try:
            inner = json.loads(args, parse_constant=_reject)
        except Exception:
            return None
        if isinstance(inner, dict):
            return obj["name"], inner
    return None


def reference(s, cfg):
    """Expected coalesced deltas for the whole output `s`, arguments as parsed values."""
    out = []
    if cfg.reasoning and (cfg.starts_in_reasoning or s.lstrip().startswith(cfg.think_start)):
        if not cfg.starts_in_reasoning:
            s = s.lstrip()[len(cfg.think_start) :]
        j = s.find(cfg.think_end)
        if j < 0:
            return coalesce([R(s.strip())])
        out.append(R(s[:j].strip()))
        s = s[j + len(cfg.think_end) :].lstrip()
    segs, pos = [], 0  # ("text", str) | ("call", name, args)
    while True:
        j = s.find(cfg.tool_start, pos) if cfg.tools else -1
        k = s.find(cfg.tool_end, j + len(cfg.tool_start)) if j >= 0 else -1
        if k < 0:
            segs.append(("text", s[pos:]))
            break
        c = ref_call(s[j + len(cfg.tool_start) : k])
        end = k + len(cfg.tool_end)
        if c is None:
            segs.append(("text", s[pos:end]))
        else:
            segs += [("text", s[pos:j]), ("call", *c)]
        pos = end
    merged = []  # adjacent text segments joined
    for seg in segs:
        if merged and seg[0] == "text" and merged[-1][0] == "text":
            merged[-1] = ("text", merged[-1][1] + seg[1])
        else:
            merged.append(seg)
    for i, seg in enumerate(merged):
        if seg[0] == "call":
            out += [ToolCallStart(seg[1]), A(json.dumps(seg[2])), END]
            continue
        prev_call = i > 0 and merged[i - 1][0] == "call"
        next_call = i + 1 < len(merged) and merged[i + 1][0] == "call"
        last = i + 1 == len(merged)
        if seg[1].isspace() and ((i == 0 or prev_call) and next_call or prev_call and last):
            continue
        out.append(T(seg[1]))
    return coalesce(out)


def parsed_args(deltas):
    """Arguments chunks replaced by their parsed value."""
    return [A(json.loads(d.chunk)) if type(d) is A else d for d in deltas]


# -- strategies ----------------------------------------------------------------------

PIECES = [
    "<think>", "</think>", "<tool_call>", "</tool_call>", "<", "</", "<th", "<thi", "</thin",
    "<tool", "<tool_c", "</tool_ca", ">", "\n", "\n\n", " ", "\t", "a", "xyz", "é", "{", "}",
    '"', ":", ",",
    '{"name": "f", "arguments": {"a": 1}}',
    '{"name": "g", "arguments": "{\\"b\\": [1]}"}',
    '{"name": "h"}',
    '{"name": "bad", "arguments": [1]}',
    '{"name": "f", "arguments": {"a": "</think>"}}',
]

BLOCKS = [  # whole blocks, so that valid calls (and near misses) are common
    '<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>',
    '<tool_call>\n{"name": "g", "parameters": {"b": "<tool_call>"}}\n</tool_call>\n',
    '<tool_call>{"name": "h", "arguments": "{}"}</tool_call>',
    '<tool_call>{"name": "bad", "arguments": 1}</tool_call>',
    "<think>\nhm\n</think>\n\n",
]
noisy_text = st.tuples(
    st.sampled_from(["", "", " <think>", "<think>\n", "\n"]),
    st.lists(st.sampled_from(PIECES + BLOCKS * 3) | st.text(max_size=4), max_size=30),
).map(lambda t: t[0] + "".join(t[1]))
config = st.sampled_from(CONFIGS)

# text that can never form a tool tag ("_" is missing) but loves "<", ">" and whitespace
SAFE = "ab <>/\n\t é{}thinkolc"
safe_text = st.text(alphabet=SAFE, max_size=12).filter(lambda t: "</think>" not in t)
json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-1000, 1000) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
args_obj = st.dictionaries(st.text(alphabet="abcxyz_", min_size=1, max_size=5), json_value, max_size=4)
separators = st.sampled_from([(", ", ": "), (",", ":"), (" ,", " : ")])
ws_text = st.text(alphabet=" \n\t", max_size=3)
BAD_BODIES = ['{"name": "f"', "{}", "oops", '{"arguments": {}}', '{"name": "f", "arguments": [1]}']


@st.composite
def composition(draw):
    """(rendered output, expected deltas with exact argument text, config, any call?),
    built from a random sequence of reasoning / text / valid calls / malformed blocks."""
    cfg = draw(st.sampled_from([QWEN, THINKING, NO_REASONING]))
    s, reasoning, think = "", None, cfg.starts_in_reasoning or (cfg.reasoning and draw(st.booleans()))
    if think:
        r = draw(safe_text)
        s += "" if cfg.starts_in_reasoning else draw(ws_text) + cfg.think_start
        s += draw(ws_text) + r + draw(ws_text) + cfg.think_end + draw(ws_text)
        reasoning = r.strip()
    segs = []  # ["text", str] | ("call", name, args_text)
    for kind in draw(st.lists(st.sampled_from(["text", "ws", "call", "bad"]), max_size=6)):
        if kind == "call":
            name = draw(st.text(alphabet="abc_xyz", min_size=1, max_size=6))
            args_text = json.dumps(
                draw(args_obj),
                ensure_ascii=draw(st.booleans()),
                separators=draw(separators),
                indent=draw(st.sampled_from([None, 1])),
            )
            key = draw(st.sampled_from(["arguments", "parameters"]))
            body = draw(ws_text) + '{"name": %s, "%s": %s}' % (json.dumps(name), key, args_text) + draw(ws_text)
            s += cfg.tool_start + body + cfg.tool_end
            segs.append(("call", name, args_text))
            continue
        if kind == "text":
            t = draw(safe_text)
        elif kind == "ws":
            t = draw(ws_text)
        else:
            t = cfg.tool_start + draw(st.sampled_from(BAD_BODIES)) + cfg.tool_end
        s += t
        if segs and segs[-1][0] == "text":
            segs[-1][1] += t
        else:
            segs.append(["text", t])
    # a think block only where one was rendered
    assume(think or not cfg.reasoning or not s.lstrip().startswith(cfg.think_start))
    expected = [R(reasoning)] if reasoning else []
    for i, seg in enumerate(segs):
        if seg[0] == "call":
            expected += [ToolCallStart(seg[1]), A(seg[2]), END]
            continue
        t = seg[1]
        if i == 0 and think:
            t = t.lstrip()  # all whitespace right after </think> is dropped
        first, last = i == 0, i + 1 == len(segs)
        prev_call = not first and segs[i - 1][0] == "call"
        next_call = not last and segs[i + 1][0] == "call"
        if t.isspace() and ((first or prev_call) and next_call or prev_call and last):
            continue  # whitespace-only: between calls, before the first, after the last
        expected.append(T(t))
    seen = any(seg[0] == "call" for seg in segs)
    return s, coalesce(expected), cfg, seen


def split_points(draw, s):
    return draw(st.lists(st.integers(0, max(len(s), 1)), max_size=12))


# -- properties ----------------------------------------------------------------------


@SETTINGS
@given(data=st.data())
def test_composition_comes_out_as_composed_in_any_chunking(data):
    s, expected, cfg, seen = data.draw(composition())
    assert run(s, cfg) == expected
    assert run(chunked(s, split_points(data.draw, s)), cfg) == expected
    p = OutputParser(cfg)
    out = [d for ch in s for d in p.feed(ch)] + p.finish()
    assert coalesce(out) == expected
    assert p.saw_tool_call == seen


@SETTINGS
@given(s=noisy_text, cfg=config, data=st.data())
def test_chunking_never_matters_and_matches_reference(s, cfg, data):
    whole = run(s, cfg)
    assert run(chunked(s, split_points(data.draw, s)), cfg) == whole
    assert run(list(s), cfg) == whole
    assert parsed_args(whole) == parsed_args(reference(s, cfg))
    assert all((d.text if type(d) in (R, T) else True) for d in whole)  # nothing empty


@SETTINGS
@given(s=st.text(max_size=60) | noisy_text, cfg=config)
def test_arbitrary_text_never_raises_and_is_accounted_for(s, cfg):
    p = OutputParser(cfg)
    out = coalesce([d for c in chunked(s, [3, 7, 20]) for d in p.feed(c)] + p.finish())
    text = "".join(d.text for d in out if type(d) is T)
    reasoning = "".join(d.text for d in out if type(d) is R)
    calls = sum(type(d) is ToolCallStart for d in out)
    if cfg == PLAIN:  # nothing is a tag: text out == text in, exactly
        assert out == ([T(s)] if s else [])
    if not cfg.starts_in_reasoning and cfg.think_start not in s and cfg.tool_start not in s:
        assert text == s and not reasoning and not calls
    if not cfg.reasoning:
        assert not reasoning
    if not cfg.tools:
        assert not calls
    # every character is somewhere: text, reasoning and the calls' blocks together
    # never hold more non-space characters than the input had
    squeeze = lambda x: "".join(x.split())  # noqa: E731
    args = "".join(d.chunk for d in out if type(d) is A)
    assert len(squeeze(text + reasoning + args)) <= len(squeeze(s))
    assert p.saw_tool_call == (calls > 0)


def test_random_chunkings_of_a_realistic_turn():
    s = (
        "<think>\nThe user wants the weather in two cities. I'll call the tool twice "
        "(a < b, x <th y).\n</think>\n\n"
        "Sure — checking now.\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich", "days": 1}}\n</tool_call>'
    )
    expected = (
        [R("The user wants the weather in two cities. I'll call the tool twice (a < b, x <th y)."), T("Sure — checking now.\n")]
        + call("get_weather", '{"city": "Paris", "days": 3}')
        + call("get_weather", '{"city": "Zürich", "days": 1}')
    )
    rng = random.Random(0)
    for _ in range(200):
        cuts = rng.sample(range(1, len(s)), rng.randint(0, 40))
        assert run(chunked(s, cuts)) == expected


def test_call_names_record_the_valid_calls_only() -> None:
    """The server judges a required call by these (ParserConfig.required_tools is carried,
    never acted on by the parser)."""
    p = OutputParser(ParserConfig(required_tools=("get_weather",)))
    text = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"\n</tool_call>'  # malformed: text
            'x<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>')
    deltas = p.feed(text) + p.finish()
    assert p.call_names == ["get_time", "get_weather"]
    assert [d.name for d in deltas if isinstance(d, ToolCallStart)] == p.call_names
    assert OutputParser(ParserConfig()).call_names == []


def _spans_check(chunks, cfg):
    """Feed `chunks`, then finish: after each call `text_spans` are stretches of the input
    whose texts are that call's answer text, in order across calls; `settled` never goes
    back and never passes the input. Returns all the spans, adjacent ones merged."""
    p, s = OutputParser(cfg), "".join(chunks)
    fed, settled, last_end, spans = 0, 0, 0, []
    for c in [*chunks, None]:
        out = p.feed(c) if c is not None else p.finish()
        fed += len(c or "")
        assert "".join(s[a:b] for a, b in p.text_spans) == "".join(d.text for d in out if type(d) is T)
        for a, b in p.text_spans:
            assert last_end <= a < b
            last_end = b
            if spans and spans[-1][1] == a:  # adjacent: merged
                spans[-1] = (spans[-1][0], b)
            else:
                spans.append((a, b))
        assert settled <= p.settled <= fed
        settled = p.settled
    assert p.settled == len(s)
    return spans


def test_text_spans_mark_where_the_answer_came_from():
    s = '\n<think>\nplan</think>\n\nHi <there\n<tool_call>{"name": "f", "arguments": {}}</tool_call>\n ok <tool_call>bad</tool_call>x'
    spans = _spans_check(list(s), QWEN)
    assert [s[a:b] for a, b in spans] == ["Hi <there\n", "\n ok <tool_call>bad</tool_call>x"]
    assert _spans_check([s], QWEN) == spans
    # whitespace before a malformed block is restored with it; an unterminated block is text
    spans = _spans_check(["a", "<tool_call>", "{}", "</tool_call>", "  ", "<tool_call>", "{"], QWEN)
    assert spans == [(0, 40)]
    p = OutputParser(QWEN)
    assert p.feed("<think>r") == [R("r")] and p.text_spans == [] and p.settled == 8
    assert p.feed("</think>\n\nab <tool") == [T("ab ")] and p.text_spans == [(18, 21)] and p.settled == 21
    assert p.feed("_call>{") == [] and p.text_spans == [] and p.settled == 21  # the block may be text yet


@SETTINGS
@given(s=st.text(max_size=60) | noisy_text, cfg=config, data=st.data())
def test_text_spans_in_any_chunking(s, cfg, data):
    _spans_check(chunked(s, split_points(data.draw, s)), cfg)
    _spans_check(list(s), cfg)
