"""What the fuzz tests share: hypothesis strategies for arbitrary JSON and for mutations
of known-good bodies, the paths into a body, and the shape every refusal must have.

Each test keeps its own sizes (`json_values(...)`'s keywords), so its examples are what
they were when the strategies lived beside it."""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import strategies as st

from protocol.errors import Refusal


def json_scalars(*, text: int = 12, huge: bool = True) -> st.SearchStrategy:
    """null, booleans, integers within +-2**70 (with `huge`, +-10**400 too: past any
    double), finite floats, strings up to `text` characters."""
    scalars = [st.none(), st.booleans(), st.integers(-(2**70), 2**70)]
    if huge:
        scalars.append(st.sampled_from([10**400, -(10**400)]))
    scalars += [st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=text)]
    return st.one_of(scalars)


def json_values(*, max_leaves: int = 12, text: int = 12, keys: int = 8, width: int = 4,
                huge: bool = True) -> st.SearchStrategy:
    """Any JSON value: `json_scalars(text=text, huge=huge)` in lists and objects of up to
    `width` entries (keys up to `keys` characters), at most `max_leaves` scalars."""
    return st.recursive(
        json_scalars(text=text, huge=huge),
        lambda kids: st.lists(kids, max_size=width) | st.dictionaries(st.text(max_size=keys), kids, max_size=width),
        max_leaves=max_leaves,
    )


def paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path into `obj` (keys and list indices), the root `()` first, depth first."""
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += paths(v, prefix + (i,))
    return out


@st.composite
def mutated_bodies(draw: st.DrawFn, bodies: st.SearchStrategy, *, values: st.SearchStrategy,
                   keys: st.SearchStrategy) -> Any:
    """A body drawn from `bodies` (copied) with one to three mutations, each at any path
    below the root: drop it, replace it with one of `values`, retype it (a scalar of
    another type, an empty or wrapping container, its text), or add beside it (a key
    from `keys` with one of `values` in an object, one of `values` appended to a list)."""
    body = copy.deepcopy(draw(bodies))
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(paths(body)[1:]))
        parent = body
        for k in where[:-1]:
            parent = parent[k]
        key = where[-1]
        action = draw(st.sampled_from(["drop", "replace", "retype", "add"]))
        if action == "drop":
            del parent[key]
        elif action == "replace":
            parent[key] = draw(values)
        elif action == "retype":
            old = parent[key]
            parent[key] = draw(st.sampled_from([None, 0, 1.5, True, "s", [], {}, [old], {"x": old}, str(old)]))
        elif isinstance(parent, dict):
            parent[draw(keys)] = draw(values)
        else:
            parent.append(draw(values))
    return body


def check_refusal(r: Refusal, *, empty_param_ok: bool = False) -> None:
    """A decoder's refusal: a 400 invalid_request_error with a message and a code, the
    offending value's path as `param` unless the JSON itself is bad (an empty path only
    where `empty_param_ok`: chat names an unknown key "" by its name), and an envelope
    that serializes as strict JSON."""
    assert isinstance(r, Refusal), r
    assert r.status == 400 and r.type == "invalid_request_error" and r.message, r
    assert r.code, r
    if r.code != "invalid_json":
        assert isinstance(r.param, str) and (r.param or empty_param_ok), r
    json.dumps(r.envelope(), allow_nan=False)
