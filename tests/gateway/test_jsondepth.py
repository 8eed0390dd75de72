"""The request-body nesting limit (found by the fuzz suite: deep bodies made replicas 500)."""

from __future__ import annotations

import json

import pytest

from prefixroute.gateway._errors import InvalidJSON
from prefixroute.gateway._jsondepth import MAX_DEPTH, too_deep
from prefixroute.gateway._requests import parse_body


def nested(depth: int) -> bytes:
    return b'{"prompt":' + b"[" * (depth - 1) + b"1" + b"]" * (depth - 1) + b"}"


def test_depth_is_counted_in_levels_of_arrays_and_objects() -> None:
    for depth in (1, 2, MAX_DEPTH):
        body = nested(depth)
        assert not too_deep(body, json.loads(body))
    body = nested(MAX_DEPTH + 1)
    assert too_deep(body, json.loads(body))
    # Many containers side by side are wide, not deep.
    wide = json.dumps({"messages": [{"role": "user", "content": [{"type": "text"}]}] * 500})
    assert not too_deep(wide.encode(), json.loads(wide))


def test_parse_body_refuses_deep_bodies_as_invalid_json() -> None:
    assert parse_body(nested(MAX_DEPTH)) is not None
    with pytest.raises(InvalidJSON, match="nests more than"):
        parse_body(nested(MAX_DEPTH + 1))
    with pytest.raises(InvalidJSON):  # deeper than the interpreter's recursion limit
        parse_body(b"[" * 100_000 + b"]" * 100_000)
