"""prefixroute.core.request_key: one route key of an OpenAI request, for every front end."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from prefixroute.core import (
    EMPTY_KEY,
    BlockHasher,
    Endpoint,
    InvalidPrompt,
    RouteKey,
    Router,
    key_of,
    make_policy,
)

CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]


def test_a_json_body_and_a_request_model_give_the_same_key() -> None:
    body = {"model": "m", "messages": CHAT, "max_tokens": 5, "stream": True}
    model = SimpleNamespace(
        model="m", messages=[SimpleNamespace(**m) for m in CHAT], max_tokens=5, stream=True
    )
    a, b = key_of(Endpoint.CHAT, body), key_of(Endpoint.CHAT, model)
    assert a.text == b.text == "system: be brief\nuser: hi\n"
    assert (a.model, a.max_tokens, a.stream) == (b.model, b.max_tokens, b.stream) == ("m", 5, True)
    assert a.messages == CHAT  # what a tokenizer renders; a request model's are objects
    assert b.messages is None


def test_completions_text_or_token_ids() -> None:
    assert key_of(Endpoint.COMPLETIONS, {"prompt": "abc"}) == RouteKey("abc", None)
    ids = key_of(Endpoint.COMPLETIONS, {"prompt": [1, 2], "add_special_tokens": False})
    assert (ids.text, ids.tokens, ids.add_special_tokens) == (None, [1, 2], False)
    # "stream" read as the engines read it (pydantic's lax booleans): "yes" and 1 stream.
    for stream, streams in (("yes", True), (1, True), ("no", False), (0, False), ("maybe", False)):
        assert key_of(Endpoint.COMPLETIONS, {"prompt": "a", "stream": stream}).stream is streams


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, 0),
        ({"max_tokens": 7}, 7),
        ({"max_completion_tokens": 9}, 9),
        ({"max_tokens": 7, "max_completion_tokens": 9}, 7),
        ({"max_tokens": None, "max_completion_tokens": 9}, 9),  # a model's unset field
        ({"max_tokens": -1}, 0),
        ({"max_tokens": True}, 0),
        ({"max_tokens": "7"}, 0),
    ],
)
def test_output_length_is_a_hint(fields: dict[str, object], expected: int) -> None:
    assert key_of(Endpoint.COMPLETIONS, {"prompt": "a", **fields}).max_tokens == expected


def test_other_calls_are_keyed_on_load_alone() -> None:
    key = key_of(Endpoint.OTHER, {"model": "m", "input": "x", "max_tokens": 3})
    assert key == RouteKey("", None, "m", False, 3)
    assert RouteKey("", None) == EMPTY_KEY


@pytest.mark.parametrize(
    ("endpoint", "request_", "says"),
    [
        (Endpoint.COMPLETIONS, {"prompt": "a", "model": 5}, "'model' must be a string"),
        (Endpoint.COMPLETIONS, {}, "'prompt' is required"),
        (Endpoint.CHAT, {"messages": []}, "non-empty list"),
        (Endpoint.CHAT, SimpleNamespace(), "non-empty list"),
    ],
)
def test_unreadable_requests_say_why(endpoint: Endpoint, request_: object, says: str) -> None:
    with pytest.raises(InvalidPrompt, match=says):
        key_of(endpoint, request_)


def _router() -> Router:
    return Router(make_policy("round_robin"), BlockHasher(4), seed=1)


def test_the_view_is_the_routers_in_the_keys_own_space() -> None:
    router = _router()
    text = RouteKey("abcdefgh", None, "m", max_tokens=3)
    assert text.view(router, "t") == router.view("t", text="abcdefgh", output_tokens=3, model="m")
    tokens = RouteKey(None, [1, 2, 3, 4, 5], tenant="t", seed=7, adapter="lora")
    expected = router.view("k", tokens=[1, 2, 3, 4, 5], tenant="t", seed=7, adapter="lora")
    assert tokens.view(router, "k") == expected
    plain = RouteKey(None, [1, 2, 3, 4, 5]).view(router, "k")
    assert plain.block_hashes != expected.block_hashes  # seed and adapter do change the hashes
    assert RouteKey(None, None).view(router, "e").prompt_units == 0  # no text: an empty one


# --- SGLang's native /generate ------------------------------------------------------------------
def test_generate_keys_on_text_or_token_ids_with_its_own_field_names() -> None:
    body = {"text": "abc", "sampling_params": {"max_new_tokens": 7}, "stream": True,
            "lora_path": "sql-adapter"}  # fmt: skip
    key = key_of(Endpoint.GENERATE, body)
    assert (key.text, key.tokens, key.max_tokens, key.stream) == ("abc", None, 7, True)
    assert key.adapter == "sql-adapter"  # its blocks are the adapter's, not the base model's
    ids = key_of(Endpoint.GENERATE, {"input_ids": [5, 6, 7]})
    assert (ids.text, ids.tokens, ids.max_tokens, ids.adapter) == (None, [5, 6, 7], 0, None)
    # A batch: the first prompt decides, as for completions, and so do its parameters.
    batch = {"text": ["first", "second"], "sampling_params": [{"max_new_tokens": 3}, {}],
             "lora_path": ["a", None]}  # fmt: skip
    first = key_of(Endpoint.GENERATE, batch)
    assert (first.text, first.max_tokens, first.adapter) == ("first", 3, "a")
    assert key_of(Endpoint.GENERATE, {"input_ids": [[1, 2], [3]]}).tokens == [1, 2]
    assert key_of(Endpoint.GENERATE, {"model": "m", "text": "x"}).model == "m"


def test_generate_with_only_embeddings_routes_on_load() -> None:
    key = key_of(Endpoint.GENERATE, {"input_embeds": [[0.5, 0.25]]})
    assert (key.text, key.tokens) == ("", None)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({}, "'text' or 'input_ids' is required"),
        ({"text": "a", "input_ids": [1]}, "not both"),
        ({"text": 5}, "'text' must be"),
        ({"text": [[1, 2]]}, "'text' must be"),
        ({"input_ids": ["a"]}, "'input_ids' must be"),
        ({"input_ids": [1, -1]}, "'input_ids' must be"),
        ({"input_ids": "abc"}, "'input_ids' must be"),
    ],
)
def test_generate_without_a_usable_prompt_is_refused(body: dict[str, object], says: str) -> None:
    with pytest.raises(InvalidPrompt, match=says):
        key_of(Endpoint.GENERATE, body)
