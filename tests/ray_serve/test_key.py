"""The routing key is read where Ray's router reads it, and extends across turns."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from prefixroute.ray_serve import ChatRequest, CompletionRequest, UnroutableRequest, route_key

from .support import MARKS

pytestmark = MARKS


def test_chat_messages_become_role_prefixed_text() -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    req = ChatRequest(messages)
    key = route_key([req], {})
    assert key.text == "system: be brief\nuser: hi\n"
    assert key.tokens is None
    assert key.max_tokens == 16


def test_next_turn_extends_the_previous_key() -> None:
    first = [{"role": "user", "content": "a question"}]
    reply = {"role": "assistant", "content": "an answer"}
    second = [*first, reply, {"role": "user", "content": "?"}]
    a, b = route_key([{"messages": first}], {}), route_key([{"messages": second}], {})
    assert a.text is not None and b.text is not None
    assert b.text.startswith(a.text) and len(b.text) > len(a.text)


def test_attribute_or_key_and_the_first_argument_that_has_one() -> None:
    obj = SimpleNamespace(prompt="from an attribute", max_tokens=7)
    as_dict = {"prompt": "from an attribute", "max_tokens": 7}
    assert route_key(["not a request", obj], {}) == route_key([as_dict], {})
    assert route_key([], {"request": {"prompt": "as a keyword"}}).text == "as a keyword"


def test_messages_left_none_fall_back_to_the_prompt() -> None:
    both = SimpleNamespace(messages=None, prompt="the prompt")
    assert route_key([both], {}).text == "the prompt"


def test_message_objects_and_content_parts() -> None:
    msg = SimpleNamespace(
        role="user",
        content=[{"type": "text", "text": "look: "}, {"type": "image_url", "image_url": "u"}],
    )
    text = route_key([SimpleNamespace(messages=[msg])], {}).text
    assert text is not None and text.startswith("user: look: <part ")  # core.prompt_key


def test_token_prompts_route_on_the_ids_and_a_batch_on_its_first() -> None:
    assert route_key([CompletionRequest([1, 2, 3])], {}).tokens == [1, 2, 3]
    assert route_key([{"prompt": [[4, 5], [6]]}], {}).tokens == [4, 5]
    assert route_key([{"prompt": ["first", "second"]}], {}).text == "first"


@pytest.mark.parametrize(
    ("args", "kwargs", "says"),
    [
        ([], {}, "no argument"),
        (["just a string", 3], {"x": 1}, "no argument"),
        ([{"messages": []}], {}, "non-empty"),
        ([{"prompt": 3.5}], {}, "'prompt' must be"),
    ],
)
def test_unroutable_requests_say_why(
    args: list[object], kwargs: dict[str, object], says: str
) -> None:
    with pytest.raises(UnroutableRequest, match=says) as err:
        route_key(args, kwargs)
    assert isinstance(err.value, ValueError)  # what Ray's own router raises for the same
