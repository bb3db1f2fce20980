"""The limits on a request's grammars, read before llguidance sees them
(ignis/server/grammar_bounds.py, schema_outline.py, lark_outline.py, grammar_graph.py):
depth through $ref chains and rule chains, satisfiability of cycles, literal text, and
character classes judged exactly; all without recursion and quickly."""

from __future__ import annotations

import pytest

from ignis.engine.grammar import bounded_message
from ignis.server import lark_outline, schema_outline
from ignis.server.freeform import FreeformError, json_string_rule, regex_expr
from ignis.server.grammar_bounds import MAX_DEPTH, GrammarBudget, check_grammars
from ignis.server.grammar_graph import productive, weighted_depth
from protocol.conversation import CustomFormat, FunctionTool
from protocol.errors import Refusal
from protocol.structured import TextFormat


def test_graph_depth_counts_a_cycle_whole_and_works_without_recursion() -> None:
    chain = [[i + 1] for i in range(50_000)] + [[]]
    assert weighted_depth(chain, [0]) == 50_001
    cycle = [[1], [2], [0, 3], []]
    assert weighted_depth(cycle, [0]) == 4
    assert productive([[[1]], [[0]]]) == [False, False]  # a -> b -> a
    assert productive([[[1]], [[0], [2]], []]) == [False, False, True]  # b needs a and c: stuck
    assert productive([[[1, 2]], [[0]], []]) == [True, True, True]  # a: b or c; b: a


@pytest.mark.parametrize(("schema", "ok"), [
    ({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "type": "object",
      "properties": {"x": {"$ref": "#/$defs/a"}}, "required": ["x"]}, False),
    ({"type": "object", "properties": {"x": {"$ref": "#"}}, "required": ["x"]}, False),
    ({"type": "object", "properties": {"x": {"$ref": "#"}}}, True),  # x is optional
    ({"type": ["object", "null"], "properties": {"x": {"$ref": "#"}}, "required": ["x"]}, True),
    ({"type": "array", "minItems": 1, "items": {"$ref": "#"}}, False),
    ({"type": "array", "items": {"$ref": "#"}}, True),  # [] will do
    ({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}}, "$ref": "#/$defs/a"}, True),
    ({"$defs": {"n": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/n"}}},
                      "required": ["kids"]}}, "$ref": "#/$defs/n"}, True),  # a tree
    ({"$defs": {"a b/c": {"$ref": "#/$defs/a%20b~1c"}}, "$ref": "#/$defs/a%20b~1c"}, False),  # escapes resolved
    ({"type": "object", "properties": {"x": {"$ref": "#/$defs/missing"}}, "required": ["x"]}, True),  # engine's
    ({"enum": []}, False),
    ({"type": "object", "properties": {}, "required": ["x"], "additionalProperties": False}, False),
])
def test_which_schemas_can_produce_a_finite_value(schema: dict, ok: bool) -> None:
    assert schema_outline.outline(schema).productive is ok


def test_schema_outline_counts_depth_literals_and_surrogates() -> None:
    n = 5000
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(n)}
    defs[f"d{n}"] = {"type": "string"}
    out = schema_outline.outline({"$defs": defs, "type": "object", "properties": {"x": {"$ref": "#/$defs/d0"}}})
    assert out.depth == n + 3 and out.nodes == n + 3 and out.productive
    out = schema_outline.outline({"properties": {"a": {"const": "x" * 100}, "b": {"enum": ["ab", 12]}}})
    assert out.literal_chars == 100 + 4
    assert schema_outline.outline({"enum": ["\ud800"]}).surrogate


def test_lark_outline() -> None:
    out = lark_outline.outline('start: a\na: a "x"')
    assert out.stuck == ("start", "a")
    assert lark_outline.outline('start: "q" a\na: "x" a').stuck == ("start", "a")
    assert lark_outline.outline('start: "q" | a\na: a').stuck is None
    assert lark_outline.outline('?start: x+\nx.2[lazy]: "a" ~ 2..3 | y{2,3} -> alias\ny: /b+/').stuck is None
    assert lark_outline.outline('start: x*\nx: x').stuck is None  # zero times will do
    chain = "start: r0\n" + "\n".join(f'r{i}: r{i + 1} "x"' for i in range(3000)) + '\nr3000: "y"'
    out = lark_outline.outline(chain)
    assert out.depth == 3002 and out.rules == 3002 and out.stuck is None
    out = lark_outline.outline('start: "a" | "b" // not | here\n  | ("c" | /d|e/)')
    assert out.alternatives == 4 and out.literal_chars == len('"a""b""c"/d|e/')
    assert lark_outline.outline("start: " + "(" * 70 + '"x"' + ")" * 70).nesting == 70


def _refusal(fmt: TextFormat = TextFormat(), tools: list[FunctionTool] = ()) -> Refusal:
    with pytest.raises(Refusal) as info:
        check_grammars(fmt, list(tools), format_param="text.format", tool_param=lambda name: "tools[0].parameters")
    return info.value


def test_each_limit_is_a_400_at_its_param_naming_it() -> None:
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(MAX_DEPTH)}
    deep = TextFormat("json_schema", "x", {"$defs": defs, "$ref": "#/$defs/d0"}, strict=True)
    err = _refusal(deep)
    assert err.param == "text.format.schema" and err.code == "invalid_json_schema" and "the limit is 1,000" in err.message
    tool = FunctionTool("f", parameters={"type": "object", "properties": {"a": {"const": "y" * 40_000}}}, strict=True)
    err = _refusal(tools=[tool])
    assert err.param == "tools[0].parameters" and "32,768" in err.message and "yyyy" not in err.message
    lark = FunctionTool("t", format=CustomFormat("lark", 'start: a\na: a "x"'), where="tools[2]")
    err = _refusal(tools=[lark])
    assert err.param == "tools[2].format.definition" and "can never finish" in err.message
    many = [FunctionTool(f"f{i}") for i in range(513)]
    assert _refusal(tools=many).code == "array_above_max_length"
    # The totals are the request's: two tools of 20,000 literal characters each.
    half = [FunctionTool(f"g{i}", parameters={"type": "object", "properties": {"a": {"const": "z" * 20_000}}},
                         strict=True) for i in range(2)]
    assert "32,768" in _refusal(tools=half).message
    budget = GrammarBudget()
    budget.schema({"type": "object"}, owner="x", param="p", code="c")
    assert budget.nodes == 1  # non-strict tools' schemas are never compiled: not counted
    check_grammars(TextFormat(), [FunctionTool("h", parameters={"const": "z" * 50_000})], format_param="text.format",
                   tool_param=lambda name: "p")


@pytest.mark.parametrize(("pattern", "plain"), [
    ("[α-ω]", True), ("[\u0600-\u06ff]", True), ("[\\u0600-\\u06ff]", True), ("[😀-🙏]", True),
    ("[^\\D\\S]", False), ("[^\\x00-\\U0010ffff]", False), ("[\\x00-\\x1f]", False), ('["\\\\]', False),
    ("[^a-z]", True), ("[a-z]", True), ("[\\w]", True), ("[^\\w\\W]", False),
])
def test_character_classes_are_judged_exactly(pattern: str, plain: bool) -> None:
    """A class's plain members (a JSON string holds them as they are) exist or not, whatever
    its script; control characters and quotes alone become escape literals instead."""
    try:
        rule = json_string_rule("regex", pattern)
    except FreeformError as exc:
        assert "matches nothing" in str(exc) and not plain and pattern not in ("[\\x00-\\x1f]", '["\\\\]')
        return
    assert ("&&" in rule) is plain, rule


def test_surrogates_and_deep_regexes_are_refused_cleanly() -> None:
    with pytest.raises(FreeformError, match="surrogates"):
        json_string_rule("lark", "start: /[\\ud800-\\udfff]/")
    with pytest.raises(FreeformError, match="nests too deeply"):  # (Python's parser recurses)
        regex_expr("(" * 600 + "a" + ")" * 600)


def test_messages_are_one_bounded_line() -> None:
    text = 'at 2(6): unknown name: "bar"\n   1 | start: foo\n   2 | foo: bar\n<state>\n' + "x" * 10_000
    assert bounded_message(text) == 'at 2(6): unknown name: "bar"'
    assert len(bounded_message("y" * 5000)) == 300
