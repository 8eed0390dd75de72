"""The gateway reads a request body once: strict JSON, the core's key, and a 400 otherwise."""

from __future__ import annotations

import json
import math

import pytest

from prefixroute.core import EMPTY_KEY, RouteKey
from prefixroute.gateway._errors import BadRequest, InvalidJSON
from prefixroute.gateway._requests import (
    MAX_DEPTH,
    Endpoint,
    encode_body,
    other_key,
    parse_body,
    route_key,
    too_deep,
)


def _key(endpoint: Endpoint, obj: object):  # type: ignore[no-untyped-def]
    return route_key(endpoint, json.dumps(obj).encode())


def chat_text(messages: object) -> str | None:
    return _key(Endpoint.CHAT, {"messages": messages}).text


def test_chat_key_extends_turn_by_turn() -> None:
    turn1 = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    turn2 = [*turn1, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "?"}]
    k1, k2 = chat_text(turn1), chat_text(turn2)
    assert k1 == "system: be brief\nuser: hi\n"
    assert k2 is not None and k2.startswith(k1)
    key = _key(Endpoint.CHAT, {"messages": turn1, "add_special_tokens": True})
    assert (key.messages, key.add_special_tokens) == (turn1, True)  # what a tokenizer needs


def test_chat_roles_are_part_of_the_key() -> None:
    assert chat_text([{"role": "user", "content": "x"}]) != chat_text(
        [{"role": "system", "content": "x"}]
    )


def test_chat_content_parts() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "u"}}]
    text = chat_text([{"role": "user", "content": parts}])
    assert text is not None and text.startswith("user: a<part ")


def test_completion_prompts() -> None:
    assert _key(Endpoint.COMPLETIONS, {"prompt": "abc"}).text == "abc"
    assert _key(Endpoint.COMPLETIONS, {"prompt": ["abc", "d"]}).text == "abc"
    k = _key(Endpoint.COMPLETIONS, {"prompt": [1, 2, 3], "model": "m", "stream": True})
    assert (k.tokens, k.text, k.model, k.stream) == ([1, 2, 3], None, "m", True)
    assert _key(Endpoint.COMPLETIONS, {"prompt": [[4, 5]]}).tokens == [4, 5]
    assert _key(Endpoint.COMPLETIONS, {"prompt": "a", "max_tokens": 7}).max_tokens == 7


@pytest.mark.parametrize(
    "obj",
    [
        [1, 2],
        {"prompt": 3},
        {"prompt": []},
        {},
        {"prompt": "a", "model": 5},
        {"prompt": [1, -1]},
    ],
)
def test_bad_completion_bodies(obj: object) -> None:
    with pytest.raises(BadRequest):
        _key(Endpoint.COMPLETIONS, obj)


@pytest.mark.parametrize("obj", [{}, {"messages": []}, {"messages": ["x"]}])
def test_bad_chat_bodies(obj: object) -> None:
    with pytest.raises(BadRequest):
        _key(Endpoint.CHAT, obj)


def test_invalid_json() -> None:
    with pytest.raises(InvalidJSON):
        route_key(Endpoint.CHAT, b"{")


@pytest.mark.parametrize(
    "body",
    [
        '{"prompt": "\u00e9"}'.encode("utf-16"),  # valid JSON, not UTF-8
        b'{"prompt": "\xff"}',  # not UTF-8 at all
        b'{"prompt": NaN}',  # not JSON
        b'{"prompt": "a", "max_tokens": Infinity}',
        b'{"prompt": "a", "temperature": 1e999999}',  # JSON, but beyond a double: Infinity
        b'{"prompt": "a", "top_p": -1E400}',
    ],
)
def test_strict_json(body: bytes) -> None:
    with pytest.raises(InvalidJSON):
        parse_body(body)


def test_the_replica_gets_the_parsed_object_re_encoded() -> None:
    obj = parse_body(b'{"prompt": "a", "prompt": "b", "x": "\\u00e9"}')  # the last key wins
    assert encode_body(obj) == '{"prompt":"b","x":"\u00e9"}'.encode()
    with pytest.raises(InvalidJSON, match="lone surrogate"):
        encode_body(parse_body(b'{"prompt": "\\ud800"}'))
    # What goes upstream is JSON: a NaN or infinity in the object is refused, not written.
    for number in (math.nan, math.inf):
        with pytest.raises(InvalidJSON, match="JSON cannot carry"):
            encode_body({"prompt": "a", "temperature": number})
    # Large and tiny numbers that fit a double are kept as they parse.
    assert json.loads(encode_body(parse_body(b'{"t": 1e308, "u": 1e-400}'))) == {
        "t": 1e308,
        "u": 0.0,
    }


def test_other_calls_route_on_their_model_alone() -> None:
    assert other_key({"model": "m", "input": "x"}) == RouteKey("", None, "m")
    assert other_key({"model": 3}) == other_key([1]) == other_key(None) == EMPTY_KEY


# --- the nesting limit (found by the fuzz suite: deep bodies made replicas 500) ---------------
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
