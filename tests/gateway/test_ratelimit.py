"""Token buckets and the per-tenant limiter, driven with made-up times (no clock, no sleep)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixroute.gateway._errors import RateLimited
from prefixroute.gateway._ratelimit import TenantLimiter, TokenBucket
from prefixroute.gateway._tenant_config import TenantLimits


def test_bucket_refills_at_its_rate_up_to_its_capacity() -> None:
    b = TokenBucket.full(rate=2.0, capacity=4.0, now=0.0)
    assert [b.take(1.0, 0.0) for _ in range(4)] == [0.0] * 4
    assert b.take(1.0, 0.0) == pytest.approx(0.5)  # one token needs half a second
    assert b.level == pytest.approx(0.0)  # a refused take takes nothing
    assert b.take(1.0, 0.5) == 0.0
    b.refill(100.0)
    assert b.level == 4.0  # never above capacity


def test_a_cost_above_capacity_waits_for_a_full_bucket_then_leaves_debt() -> None:
    b = TokenBucket.full(rate=10.0, capacity=100.0, now=0.0)
    assert b.take(30.0, 0.0) == 0.0
    assert b.take(250.0, 0.0) == pytest.approx(3.0)  # 70 left: 30 more needed, at 10/s
    assert b.take(250.0, 3.0) == 0.0  # full: admitted
    assert b.level == pytest.approx(-150.0)
    assert b.take(1.0, 3.0) == pytest.approx(15.1)  # the debt is paid back first


@settings(max_examples=200, deadline=None)
@given(
    rate=st.floats(0.5, 50.0),
    capacity=st.integers(1, 20),
    gaps=st.lists(st.floats(0.0, 2.0), min_size=1, max_size=60),
)
def test_admitted_requests_never_exceed_burst_plus_rate_times_time(
    rate: float, capacity: int, gaps: list[float]
) -> None:
    b = TokenBucket.full(rate, float(capacity), 0.0)
    now, admitted = 0.0, 0
    for gap in gaps:
        now += gap
        if b.take(1.0, now) == 0.0:
            admitted += 1
        assert admitted <= capacity + rate * now + 1e-6


def test_limiter_names_each_limit_and_releases_in_flight() -> None:
    lim = TenantLimiter("a", TenantLimits(requests_per_second=1, burst=2, max_in_flight=2), 0.0)
    lim.admit(0.0)
    lim.admit(0.0)
    with pytest.raises(RateLimited) as exc:
        lim.admit(0.0)
    assert exc.value.limit == "max_in_flight" and exc.value.retry_after_s is None
    lim.release()
    with pytest.raises(RateLimited) as exc:
        lim.admit(0.0)
    assert exc.value.limit == "requests_per_second" and exc.value.retry_after_s == 1
    assert lim.in_flight == 1  # refused requests are not counted
    lim.admit(1.0)
    assert lim.in_flight == 2


def test_prompt_token_budget_per_minute() -> None:
    lim = TenantLimiter("a", TenantLimits(prompt_tokens_per_minute=600), 0.0)
    lim.charge_prompt(500, 0.0)
    with pytest.raises(RateLimited) as exc:
        lim.charge_prompt(200, 0.0)
    assert exc.value.limit == "prompt_tokens_per_minute"
    assert exc.value.retry_after_s == 10  # 100 tokens missing at 10 tokens/s
    lim.charge_prompt(200, 10.0)


def test_a_tiny_rate_asks_for_at_most_an_hour() -> None:
    """Retry-After is a count of seconds a client can act on: a rate configured near zero
    says an hour (and again then), not a 300-digit number."""
    lim = TenantLimiter("a", TenantLimits(requests_per_second=1e-300, burst=1), 0.0)
    lim.admit(0.0)
    with pytest.raises(RateLimited) as exc:
        lim.admit(0.0)
    assert exc.value.retry_after_s == 3600
    assert "retry in 3600.00 s" in str(exc.value)  # the message says what the header says
    lim = TenantLimiter("b", TenantLimits(prompt_tokens_per_minute=1), 0.0)
    lim.charge_prompt(10**9, 0.0)  # a full bucket takes it, leaving a debt of 1e9 minutes
    with pytest.raises(RateLimited) as exc:
        lim.charge_prompt(1, 0.0)
    assert exc.value.retry_after_s == 3600
    assert "retry in 3600.0 s" in str(exc.value)


def test_no_limits_means_no_buckets() -> None:
    lim = TenantLimiter("a", TenantLimits(), 0.0)
    for _ in range(1000):
        lim.admit(0.0)
        lim.charge_prompt(10**9, 0.0)
    assert lim.requests is None and lim.prompt_tokens is None and lim.idle(0.0) is False
    for _ in range(1000):
        lim.release()
    assert lim.idle(0.0)


def test_reconfigure_keeps_levels_and_in_flight() -> None:
    lim = TenantLimiter("a", TenantLimits(requests_per_second=10, burst=10), 0.0)
    for _ in range(8):
        lim.admit(0.0)
    lim.configure(TenantLimits(requests_per_second=1, burst=5), 0.0)
    assert lim.in_flight == 8
    assert lim.requests is not None and lim.requests.level == pytest.approx(2.0)
    lim.configure(TenantLimits(), 0.0)
    assert lim.requests is None
    assert lim.describe(0.0)["limits"]["requests_per_second"] is None


def test_a_prompt_charged_on_an_estimate_is_set_right_by_the_replicas_count() -> None:
    """The budget is charged on the router's estimate before routing; the replica's own count
    then gives back what was over-charged (never above the bucket's capacity) or takes what
    was under-charged (into debt: the request was served)."""
    lim = TenantLimiter("t", TenantLimits(prompt_tokens_per_minute=600), now=0.0)  # 10/s
    assert lim.prompt_tokens is not None
    lim.charge_prompt(500, 0.0)
    lim.settle_prompt(500, 50, 0.0)  # the replica counted 50: 450 back
    assert lim.prompt_tokens.level == pytest.approx(550.0)
    lim.settle_prompt(100, 0, 0.0)  # more back than was ever taken: the bucket stays full
    assert lim.prompt_tokens.level == pytest.approx(600.0)
    lim.charge_prompt(100, 0.0)
    lim.settle_prompt(100, 1_300, 0.0)  # counted 1,300: 1,200 more, into debt
    assert lim.prompt_tokens.level == pytest.approx(-700.0)
    lim.settle_prompt(0, 0, 10.0)  # refilled to the time of the count first: 10 s at 10/s
    assert lim.prompt_tokens.level == pytest.approx(-600.0)
    with pytest.raises(RateLimited):
        lim.charge_prompt(1, 10.0)
    TenantLimiter("u", TenantLimits(), now=0.0).settle_prompt(5, 9, 0.0)  # no budget: nothing
