"""The Responses API's key (core/responses_input.py): the chat messages its ``instructions`` and
``input`` stand for, keyed by the chat rule, so that the same conversation sent either way, and
each next turn, extend one key."""

from __future__ import annotations

import pytest

from prefixroute.core import Endpoint, InvalidPrompt, ReplicaId, Router, key_of, make_policy

CHAT = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "hi there"}]


def test_instructions_and_a_string_input_key_as_a_system_and_a_user_message() -> None:
    body = {"model": "m", "instructions": "Be terse.", "input": "hi there", "stream": True,
            "max_output_tokens": 7}  # fmt: skip
    key = key_of(Endpoint.RESPONSES, body)
    chat = key_of(Endpoint.CHAT, {"model": "m", "messages": CHAT})
    assert key.text == chat.text == "system: Be terse.\nuser: hi there\n"
    assert (key.model, key.stream, key.max_tokens, key.continues) == ("m", True, 7, None)
    assert key.messages == CHAT  # what a tokenizer renders through the chat template


def test_input_text_and_output_text_parts_are_text_and_each_turn_extends_the_key() -> None:
    turn1 = [{"role": "user", "content": [{"type": "input_text", "text": "hi there"}]}]
    turn2 = [
        *turn1,
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "hello"}]},
        {"role": "user", "content": "and then?"},
    ]  # fmt: skip
    first = key_of(Endpoint.RESPONSES, {"input": turn1}).text
    second = key_of(Endpoint.RESPONSES, {"input": turn2}).text
    assert first == "user: hi there\n"
    assert second == "user: hi there\nassistant: hello\nuser: and then?\n"
    chat = [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "and then?"}]  # fmt: skip
    assert second == key_of(Endpoint.CHAT, {"messages": chat}).text


def test_other_items_are_in_the_key_as_their_json_and_images_by_digest() -> None:
    call = {"type": "function_call", "name": "f", "arguments": "{}", "call_id": "c1"}
    out = {"type": "function_call_output", "call_id": "c1", "output": "42"}
    key = key_of(Endpoint.RESPONSES, {"input": [call, out]})
    assert key.messages is not None
    assert [m["role"] for m in key.messages] == ["assistant", "tool"]
    assert '"output":"42"' in (key.text or "")
    other = key_of(Endpoint.RESPONSES, {"input": [call, {**out, "output": "43"}]})
    assert other.text != key.text
    image = {"type": "input_image", "image_url": "data:image/png;base64," + "A" * 10_000}
    pic = key_of(Endpoint.RESPONSES, {"input": [{"role": "user", "content": [image]}]})
    assert "<part " in (pic.text or "") and len(pic.text or "") < 200


def test_previous_response_id_is_kept_as_what_the_request_continues() -> None:
    key = key_of(Endpoint.RESPONSES, {"input": "next", "previous_response_id": "resp_1"})
    assert key.continues == "resp_1" and key.text == "user: next\n"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "'input' is required"),
        ({"input": []}, "non-empty list"),
        ({"input": 5}, "non-empty list"),
        ({"input": ["text"]}, "each input item must be an object"),
        ({"input": [{"role": 1, "content": "x"}]}, "'role' must be a string"),
        ({"input": "x", "instructions": 3}, "'instructions' must be a string"),
        ({"input": "x", "previous_response_id": 5}, "'previous_response_id'"),
        ({"input": "x", "previous_response_id": ""}, "'previous_response_id'"),
    ],
)
def test_bad_requests_say_what_is_wrong(body: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidPrompt, match=message):
        key_of(Endpoint.RESPONSES, body)


def test_a_continuations_usage_teaches_no_characters_per_token() -> None:
    """Its prompt at the replica is the stored conversation and its new input, of which the
    request carries only the input: 5,000 tokens counted against 9 characters would teach the
    model's characters per token a ratio 2,000x too small (types.py: RequestView.extended). A
    request that is all its prompt still teaches it."""
    router = Router(make_policy("round_robin"))
    router.add_replica(ReplicaId("http://r:1"))
    prior = router.chars_per_token_of("m")
    body = {"model": "m", "input": "and then?", "previous_response_id": "resp_1"}
    view = key_of(Endpoint.RESPONSES, body).view(router, "c1")
    assert view.extended and view.char_units
    router.route(view, 0.0)
    router.observe_usage("c1", 5000, 4990)
    router.complete("c1", 1.0, 1)
    assert router.chars_per_token_of("m") == prior
    whole = key_of(Endpoint.RESPONSES, {"model": "m", "input": "and then?"}).view(router, "w1")
    assert not whole.extended
    router.route(whole, 2.0)
    router.observe_usage("w1", 5000, 4990)
    assert router.chars_per_token_of("m") < prior
