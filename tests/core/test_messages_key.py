"""Anthropic's Messages API key (core/messages_input.py): the chat messages its ``system`` and
``messages`` stand for, keyed by the chat rule, less what varies per request without changing
the prompt the engine computes (``cache_control`` hints, Claude Code's attribution block)."""

from __future__ import annotations

import pytest

from prefixroute.core import Endpoint, InvalidPrompt, key_of

CHAT = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "hi there"}]


def test_system_and_messages_key_as_the_same_chat() -> None:
    body = {"model": "m", "system": "Be terse.", "max_tokens": 7, "stream": True,
            "messages": [{"role": "user", "content": "hi there"}]}  # fmt: skip
    key = key_of(Endpoint.MESSAGES, body)
    chat = key_of(Endpoint.CHAT, {"model": "m", "messages": CHAT})
    assert key.text == chat.text == "system: Be terse.\nuser: hi there\n"
    assert (key.model, key.stream, key.max_tokens) == ("m", True, 7)
    assert key.messages == CHAT  # what a tokenizer renders through the chat template


def test_text_blocks_are_text_and_each_turn_extends_the_key() -> None:
    system = [{"type": "text", "text": "Be "}, {"type": "text", "text": "terse."}]
    turn1 = [{"role": "user", "content": [{"type": "text", "text": "hi there"}]}]
    turn2 = [*turn1, {"role": "assistant", "content": [{"type": "text", "text": "hello"}]},
             {"role": "user", "content": "and then?"}]  # fmt: skip
    first = key_of(Endpoint.MESSAGES, {"system": system, "messages": turn1}).text
    second = key_of(Endpoint.MESSAGES, {"system": system, "messages": turn2}).text
    assert first == "system: Be terse.\nuser: hi there\n"
    assert second == first + "assistant: hello\nuser: and then?\n"


def test_cache_control_and_the_billing_header_leave_the_key_alone() -> None:
    """Claude Code moves its cache_control marker to the newest turn and sends a system block
    with a per-request hash; vLLM drops that block. Neither may make a turn a new prefix."""

    def body(stamp: str, marked: int) -> dict[str, object]:
        system = [{"type": "text", "text": f"x-anthropic-billing-header: cc_version=1; {stamp}"},
                  {"type": "text", "text": "You are a coding agent.",
                   "cache_control": {"type": "ephemeral"}}]  # fmt: skip
        messages = []
        for i in range(3):
            block: dict[str, object] = {"type": "text", "text": f"turn {i}"}
            tool = {"type": "tool_result", "tool_use_id": f"t{i}", "content": "ok"}
            if i == marked:
                block["cache_control"] = tool["cache_control"] = {"type": "ephemeral"}
            messages.append({"role": "user", "content": [block, tool]})
        return {"system": system, "messages": messages}

    a, b = key_of(Endpoint.MESSAGES, body("a1", 0)), key_of(Endpoint.MESSAGES, body("b2", 2))
    assert a.text == b.text and a.messages == b.messages
    assert a.text is not None and a.text.startswith("system: You are a coding agent.\nuser: turn 0")
    assert "billing" not in a.text


def test_other_blocks_are_in_the_key_by_digest_and_inline_system_messages_are_kept() -> None:
    call = {"type": "tool_use", "id": "t1", "name": "f", "input": {"x": 1}}
    result = {"type": "tool_result", "tool_use_id": "t1", "content": "42"}
    key = key_of(Endpoint.MESSAGES, {"messages": [
        {"role": "assistant", "content": [call]},
        {"role": "system", "content": "a reminder"},
        {"role": "user", "content": [result]},
    ]})  # fmt: skip
    other = key_of(Endpoint.MESSAGES, {"messages": [
        {"role": "assistant", "content": [{**call, "input": {"x": 2}}]},
        {"role": "system", "content": "a reminder"},
        {"role": "user", "content": [result]},
    ]})  # fmt: skip
    assert key.text is not None and "<part " in key.text and "system: a reminder\n" in key.text
    assert other.text != key.text


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "'messages' must be a non-empty list"),
        ({"messages": []}, "'messages' must be a non-empty list"),
        ({"messages": "hi"}, "'messages' must be a non-empty list"),
        ({"messages": ["hi"]}, "each message must be an object"),
        ({"messages": [{"role": 1, "content": "x"}]}, "'role' must be a string"),
        ({"messages": [{"role": "user", "content": 5}]}, "'content' must be a string or a list"),
        ({"messages": [{"role": "user", "content": "x"}], "system": 3}, "'system' must be"),
        ({"messages": [{"role": "user", "content": "x"}], "system": [{"type": "image"}]},
         "'system' must be"),
    ],
)  # fmt: skip
def test_bad_requests_say_what_is_wrong(body: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidPrompt, match=message):
        key_of(Endpoint.MESSAGES, body)
