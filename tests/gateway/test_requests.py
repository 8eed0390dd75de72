from __future__ import annotations

import json

import pytest

from prefixroute.gateway._errors import BadRequest, InvalidJSON
from prefixroute.gateway._requests import Endpoint, chat_text, route_key


def _key(endpoint: Endpoint, obj: object):  # type: ignore[no-untyped-def]
    return route_key(endpoint, json.dumps(obj).encode())


def test_chat_key_extends_turn_by_turn() -> None:
    turn1 = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    turn2 = [*turn1, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "?"}]
    k1, k2 = chat_text(turn1), chat_text(turn2)
    assert k1 == "system: be brief\nuser: hi\n"
    assert k2.startswith(k1)


def test_chat_roles_are_part_of_the_key() -> None:
    assert chat_text([{"role": "user", "content": "x"}]) != chat_text(
        [{"role": "system", "content": "x"}]
    )


def test_chat_content_parts() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "u"}}]
    assert chat_text([{"role": "user", "content": parts}]).startswith("user: a{")


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
