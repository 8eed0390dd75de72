"""Tests for prefixroute.core.prompt_key: the routing text shared by the gateway and Ray Serve."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import pytest

from prefixroute.core.prompt_key import (
    InvalidPrompt,
    chat_text,
    content_text,
    lax_bool,
    prompt_key,
)


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


def test_content_parts_render_text_as_is_and_other_parts_as_a_digest() -> None:
    parts = [{"type": "text", "text": "look: "}, {"type": "image_url", "image_url": {"url": "u"}}]
    canonical = '{"image_url":{"url":"u"},"type":"image_url"}'
    digest = hashlib.sha256(canonical.encode()).hexdigest()[:32]
    assert content_text(parts) == f"look: <part {digest}>"
    # The same part in another key order is the same part; another image is another part.
    same = [{"text": "look: ", "type": "text"}, {"image_url": {"url": "u"}, "type": "image_url"}]
    assert content_text(same) == content_text(parts)
    other = [parts[0], {"type": "image_url", "image_url": {"url": "v"}}]
    assert content_text(other) != content_text(parts)
    # A 200 KB base64 image is a few dozen characters of key, not 200,000 (a tenant's token
    # budget and the prefill prediction are counted from the key's length).
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 200_000}}
    assert len(content_text([image])) < 64
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


@pytest.mark.parametrize(
    ("value", "read"),
    [
        (True, True), (False, False), (1, True), (0, False), (1.0, True), (0.0, False),
        ("true", True), ("True", True), ("YES", True), ("on", True), ("t", True), ("y", True),
        ("1", True), ("false", False), ("No", False), ("off", False), ("f", False),
        ("n", False), ("0", False),
        # Not booleans to pydantic: the engine refuses them.
        (2, None), (-1, None), (0.5, None), ("", None), ("maybe", None), (" true", None),
        (None, None), ([True], None), ({}, None),
    ],
)  # fmt: skip
def test_booleans_read_as_the_engines_request_models_read_them(value: object, read: object) -> None:
    """pydantic's lax booleans (vLLM's and SGLang's request models): bool, 0/1, 0.0/1.0 and
    the strings of its conversion table, in any case."""
    assert lax_bool(value) is read
