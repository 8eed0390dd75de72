"""The tenant limiter at its edges (docs/security.md "Limits" and "Admin API for tenants";
docs/mutation.md): the 429 messages, 1-token prompts, when a limiter may be forgotten, and what
``GET /admin/tenants/{name}`` reports ("limits, in flight, bucket levels")."""

from __future__ import annotations

import pytest

from prefixroute.gateway._errors import RateLimited
from prefixroute.gateway._ratelimit import TenantLimiter
from prefixroute.gateway._tenant_config import TenantLimits


@pytest.mark.parametrize(
    ("limits", "charge", "message"),
    [
        # docs/security.md: "tenant 'team-a' is over its requests_per_second limit (5/s);
        # retry in 0.20 s"
        (
            TenantLimits(requests_per_second=5, burst=1),
            None,
            "tenant 'team-a' is over its requests_per_second limit (5/s); retry in 0.20 s",
        ),
        (
            TenantLimits(max_in_flight=1),
            None,
            "tenant 'team-a' has 1 requests in flight, its max_in_flight limit; retry when one "
            "finishes",
        ),
        (
            TenantLimits(prompt_tokens_per_minute=600),
            (500, 200),
            "tenant 'team-a' is over its prompt_tokens_per_minute limit (600); this prompt is "
            "about 200 tokens; retry in 10.0 s",
        ),
    ],
    ids=["requests_per_second", "max_in_flight", "prompt_tokens_per_minute"],
)
def test_the_429_messages_name_the_tenant_the_limit_and_the_wait(
    limits: TenantLimits, charge: tuple[int, int] | None, message: str
) -> None:
    """One request (or prompt, ``charge[0]`` tokens) is let through; the next is refused."""
    lim = TenantLimiter("team-a", limits, 0.0)
    if charge is None:
        lim.admit(0.0)
        with pytest.raises(RateLimited) as refused:
            lim.admit(0.0)
    else:
        lim.charge_prompt(charge[0], 0.0)
        with pytest.raises(RateLimited) as refused:
            lim.charge_prompt(charge[1], 0.0)
    assert str(refused.value) == message


def test_a_one_token_prompt_is_charged() -> None:
    lim = TenantLimiter("t", TenantLimits(prompt_tokens_per_minute=60), 0.0)  # 1 token/s
    lim.charge_prompt(60, 0.0)
    with pytest.raises(RateLimited):
        lim.charge_prompt(1, 0.0)
    lim.charge_prompt(1, 1.0)


def test_a_limiter_is_idle_once_nothing_is_in_flight_and_its_buckets_are_full_again() -> None:
    lim = TenantLimiter(
        "t", TenantLimits(requests_per_second=2, burst=2, prompt_tokens_per_minute=120), 0.0
    )
    assert lim.idle(0.0)
    lim.admit(0.0)
    lim.charge_prompt(60, 0.0)
    assert not lim.idle(0.0)  # in flight
    lim.release()
    assert not lim.idle(0.0)  # buckets not full: forgetting it would forgive the requests
    assert not lim.idle(0.49)  # the request bucket is full at 0.5 s, the token one at 30 s
    assert not lim.idle(29.9)
    assert lim.idle(30.0)  # exactly full counts as full


def test_describe_reports_limits_in_flight_and_bucket_levels_now() -> None:
    limits = TenantLimits(requests_per_second=2, burst=4, prompt_tokens_per_minute=600)
    lim = TenantLimiter("t", limits, 0.0)
    lim.admit(0.0)
    lim.admit(0.0)
    lim.charge_prompt(300, 0.0)
    assert lim.describe(0.5) == {
        "limits": limits.as_dict(),
        "in_flight": 2,
        "requests_available": 3.0,  # 4 - 2, plus 0.5 s at 2/s
        "prompt_tokens_available": 305.0,  # 600 - 300, plus 0.5 s at 10/s
    }
    assert lim.describe(0.5001)["requests_available"] == 3.0  # rounded to 3 decimals
    assert lim.describe(0.5004)["requests_available"] == 3.001


def test_reconfiguring_keeps_the_new_rate_and_a_token_budget() -> None:
    lim = TenantLimiter(
        "t", TenantLimits(requests_per_second=1, burst=1, prompt_tokens_per_minute=60), 0.0
    )
    lim.configure(TenantLimits(requests_per_second=4, burst=1, prompt_tokens_per_minute=60), 0.0)
    lim.admit(0.0)
    lim.release()
    with pytest.raises(RateLimited):
        lim.admit(0.1)
    lim.admit(0.25)  # refilled at the new rate, 4/s
    lim.charge_prompt(60, 0.0)  # the token bucket carried over, full
    with pytest.raises(RateLimited):
        lim.charge_prompt(1, 0.0)


def test_reconfiguring_carries_the_token_bucket_level_over() -> None:
    # docs/security.md: "bucket levels carry over, capped by the new sizes" (nothing forgiven).
    lim = TenantLimiter("t", TenantLimits(prompt_tokens_per_minute=60), 0.0)
    lim.charge_prompt(60, 0.0)
    lim.configure(TenantLimits(prompt_tokens_per_minute=120), 0.0)
    with pytest.raises(RateLimited):
        lim.charge_prompt(1, 0.0)
