"""Requests whose usage counts more than their routing key: a batch of prompts (keyed on its
first) and several sequences per prompt (``n``, ``best_of``). From RouteKey's, RequestView's and
Router.observe_usage's docstrings: a batch's usage teaches nothing (not characters per token,
not cached tokens), and a request of several sequences teaches no decode step."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from prefixroute.core import Endpoint, ReplicaId, RouteKey, Router, key_of, make_policy

R = ReplicaId("http://r:1")


@pytest.mark.parametrize(
    ("endpoint", "body", "prompts", "choices"),
    [
        (Endpoint.COMPLETIONS, {"prompt": "one"}, 1, 1),
        (Endpoint.COMPLETIONS, {"prompt": ["a", "b", "c"], "n": 2}, 3, 2),
        (Endpoint.COMPLETIONS, {"prompt": [[1, 2], [3, 4]]}, 2, 1),
        (Endpoint.COMPLETIONS, {"prompt": [1, 2, 3]}, 1, 1),  # token ids: one prompt
        (Endpoint.COMPLETIONS, {"prompt": "x", "n": 2, "best_of": 4}, 1, 4),
        (Endpoint.COMPLETIONS, {"prompt": "x", "n": True}, 1, 1),  # not a count
        (Endpoint.COMPLETIONS, {"prompt": "x", "n": "3"}, 1, 1),
        (Endpoint.COMPLETIONS, {"prompt": "x", "n": 0}, 1, 1),
        (Endpoint.CHAT, {"messages": [{"role": "user", "content": "hi"}], "n": 3}, 1, 3),
        (Endpoint.GENERATE, {"text": ["a", "b"], "sampling_params": {"n": 2}}, 2, 2),
        (Endpoint.GENERATE, {"text": "a"}, 1, 1),
    ],
)
def test_the_key_counts_prompts_and_choices(
    endpoint: Endpoint, body: dict[str, object], prompts: int, choices: int
) -> None:
    key = key_of(endpoint, body)
    assert (key.prompts, key.choices) == (prompts, choices)
    view = key.view(Router(make_policy("round_robin")), "q")
    assert view.sequences == prompts * choices
    assert view.batch == (prompts > 1)
    model = SimpleNamespace(**body)  # a request model (Ray's) reads alike
    if endpoint is Endpoint.COMPLETIONS:
        assert (key_of(endpoint, model).prompts, key_of(endpoint, model).choices) == (
            prompts, choices,
        )  # fmt: skip


def _router() -> Router:
    router = Router(make_policy("round_robin"))
    router.add_replica(R)
    return router


def _serve(router: Router, key: RouteKey, output: int) -> None:
    """Route ``key``, its first token at 0.1 s, its usage (4 characters a token, 1 cached),
    its end at 1.0 s with ``output`` completion tokens."""
    view = key.view(router, "q")
    router.route(view, 0.0)
    router.first_token("q", 0.1)
    router.observe_usage("q", max(1, view.prompt_units // 4) * key.prompts, 1)
    router.complete("q", 1.0, output)


def test_a_batch_teaches_no_characters_per_token_and_no_cached_tokens() -> None:
    single = _router()
    _serve(single, key_of(Endpoint.COMPLETIONS, {"prompt": "abcd" * 50, "model": "m"}), 8)
    assert single.usage_reports == 1
    assert single.chars_per_token()["m"].observations == 1
    batch = _router()
    body = {"prompt": ["abcd" * 50, "efgh" * 50, "ijkl" * 50], "model": "m"}
    _serve(batch, key_of(Endpoint.COMPLETIONS, body), 8)
    assert batch.usage_reports == 0
    assert "m" not in batch.chars_per_token()
    assert batch.replica_load(R).in_flight == 0  # ended all the same


@pytest.mark.parametrize(("n", "learned"), [(1, 1), (2, 0), (8, 0)])
def test_only_a_single_sequence_teaches_a_decode_step(n: int, learned: int) -> None:
    router = _router()
    _serve(router, key_of(Endpoint.COMPLETIONS, {"prompt": "abcd" * 50, "n": n}), 40 * n)
    assert router.replica_load(R).speed.decode_observations == learned
    assert router.replica_load(R).speed.prefill_observations == 1  # its first token still does
