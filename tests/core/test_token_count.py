"""Tests for prefixroute.core.token_count: characters per token learned per model from usage."""

from __future__ import annotations

import pytest

from prefixroute.core import (
    BlockHasher,
    CharsPerToken,
    ConfigError,
    ReplicaId,
    Router,
    TokenCountConfig,
    make_policy,
)

R = ReplicaId("r0")


def router(block_size: int = 4, **kw: object) -> Router:
    out = Router(make_policy("predicted_ttft"), BlockHasher(block_size), **kw)  # type: ignore[arg-type]
    out.add_replica(R)
    return out


def answer(r: Router, rid: str, text: str, prompt_tokens: int, model: str | None = "m") -> None:
    """Route ``text`` and report the replica's token count for it."""
    r.route(r.view(rid, text=text, model=model), 0.0)
    r.observe_usage(rid, prompt_tokens, None)
    r.complete(rid, 1.0)


# --- the estimator ---------------------------------------------------------------------------


def test_the_prior_until_observed_then_the_token_weighted_median() -> None:
    """The prior counts as one 64-token prompt among the observations."""
    est = CharsPerToken()
    assert est.value == 4.0 and est.observations == 0
    est.observe(600, 100)  # 6 characters a token, over more tokens than the prior's 64
    assert est.value == 6.0
    est.observe(200, 100)  # 2
    est.observe(500, 100)  # 5
    assert est.value == 5.0  # the median of 2, 5, 6
    est.observe(30, 10)  # 3, but a short prompt: weighs a tenth of the others
    assert est.value == 5.0


def test_a_few_odd_prompts_do_not_move_it() -> None:
    est = CharsPerToken()
    for _ in range(10):
        est.observe(550, 100)
    est.observe(100_000, 100)  # an image part rendered as JSON, say: 1,000 characters a token
    est.observe(20, 100)  # a prompt that is nearly all chat template
    assert est.value == 5.5


def test_it_stays_within_its_bounds_and_ignores_empty_counts() -> None:
    cfg = TokenCountConfig(min_chars_per_token=0.5, max_chars_per_token=10.0)
    high, low = CharsPerToken(cfg), CharsPerToken(cfg)
    high.observe(50_000, 100)
    low.observe(100, 1_000)
    assert (high.value, low.value) == (10.0, 0.5)
    high.observe(0, 10)
    high.observe(10, 0)
    assert high.observations == 1


def test_short_prompts_leave_the_prior_alone_and_a_long_one_replaces_it() -> None:
    """A two-word greeting is mostly template and word boundaries: "hello there" is 5.5
    characters a token where the same tokenizer makes 3.9 on longer text."""
    est = CharsPerToken()
    for _ in range(3):
        est.observe(11, 2)
    assert est.value == 4.0
    est.observe(1_500, 300)
    assert est.value == 5.0
    assert CharsPerToken(TokenCountConfig(prior_tokens=0)).value == 4.0  # until observed


def test_the_window_forgets_old_prompts() -> None:
    est = CharsPerToken(TokenCountConfig(window=4))
    for _ in range(4):
        est.observe(300, 100)
    for _ in range(3):
        est.observe(800, 100)
    assert est.value == 8.0  # 3 of the 4 kept are 8


@pytest.mark.parametrize(
    "kw",
    [
        {"chars_per_token": 0.0},
        {"chars_per_token": 20.0},
        {"min_chars_per_token": 5.0},
        {"min_chars_per_token": 0.0},
        {"window": 0},
        {"prior_tokens": -1},
    ],
)
def test_bad_configs_are_refused(kw: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        TokenCountConfig(**kw)  # type: ignore[arg-type]


# --- through the router ----------------------------------------------------------------------


def test_a_text_view_counts_tokens_at_its_models_learned_ratio() -> None:
    r = router()
    assert r.view("v0", text="x" * 600, model="m").prompt_tokens == 150  # the 4.0 prior
    answer(r, "a", "y" * 600, 100)  # the replica counted 6 characters a token
    assert r.tokens.chars_per_token("m") == 6.0
    assert r.view("v1", text="x" * 600, model="m").prompt_tokens == 100
    assert r.view("v2", text="x" * 600, model="other").prompt_tokens == 150  # its own ratio
    assert r.view("v3", text="x" * 600).prompt_tokens == 150  # no model: its own too
    assert r.view("v4", tokens=list(range(600)), model="m").prompt_tokens == 600  # ids: exact
    assert set(r.tokens.models()) == {"m"}


def test_only_text_requests_with_a_reported_count_teach_it() -> None:
    r = router()
    r.route(r.view("ids", tokens=list(range(40)), model="m"), 0.0)
    r.observe_usage("ids", 5, 0)  # token ids: exact already, nothing to learn
    r.complete("ids", 1.0)
    r.route(r.view("silent", text="z" * 40, model="m"), 0.0)
    r.complete("silent", 1.0)  # no usage
    r.observe_usage("silent", 5, 0)  # too late: the request is over
    r.observe_usage("unknown", 5, 0)  # never routed
    assert r.tokens.models() == {}
    answer(r, "a", "y" * 800, 100, model="m")  # cached tokens not reported: still a count
    assert r.tokens.chars_per_token("m") == 8.0
    assert r.tokens._pending == {}  # every routed request was forgotten at its end


def test_a_count_told_apart_from_any_request_teaches_its_model_only() -> None:
    # A replica's /tokenize answer (gateway/_token_probe.py): no request behind it.
    r = router()
    assert not r.knows_chars_per_token("m") and not r.knows_chars_per_token(None)
    r.observe_token_count("m", 900, 100, weight=100)
    assert r.knows_chars_per_token("m") and r.chars_per_token_of("m") == 9.0
    assert not r.knows_chars_per_token("other") and r.chars_per_token_of("other") == 4.0
    learned = r.chars_per_token()["m"]
    assert (learned.told, learned.observations) == (1, 0)  # a count, not an answer
    r.observe_token_count("z", 0, 10, weight=10)  # nothing counted: nothing known
    assert not r.knows_chars_per_token("z")
    fixed = router(tokens=TokenCountConfig(learn=False))
    fixed.observe_token_count("m", 900, 100, weight=100)  # learning off: the prior stays,
    assert fixed.chars_per_token_of("m") == 4.0 and fixed.knows_chars_per_token("m")  # no ask


def test_a_told_count_weighs_as_its_weight_not_its_tokens() -> None:
    # One odd sample (1 character a token over 4,000 tokens) told at weight 256: the first
    # real answer of 400 tokens at 6 characters a token outweighs it.
    r = router()
    r.observe_token_count("m", 4000, 4000, weight=256)
    assert r.chars_per_token_of("m") == 1.0
    answer(r, "a", "y" * 2400, 400)
    assert r.chars_per_token_of("m") == 6.0


def test_a_fixed_router_keeps_the_prior() -> None:
    r = router(tokens=TokenCountConfig(learn=False))
    answer(r, "a", "y" * 600, 100)
    assert r.tokens.chars_per_token("m") == 4.0 and r.tokens.models() == {}


def test_predicted_cached_tokens_follow_the_learned_ratio() -> None:
    r = router(block_size=60)
    answer(r, "a", "q" * 600, 100)  # 6 characters a token, and now cached on r0
    d = r.route(r.view("b", text="q" * 600 + "tail", model="m"), 0.0)
    assert d.predicted_cached_tokens == 100  # 600 cached characters at 6 a token, not 150


@pytest.mark.parametrize("ratio", [0.5, 1.0, 3.0, 4.0, 5.2, 7.0])
def test_predicted_cached_tokens_never_exceed_the_prompt(ratio: float) -> None:
    """Rounding characters to tokens must not predict the whole prompt (or more) cached: the
    engine always recomputes the last token. E.g. 65 characters at 4 a token are 16 tokens,
    and the 64 cached ones round to 16 as well."""
    r = router(block_size=64)
    r.tokens.config = TokenCountConfig(chars_per_token=ratio, min_chars_per_token=0.5)
    base = "p" * 64
    r.route(r.view("warm", text=base * 8, model="m"), 0.0)
    r.complete("warm", 0.5)
    for extra in range(0, 130):
        text = (base * 8)[: 64 + extra]
        view = r.view(f"q{extra}", text=text, model="m")
        d = r.route(view, 1.0)
        r.complete(view.request_id, 1.5)
        assert d.predicted_cached_tokens <= max(0, view.prompt_tokens - 1), (extra, view)
    four = r.view("f", text=base + "p", model="m")
    if ratio == 4.0:
        assert four.prompt_tokens == 16 and r.route(four, 2.0).predicted_cached_tokens == 15
