"""Tests for prefixroute.core.prompt_key: the routing text shared by the gateway and Ray Serve."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from prefixroute.core.prompt_key import InvalidPrompt, chat_text, content_text, prompt_key


@dataclass
class Message:  # a request model's message: attributes, not keys
    role: str
    content: object


def test_chat_text_reads_mappings_and_objects_alike() -> None:
    as_json = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    as_objects = [Message("system", "be brief"), Message("user", "hi")]
    assert chat_text(as_json) == chat_text(as_objects) == "system: be brief\nuser: hi\n"


def test_next_turn_extends_the_previous_key() -> None:
    turn1 = [{"role": "user", "content": "a"}]
    turn2 = [*turn1, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]
    assert chat_text(turn2).startswith(chat_text(turn1))


def test_content_parts_render_text_as_is_and_other_parts_as_canonical_json() -> None:
    parts = [{"type": "text", "text": "look: "}, {"type": "image_url", "image_url": {"url": "u"}}]
    assert content_text(parts) == 'look: {"image_url":{"url":"u"},"type":"image_url"}'
    assert content_text(None) == ""
    assert content_text({"b": 1, "a": 2}) == '{"a":2,"b":1}'


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("plain", ("plain", None)),
        (["first", "second"], ("first", None)),
        ([1, 2, 3], (None, [1, 2, 3])),
        ([[4, 5], [6]], (None, [4, 5])),
    ],
)
def test_prompt_key_text_or_token_ids(prompt: object, expected: object) -> None:
    assert prompt_key(prompt) == expected


@pytest.mark.parametrize(
    ("call", "says"),
    [
        (lambda: chat_text([]), "non-empty list"),
        (lambda: chat_text("a string"), "non-empty list"),
        (lambda: chat_text([3]), "each message must be an object"),
        (lambda: prompt_key(None), "'prompt' is required"),
        (lambda: prompt_key(3.5), "'prompt' must be"),
        (lambda: prompt_key([True, False]), "'prompt' must be"),
        (lambda: prompt_key([2**32]), "'prompt' must be"),
    ],
)
def test_unreadable_prompts_raise_invalid_prompt(call: object, says: str) -> None:
    with pytest.raises(InvalidPrompt, match=says) as err:
        call()  # type: ignore[operator]
    assert isinstance(err.value, ValueError)
