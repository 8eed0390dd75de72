"""Per-tenant limits: token buckets for requests and prompt tokens, and an in-flight cap.

Every method takes the time as an argument (seconds, any monotonic clock), so the buckets are
plain arithmetic that tests drive with made-up times; only the gateway's middleware reads the
clock.

A bucket holds up to ``capacity`` tokens and refills at ``rate`` per second. A request that
costs more than the whole bucket (a prompt larger than a minute's token budget) is let through
once the bucket is full and leaves it in debt, which later requests wait out: the long-run rate
holds, and no request is refused forever for its size alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from prefixroute.gateway._errors import RateLimited
from prefixroute.gateway._tenant_config import TenantLimits


@dataclass(slots=True)
class TokenBucket:
    rate: float  # tokens added per second
    capacity: float  # most tokens held (the burst)
    level: float  # tokens held now; negative while in debt
    updated: float  # time of the last refill, seconds

    @classmethod
    def full(cls, rate: float, capacity: float, now: float) -> TokenBucket:
        return cls(rate, capacity, capacity, now)

    def refill(self, now: float) -> None:
        if now > self.updated:
            self.level = min(self.capacity, self.level + (now - self.updated) * self.rate)
            self.updated = now

    def wait_s(self, cost: float, now: float) -> float:
        """Seconds until ``cost`` can be taken; 0.0 when it can be now."""
        self.refill(now)
        need = min(cost, self.capacity)  # a cost above capacity waits for a full bucket
        return 0.0 if self.level >= need else (need - self.level) / self.rate

    def take(self, cost: float, now: float) -> float:
        """Take ``cost`` if it is there (0.0 returned), else take nothing and return the wait."""
        wait = self.wait_s(cost, now)
        if wait == 0.0:
            self.level -= cost
        return wait

    def is_full(self, now: float) -> bool:
        self.refill(now)
        return self.level >= self.capacity


class TenantLimiter:
    """One tenant's counters under its effective limits (``None``: that limit is off)."""

    def __init__(self, tenant: str, limits: TenantLimits, now: float) -> None:
        self.tenant = tenant
        self.in_flight = 0  # requests admitted and not finished
        self.limits = limits
        self.requests: TokenBucket | None = None
        self.prompt_tokens: TokenBucket | None = None
        self.configure(limits, now)

    def configure(self, limits: TenantLimits, now: float) -> None:
        """Apply new limits; levels carry over (capped), so changing a limit forgives nothing."""
        self.limits = limits
        rps = limits.requests_per_second
        burst = limits.burst if limits.burst is not None else max(1, math.ceil(rps or 1))
        self.requests = _rebuilt(self.requests, rps, burst, now)
        per_min = limits.prompt_tokens_per_minute
        self.prompt_tokens = _rebuilt(
            self.prompt_tokens, per_min / 60.0 if per_min else None, per_min or 0, now
        )

    def admit(self, now: float) -> None:
        """Count one request in; raises RateLimited (nothing counted) when over a limit."""
        cap = self.limits.max_in_flight
        if cap is not None and self.in_flight >= cap:
            raise RateLimited(
                f"tenant {self.tenant!r} has {self.in_flight} requests in flight, its "
                f"max_in_flight limit; retry when one finishes",
                "max_in_flight",
            )
        if self.requests is not None:
            wait = _take(self.requests, 1.0, now)
            if wait:
                raise RateLimited(
                    f"tenant {self.tenant!r} is over its requests_per_second limit "
                    f"({self.limits.requests_per_second:g}/s); retry in {wait:.2f} s",
                    "requests_per_second",
                    wait,
                )
        self.in_flight += 1

    def release(self) -> None:
        self.in_flight = max(0, self.in_flight - 1)

    def charge_prompt(self, tokens: int, now: float) -> None:
        """Take a request's (estimated) prompt tokens; raises RateLimited when over budget."""
        if self.prompt_tokens is None or tokens <= 0:
            return
        wait = _take(self.prompt_tokens, float(tokens), now)
        if wait:
            raise RateLimited(
                f"tenant {self.tenant!r} is over its prompt_tokens_per_minute limit "
                f"({self.limits.prompt_tokens_per_minute}); this prompt is about {tokens} "
                f"tokens; retry in {wait:.1f} s",
                "prompt_tokens_per_minute",
                wait,
            )

    def settle_prompt(self, charged: int, counted: int, now: float) -> None:
        """Set right a prompt charged at ``charged`` tokens (the router's estimate) that the
        replica counted as ``counted``: the difference goes back to the budget, or is taken
        from it, into debt if need be (the request was served; later ones wait it out)."""
        bucket = self.prompt_tokens
        if bucket is None:
            return
        bucket.refill(now)
        bucket.level = min(bucket.capacity, bucket.level + charged - counted)

    def idle(self, now: float) -> bool:
        """Nothing in flight and every bucket full: forgetting this limiter loses nothing."""
        return self.in_flight == 0 and all(
            b is None or b.is_full(now) for b in (self.requests, self.prompt_tokens)
        )

    def describe(self, now: float) -> dict[str, Any]:
        out: dict[str, Any] = {"limits": self.limits.as_dict(), "in_flight": self.in_flight}
        for name, bucket in (("requests", self.requests), ("prompt_tokens", self.prompt_tokens)):
            if bucket is not None:
                bucket.refill(now)
                out[f"{name}_available"] = round(bucket.level, 3)
        return out


def _rebuilt(
    old: TokenBucket | None, rate: float | None, capacity: float, now: float
) -> TokenBucket | None:
    if rate is None:
        return None
    if old is None:
        return TokenBucket.full(rate, capacity, now)
    old.refill(now)
    return TokenBucket(rate, capacity, min(old.level, capacity), now)


# The longest wait a tenant limit tells a client (message and Retry-After), seconds: a rate
# configured at 1e-300/s would otherwise send a 300-digit header. A client back after an hour
# that is still early is told again.
RETRY_AFTER_MAX_S = 3600


def _take(bucket: TokenBucket, cost: float, now: float) -> float:
    """``bucket.take``, its wait capped at ``RETRY_AFTER_MAX_S``."""
    return min(bucket.take(cost, now), RETRY_AFTER_MAX_S)
