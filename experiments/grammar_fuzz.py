"""Crash hunting: generated schemas and grammars sent to a real server process.

    PYTHONPATH=. python experiments/grammar_fuzz.py --cases 20000 [--seed S] [--workers 2]

Starts ``python -m ignis.serve +model=scripted`` in a subprocess (SmolLM2's 49k-token
vocabulary: the grammar engine's real costs; one-hot logits, so the grammar alone picks
the text: greedy takes the lowest allowed id, temperature 1 walks the grammar at random)
and sends it generated requests: JSON output formats (Responses ``text.format`` and chat
``response_format``), strict function tools and custom tools (Lark and regex), from
ordinary ones to deep ``$ref`` chains and rule chains, wide objects, enums and choices,
huge literals, cycles with and without a way out, Unicode classes and lone surrogates.

The run fails (exit 1; each failure printed with the index that regenerates it, ``--only
INDEX``) when the process dies, a request hangs past ``--timeout``, an answer is a 5xx,
a refusal is not OpenAI's envelope or its message is unbounded, a case past a limit is
accepted, or a response is ``completed`` with output its schema (jsonschema) or grammar
(the lark package's Earley parser, or Python's re) refuses; and at the end when the server's log
holds a traceback or a line longer than `LOG_LINE_LIMIT`.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import httpx2 as httpx
import jsonschema

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "clients" / "script.yaml"
LOG_LINE_LIMIT = 2_000  # characters: a log line longer holds something a client sent
MESSAGE_LIMIT = 800  # characters of a refusal's message

# Text from many scripts, and the characters a JSON string must escape.
_ALPHABETS = ["abcxyz", "ABC_019", "αβγδεζηθ", "ابتثجح", "中文字符", "é̃ñü", "😀🚀🧪", " \t\n", '"\\/', "\x00\x01\x1f\x7f",
              "\u2028\u00a0\ufeff"]


def _text(rng: random.Random, n: int) -> str:
    letters = "".join(rng.sample(_ALPHABETS, rng.randint(1, 3)))
    return "".join(rng.choice(letters) for _ in range(n))


# -- the server process ----------------------------------------------------------------------


class Served:
    """The server in a subprocess on a free 127.0.0.1 port, its output in `log`."""

    def __init__(self, *overrides: str, log: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = log
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        env.pop("IGNIS_API_KEY", None)
        env.pop("TRITON_INTERPRET", None)
        self.args = [sys.executable, "-m", "ignis.serve", "+model=scripted", f"model.script={SCRIPT}",
                     "engine.num_kv_blocks=4096", "engine.max_num_seqs=16", "server.request_timeout=120",
                     f"server.port={self.port}", "server.access_log=true", *overrides]
        self.env = env

    def __enter__(self) -> Self:
        self._out = open(self.log, "w")  # closed in __exit__
        self.proc = subprocess.Popen(self.args, cwd=ROOT, env=self.env, stdout=self._out, stderr=subprocess.STDOUT)
        end = time.monotonic() + 180
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited at start:\n{self.log.read_text()[-3000:]}")
            try:
                if httpx.get(self.base + "/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if time.monotonic() > end:
                raise RuntimeError("the server did not come up")
            time.sleep(0.3)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._out.close()


# -- cases ------------------------------------------------------------------------------------


@dataclass
class Case:
    index: int
    kind: str
    path: str
    body: dict[str, Any]
    # What a completed answer must match: ("json", schema), ("object", None),
    # ("calls", {name: schema}), ("lark", grammar), ("regex", pattern).
    check: tuple[str, Any] | None = None
    must_refuse: bool = False  # past a limit: a 400 or the run fails
    notes: dict[str, Any] = field(default_factory=dict)


def _string_schema(rng: random.Random) -> dict[str, Any]:
    s: dict[str, Any] = {"type": "string"}
    r = rng.random()
    if r < 0.2:
        s["enum"] = list(dict.fromkeys(_text(rng, rng.randint(0, 6)) for _ in range(rng.randint(1, 5))))
        del s["type"]
    elif r < 0.3:
        s = {"const": _text(rng, rng.randint(0, 12))}
    elif r < 0.45:
        s["maxLength"] = rng.randint(0, 8)
        s["minLength"] = rng.randint(0, s["maxLength"])
    elif r < 0.55:
        s["pattern"] = rng.choice(["^[a-z]{1,4}$", "^[α-ω]+$", "^[\u0600-\u06ff]{1,3}$", "^\\d{2}-\\d{2}$",
                                   "^(yes|no)$", "^[^\"\\\\]{0,5}$"])
    return s


def gen_schema(rng: random.Random, depth: int = 0, defs: dict[str, Any] | None = None,
               strict: bool = True) -> dict[str, Any]:
    """An ordinary schema of llguidance's enforced subset (with `strict`, OpenAI's strict
    one too: every property required, none other allowed; optional means anyOf null)."""
    kinds = ["string", "integer", "number", "boolean", "null", "enum"]
    if depth < 4:
        kinds += ["object", "object", "array", "anyOf"]
    if defs and depth < 6:
        kinds.append("ref")
    kind = "object" if depth == 0 else rng.choice(kinds)
    if kind == "string":
        return _string_schema(rng)
    if kind == "integer":
        low = rng.randint(-50, 50)
        return {"type": "integer", "minimum": low, "maximum": low + rng.randint(0, 100)}
    if kind == "number":
        return {"type": "number", "minimum": -1.5, "maximum": rng.choice([2.25, 1e6])}
    if kind in ("boolean", "null"):
        return {"type": kind}
    if kind == "enum":
        return {"enum": [rng.choice([None, True, 0, -1.5, _text(rng, 3), 42]) for _ in range(rng.randint(1, 4))]}
    if kind == "anyOf":
        return {"anyOf": [gen_schema(rng, depth + 1, defs, strict) for _ in range(rng.randint(2, 3))]}
    if kind == "ref":
        return {"$ref": f"#/$defs/{rng.choice(list(defs or {}))}"}
    if kind == "array":
        items = gen_schema(rng, depth + 1, defs, strict)
        low = rng.randint(0, 2)
        return {"type": "array", "items": items, "minItems": low, "maxItems": low + rng.randint(0, 3)}
    names = list(dict.fromkeys(_text(rng, rng.randint(1, 6)) for _ in range(rng.randint(0, 5))))
    props = {n: gen_schema(rng, depth + 1, defs, strict) for n in names}
    required = names if strict else [n for n in names if rng.random() < 0.7]
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


def gen_recursive(rng: random.Random, strict: bool = True) -> dict[str, Any]:
    """A schema with $defs that refer to each other and a way out (a tree, optional links)."""
    defs: dict[str, Any] = {}
    names = [f"d{i}" for i in range(rng.randint(1, 4))]
    for n in names:
        defs[n] = {"type": "null"}
    for n in names:
        defs[n] = gen_schema(rng, 2, defs, strict)
    defs["node"] = {"type": "object", "properties": {"v": {"type": "integer", "minimum": 0, "maximum": 9},
                                                     "kids": {"type": "array", "items": {"$ref": "#/$defs/node"},
                                                              "maxItems": 2},
                                                     "link": {"anyOf": [{"$ref": f"#/$defs/{rng.choice(names)}"},
                                                                        {"type": "null"}]}},
                    "required": ["v", "kids", "link"], "additionalProperties": False}
    return {"$defs": defs, "type": "object", "properties": {"root": {"$ref": "#/$defs/node"}}, "required": ["root"],
            "additionalProperties": False}


def _ref_chain(n: int, leaf: dict[str, Any]) -> dict[str, Any]:
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(n)}
    defs[f"d{n}"] = leaf
    return {"$defs": defs, "type": "object", "properties": {"x": {"$ref": "#/$defs/d0"}}, "required": ["x"],
            "additionalProperties": False}


def stress_schema(rng: random.Random) -> tuple[dict[str, Any] | Any, bool, str]:
    """(a hostile schema, whether it is past a limit or can never be satisfied, its kind)."""
    r = rng.randrange(12)
    if r == 0:
        n = rng.choice([50, 500, 990, 1200, 2600, 5000])
        return _ref_chain(n, {"type": "string", "maxLength": 3}), n + 3 > 1000, f"ref_chain_{n}"
    if r == 1:
        n = rng.choice([20, 100, 127, 130, 300])
        nested: dict[str, Any] = {"type": "integer"}
        for _ in range(n):
            nested = {"type": "object", "properties": {"a": nested}, "required": ["a"], "additionalProperties": False}
        return nested, False, f"nested_{n}"
    if r == 2:
        n = rng.choice([100, 1000, 3000, 12000])
        props = {f"p{i}": {"type": "boolean"} for i in range(n)}
        return ({"type": "object", "properties": props, "required": list(props), "additionalProperties": False},
                n + 1 > 10_000 or sum(map(len, props)) > 32_768, f"wide_{n}")
    if r == 3:
        n = rng.choice([10, 1000, 5000, 9000])
        vals = [f"v{i}" for i in range(n)]
        return ({"type": "object", "properties": {"e": {"enum": vals}}, "required": ["e"], "additionalProperties": False},
                sum(len(v) for v in vals) + 1 > 32_768, f"enum_{n}")
    if r == 4:
        n = rng.choice([100, 20_000, 40_000, 1_000_000])
        return ({"type": "object", "properties": {"a": {"const": "x" * n}}, "required": ["a"],
                 "additionalProperties": False}, n + 1 > 32_768, f"const_{n}")
    if r == 5:  # a cycle with no way out
        return ({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "type": "object",
                 "properties": {"x": {"$ref": "#/$defs/a"}}, "required": ["x"], "additionalProperties": False},
                True, "cycle_2")
    if r == 6:
        return ({"type": "object", "properties": {"self": {"$ref": "#"}}, "required": ["self"],
                 "additionalProperties": False}, True, "self_required")
    if r == 7:
        return ({"type": "object", "properties": {"a": {"type": "array", "minItems": 1, "items": {"$ref": "#"}}},
                 "required": ["a"], "additionalProperties": False}, True, "array_of_itself")
    if r == 8:  # a cycle with a way out
        return ({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/b"}, {"type": "null"}]}, "b": {"$ref": "#/$defs/a"}},
                 "type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}, "required": ["x"],
                 "additionalProperties": False}, False, "cycle_with_exit")
    if r == 9:  # lone surrogates
        return ({"type": "object", "properties": {"\ud800": {"type": "string"}}, "required": [],
                 "additionalProperties": False}, True, "surrogate_name")
    if r == 10:
        bad = rng.choice([{"type": 5}, {"$ref": "#/nope"}, {"required": "x", "type": "object"}, {"enum": []},
                          {"type": "object", "properties": []}, {"anyOf": []}, {"minimum": "a", "type": "integer"},
                          {"type": "string", "pattern": "(("}, {"$ref": 3}, {"type": ["object", 7]}])
        return bad, False, "odd"
    return {"allOf": [gen_schema(rng) for _ in range(rng.randint(1, 3))]}, False, "allOf"


def _regex(rng: random.Random, depth: int = 0) -> str:
    atoms = ["[α-ω]", "[\u0600-\u06ff]", "[a-z]", "[^\"\\\\]", "\\d", "\\w", "[0-9a-f]", "x", "é", "中", "\\n", "\\t",
             "[\\u4e00-\\u4e10]", "[^a-z]", "\\s", ".", "[😀-🙏]", "\\\\", "\"", "[\\x00-\\x1f]"]
    parts = []
    for _ in range(rng.randint(1, 4)):
        if depth < 3 and rng.random() < 0.2:
            atom = "(" + "|".join(_regex(rng, depth + 1) for _ in range(rng.randint(1, 3))) + ")"
        else:
            atom = rng.choice(atoms)
        parts.append(atom + rng.choice(["", "", "?", "*", "+", "{1,3}", "{2}"]))
    return "".join(parts)


def _lark_literal(rng: random.Random) -> str:
    return json.dumps(_text(rng, rng.randint(1, 5)), ensure_ascii=rng.random() < 0.5)


def gen_lark(rng: random.Random) -> str:
    """An ordinary Lark grammar: rules over literals, regex terminals and later rules."""
    n = rng.randint(1, 6)
    rules = []
    for i in range(n):
        alts = []
        for _ in range(rng.randint(1, 3)):
            items = []
            for _ in range(rng.randint(1, 3)):
                r = rng.random()
                if r < 0.35:
                    item = _lark_literal(rng)
                elif r < 0.6:
                    item = "/" + _regex(rng).replace("/", "\\/") + "/"
                elif r < 0.8 and i + 1 < n:
                    item = f"r{rng.randint(i + 1, n - 1)}"
                else:
                    item = "T"
                items.append(item + rng.choice(["", "", "?", "*", "+"]))
            alts.append(" ".join(items))
        name = "start" if i == 0 else f"r{i}"
        rules.append(f"{name}: " + " | ".join(alts))
    rules.append("T: /[a-c]{1,2}/")
    return "\n".join(rules)


def stress_lark(rng: random.Random) -> tuple[str, bool, str]:
    r = rng.randrange(9)
    if r == 0:
        n = rng.choice([100, 990, 3000])
        text = "start: r0\n" + "\n".join(f'r{i}: r{i + 1} "x"' for i in range(n)) + f'\nr{n}: "y"'
        return text, n + 2 > 1000, f"rule_chain_{n}"
    if r == 1:
        n = rng.choice([100, 3000])
        text = "start: r0\n" + "\n".join(f'r{i}: r{i + 1} | "x{i}"' for i in range(n)) + f'\nr{n}: "y"'
        return text, n + 2 > 1000, f"rule_alt_chain_{n}"
    if r == 2:
        n = rng.choice([100, 4000, 20_000])
        return "start: " + " | ".join(f'"w{i}"' for i in range(n)), n > 4096, f"alternatives_{n}"
    if r == 3:
        n = rng.choice([10, 40, 70])
        return "start: " + "(" * n + '"x"' + ")" * n, n > 64, f"parens_{n}"
    if r == 4:
        n = rng.choice([1000, 40_000])
        return f'start: "{"q" * n}"', n + 2 > 32_768, f"literal_{n}"
    if r == 5:
        return 'start: a\na: a "x"', True, "unproductive"
    if r == 6:
        return 'start: "q" a\na: "x" a', True, "unproductive_tail"
    if r == 7:
        n = rng.choice([100, 3000])
        text = "start: T0\n" + "\n".join(f'T{i}: T{i + 1} "x"' for i in range(n)) + f'\nT{n}: "y"'
        return text, n + 2 > 1000, f"terminal_chain_{n}"
    return rng.choice(['start: /[\\ud800-\\udfff]/', "start: \"\ud800\"", "start: /(((a)))/", "start: foo",
                       "start: /[^\\D\\S]/", "start:", 'start: "a" | ', "%import common.WS\nstart: WS"]), False, "odd"


def generate(index: int, seed: str = "0") -> Case:
    rng = random.Random(f"{seed}-{index}")
    temperature = rng.choice([0, 0, 0, 1.0])  # (sampling from 49k ids costs ~30 ms a token here)
    base: dict[str, Any] = {"model": "scripted", "temperature": temperature, "reasoning": {"effort": "none"},
                            "max_output_tokens": 32 if temperature else rng.choice([32, 128])}
    r = rng.random()
    if r < 0.45:  # a JSON output format
        stress = rng.random() < 0.3
        strict = rng.random() < 0.8
        if stress:
            schema, refuse, kind = stress_schema(rng)
        else:
            schema = gen_recursive(rng, strict) if rng.random() < 0.3 else gen_schema(rng, strict=strict)
            refuse, kind = False, "schema"
        fmt = {"type": "json_schema", "name": "out", "schema": schema, "strict": strict}
        if rng.random() < 0.2:  # the chat endpoint
            body = {"model": "scripted", "temperature": temperature, "max_tokens": base["max_output_tokens"],
                    "reasoning_effort": "none", "messages": [{"role": "user", "content": "JSON please."}],
                    "response_format": {"type": "json_schema", "json_schema": {k: v for k, v in fmt.items() if k != "type"}}}
            return Case(index, f"chat_{kind}", "/v1/chat/completions", body, ("json", schema), refuse)
        return Case(index, f"format_{kind}", "/v1/responses", {**base, "input": "JSON please.", "text": {"format": fmt}},
                    ("json", schema), refuse)
    if r < 0.7:  # strict function tools, a call demanded
        tools, schemas, refuse, kind = [], {}, False, "tools"
        for k in range(rng.randint(1, 3)):
            if rng.random() < 0.25:
                schema, bad, kind = stress_schema(rng)
                refuse = refuse or bad
            else:
                schema = gen_recursive(rng) if rng.random() < 0.2 else gen_schema(rng)
            tools.append({"type": "function", "name": f"f{k}", "parameters": schema, "strict": True})
            schemas[f"f{k}"] = schema
        if rng.random() < 0.05:
            n = rng.choice([600, 3000])
            tools = [{"type": "function", "name": f"g{i}", "parameters": {"type": "object", "properties": {}},
                      "strict": True} for i in range(n)]
            schemas = {t["name"]: t["parameters"] for t in tools}
            refuse, kind = n > 512, f"many_tools_{n}"
        body = {**base, "input": "Call a tool.", "tools": tools, "tool_choice": "required",
                "parallel_tool_calls": rng.random() < 0.5}
        return Case(index, f"function_{kind}", "/v1/responses", body, ("calls", schemas), refuse)
    # a custom tool
    if rng.random() < 0.3:
        pattern = _regex(rng)
        fmt = {"type": "grammar", "syntax": "regex", "definition": pattern}
        check: tuple[str, Any] = ("regex", pattern)
        refuse, kind = False, "regex"
    else:
        if rng.random() < 0.3:
            grammar, refuse, kind = stress_lark(rng)
        else:
            grammar, refuse, kind = gen_lark(rng), False, "lark"
        fmt = {"type": "grammar", "syntax": "lark", "definition": grammar}
        check = ("lark", grammar)
    body = {**base, "input": "Use the tool.", "tools": [{"type": "custom", "name": "t", "format": fmt}],
            "tool_choice": "required"}
    return Case(index, f"custom_{kind}", "/v1/responses", body, check, refuse)


# -- checks -----------------------------------------------------------------------------------

def _lark_accepts(grammar: str, text: str) -> bool | None:
    """Whether `text` is in the language of Lark grammar `grammar`, terminals read as their
    regexes with no lexer deciding where they end (the lark package's Earley parser with
    its complete dynamic lexer): the reading the server enforces. None: lark cannot load it."""
    import lark

    # A surrogate pair written as two escapes is one character to JSON (and so to the
    # server), two lone surrogates to lark's literals: join them first.
    grammar = re.sub(r"\\u(d[89ab][0-9a-f]{2})\\u(d[c-f][0-9a-f]{2})",
                     lambda m: chr(0x10000 + ((int(m[1], 16) - 0xD800) << 10) + int(m[2], 16) - 0xDC00), grammar,
                     flags=re.IGNORECASE)
    try:
        parser = lark.Lark(grammar, parser="earley", lexer="dynamic_complete", start="start")
    except Exception:  # noqa: BLE001 - a dialect difference: nothing to judge with
        return None
    # Lark's complete lexer tries every end of the regex's first (leftmost-first) match,
    # never an end past it: /a|ab/ never takes "ab" (fuzz #11715). Read each terminal as
    # a language instead: the longest prefix the regex matches whole, then lark's own
    # loop over shorter texts finds every other end.
    regexps = parser.parser.parser.term_matcher.__self__.regexps
    parser.parser.parser.term_matcher = functools.partial(_longest_whole_match, regexps)
    try:
        parser.parse(text)
    except lark.exceptions.LarkError:
        return False
    return True


class _Whole:
    """The slice of a match object lark's scanner reads."""

    def __init__(self, text: str, start: int, end: int) -> None:
        self._text, self._end = text[start:end], end

    def group(self, _: int = 0) -> str:
        return self._text

    def end(self) -> int:
        return self._end


def _longest_whole_match(regexps: dict[str, re.Pattern], term: Any, text: str, index: int = 0) -> _Whole | None:
    pattern = regexps[term.name]
    for end in range(len(text), index, -1):
        if pattern.fullmatch(text, index, end):
            return _Whole(text, index, end)
    return None


def _outputs(case: Case, body: dict[str, Any]) -> tuple[str, str, list[dict[str, Any]]]:
    """(status, message text, calls) of a Responses object or a chat completion."""
    if case.path == "/v1/chat/completions":
        choice = body["choices"][0]
        status = {"stop": "completed", "length": "incomplete", "tool_calls": "completed"}.get(choice["finish_reason"],
                                                                                            choice["finish_reason"])
        return status, choice["message"].get("content") or "", []
    text = "".join(p.get("text", "") for item in body.get("output", []) if item["type"] == "message"
                   for p in item.get("content", []))
    calls = [item for item in body.get("output", []) if item["type"] in ("function_call", "custom_tool_call")]
    return body["status"], text, calls


def judge(case: Case, status: int, payload: Any) -> str | None:
    """What is wrong with this answer (None: nothing)."""
    if status >= 500:
        return f"HTTP {status}: {str(payload)[:300]}"
    if status != 200:
        if not (isinstance(payload, dict) and set(payload) == {"error"}):
            return f"HTTP {status} without OpenAI's envelope: {str(payload)[:200]}"
        err = payload["error"]
        if set(err) != {"message", "type", "param", "code"} or err["type"] != "invalid_request_error":
            return f"HTTP {status}, a malformed error: {err}"
        if len(err["message"]) > MESSAGE_LIMIT:
            return f"HTTP {status}, a message of {len(err['message'])} characters"
        return None
    if case.must_refuse:
        return f"accepted (HTTP 200, {payload.get('status') or payload.get('object')}), past a limit"
    state, text, calls = _outputs(case, payload)
    if state != "completed" or case.check is None:
        return None
    what, spec = case.check
    try:
        if what == "json":
            jsonschema.validate(json.loads(text), spec)
        elif what == "calls":
            if not calls:
                return "completed without the demanded call"
            for call in calls:
                jsonschema.validate(json.loads(call["arguments"]), spec[call["name"]])
        elif what in ("lark", "regex"):
            custom = [c for c in calls if c["type"] == "custom_tool_call"]
            if not custom:
                return "completed without the demanded custom call"
            for call in custom:
                ok = (re.fullmatch(spec, call["input"]) is not None if what == "regex"
                      else _lark_accepts(spec, call["input"]))
                if ok is None:
                    case.notes["unchecked"] = True
                elif not ok:
                    return f"completed with input {call['input']!r} that its {what} refuses"
    except (json.JSONDecodeError, jsonschema.ValidationError) as exc:
        return f"completed with output that does not match: {str(exc)[:300]}; text {text[:200]!r} calls {calls!r:.300}"
    except (re.error, RecursionError):
        case.notes["unchecked"] = True  # Rust-only regex syntax; a $ref chain deeper than jsonschema goes
    return None


# -- the run ----------------------------------------------------------------------------------


@dataclass
class Report:
    cases: int = 0
    statuses: Counter = field(default_factory=Counter)
    outcomes: Counter = field(default_factory=Counter)
    kinds: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    slowest: tuple[float, str] = (0.0, "")
    seconds: float = 0.0
    log_lines: int = 0
    longest_log_line: int = 0
    unchecked: int = 0  # completed answers the checkers could not judge
    failed: Counter = field(default_factory=Counter)  # responses that ended failed: kind and error


def run(cases: int, *, seed: str = "0", workers: int = 2, timeout: float = 120.0, only: int | None = None,
        log: Path | None = None, progress: bool = False, server: Served | None = None) -> Report:
    """Send the cases (to `server`, else to a server started for the run) and judge them."""
    if server is None:
        with Served(log=log or Path(tempfile.mkdtemp(prefix="grammar-fuzz-")) / "server.log") as started_server:
            return run(cases, seed=seed, workers=workers, timeout=timeout, only=only, progress=progress,
                       server=started_server)
    report = Report()
    indices = [only] if only is not None else list(range(cases))
    lock = threading.Lock()
    started = time.monotonic()
    todo = iter(indices)

    def worker() -> None:
        with httpx.Client(base_url=server.base, timeout=timeout) as client:
            while True:
                with lock:
                    if report.failures and not server.alive():
                        return
                    k = next(todo, None)
                if k is None:
                    return
                case = generate(k, seed)
                t0 = time.monotonic()
                problem = None
                try:
                    r = client.post(case.path, content=json.dumps(case.body), headers={
                        "Content-Type": "application/json"})
                    status = r.status_code
                    try:
                        payload = r.json()
                    except ValueError:
                        payload = r.text
                    try:
                        problem = judge(case, status, payload)
                    except Exception as exc:  # noqa: BLE001 - the checker's own fault, reported
                        problem = f"the checker failed: {exc!r}"
                    outcome = (payload.get("status") or payload.get("object") if status == 200
                               and isinstance(payload, dict) else str(status))
                except httpx.TimeoutException:
                    status, outcome, problem = 0, "hang", f"no answer within {timeout:g} s"
                except httpx.HTTPError as exc:
                    status, outcome = 0, "died"
                    problem = f"{type(exc).__name__}: {exc}; server alive: {server.alive()}"
                took = time.monotonic() - t0
                with lock:
                    report.cases += 1
                    report.statuses[status] += 1
                    report.outcomes[outcome] += 1
                    report.kinds[case.kind.split("_")[0] + ":" + case.kind.split("_", 1)[-1].split("_")[0]] += 1
                    if took > report.slowest[0]:
                        report.slowest = (took, f"#{k} {case.kind}")
                    report.unchecked += bool(case.notes.get("unchecked"))
                    if outcome == "failed" and isinstance(payload, dict):
                        error = (payload.get("error") or {}).get("message", "")
                        report.failed[f"{case.kind}: {error[:90]}"] += 1
                    if problem is not None:
                        report.failures.append(f"#{k} {case.kind}: {problem}")
                    if progress and report.cases % 500 == 0:
                        print(f"{report.cases} cases, {len(report.failures)} failures, "
                              f"{time.monotonic() - started:.0f} s", flush=True)
                if problem is not None and not server.alive():
                    return

    threads = [threading.Thread(target=worker) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if not server.alive():
        report.failures.append(f"the server died (exit {server.proc.returncode})")
    else:
        try:
            if httpx.get(server.base + "/health", timeout=10).status_code != 200:
                report.failures.append("the server is unhealthy after the run")
        except httpx.HTTPError as exc:
            report.failures.append(f"the server does not answer after the run: {exc}")
    report.seconds = time.monotonic() - started
    lines = server.log.read_text(errors="replace").splitlines()
    report.log_lines = len(lines)
    report.longest_log_line = max((len(ln) for ln in lines), default=0)
    if report.longest_log_line > LOG_LINE_LIMIT:
        report.failures.append(f"a server log line of {report.longest_log_line} characters")
    for ln in lines:
        if "Traceback" in ln or "Segmentation" in ln or "panicked" in ln:
            report.failures.append(f"the server logged: {ln[:200]}")
            break
    return report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--seed", default="0")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--only", type=int, default=None, help="run just this case index (a failure's #)")
    ap.add_argument("--log", type=Path, default=None, help="the server's log (default: a temporary file)")
    args = ap.parse_args()
    report = run(args.cases, seed=args.seed, workers=args.workers, timeout=args.timeout, only=args.only,
                 log=args.log, progress=True)
    print(f"cases {report.cases} in {report.seconds:.0f} s ({report.cases / max(report.seconds, 1e-9):.1f}/s), "
          f"workers {args.workers}, seed {args.seed!r}")
    print("HTTP status:", dict(sorted(report.statuses.items())))
    print("outcomes:", dict(report.outcomes.most_common()))
    print("kinds:", dict(sorted(report.kinds.items())))
    print(f"slowest answer: {report.slowest[0]:.2f} s ({report.slowest[1]})")
    print(f"server log: {report.log_lines} lines, the longest {report.longest_log_line} characters; "
          f"completed answers not checkable: {report.unchecked}")
    print("responses that ended failed (allowed; the grammar's own end):")
    for what, n in report.failed.most_common(12):
        print(f"  {n} x {what}")
    print(f"failures: {len(report.failures)}")
    for f in report.failures[:50]:
        print("  " + f)
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
