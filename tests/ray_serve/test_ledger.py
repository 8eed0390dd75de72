"""The ledger's bookkeeping along every path Ray takes a request (no Ray objects needed)."""

from __future__ import annotations

import pytest
from heard import Heard

from prefixroute.core import ReplicaId, make_policy
from prefixroute.ray_serve import Ledger, RouterSettings, route_key

from .support import MARKS

pytestmark = MARKS

A, B = ReplicaId("a"), ReplicaId("b")
KEY = route_key([{"prompt": "x" * 4000, "max_tokens": 8}], {})  # 1,000 estimated tokens


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def ledger(rate: float | None = 10_000.0) -> tuple[Ledger, Clock]:
    clock = Clock()
    led = Ledger(RouterSettings(policy="consistent_hash").build_router(), clock, rate)
    led.sync([A, B])
    return led, clock


def blocks(led: Ledger, replica: ReplicaId) -> int:
    return led.router.indexed_blocks(replica)


def rejections_on(led: Ledger) -> None:
    """Ray runs its rejection protocol: one attempt (of another prompt) was accepted."""
    other = route_key([{"prompt": "y" * 400, "max_tokens": 8}], {})
    replica = led.route("warm", other, [A, B]).replica
    led.sent("warm", replica, accepted=True)
    assert led.completed("warm", replica)


def test_an_accepted_request_is_in_flight_until_its_completion() -> None:
    led, _ = ledger()
    replica = led.route("r1", KEY, [A, B]).replica
    assert led.in_flight(replica) == 1
    led.sent("r1", replica)
    assert not led.completed("r1", B if replica == A else A)  # another replica's notice
    assert led.in_flight(replica) == 1
    assert led.completed("r1", replica)
    assert led.in_flight(replica) == 0 and led.pending == 0
    assert not led.completed("r1", replica)  # a second notice changes nothing


def test_ray_overriding_our_choice_moves_the_load_and_the_index() -> None:
    led, _ = ledger()
    ours = led.route("r1", KEY, [A, B]).replica
    other = B if ours == A else A
    led.sent("r1", other)  # ours was full: Ray took the next rank
    assert (led.in_flight(ours), led.in_flight(other)) == (0, 1)
    view = led.router.view("probe", text="x" * 4000)
    assert led.router.index.holds(other, view.block_hashes[-1])
    assert blocks(led, ours) == 0  # it never got the prompt
    assert led.completed("r1", other) and led.in_flight(other) == 0


def test_a_rejected_attempt_is_counted_once_whatever_order_the_notices_come_in() -> None:
    led, _ = ledger()
    first = led.route("r1", KEY, [A, B]).replica
    led.sent("r1", first)
    # The replica rejects; Ray routes the request again before the rejected attempt's
    # completion notice reaches us.
    second = led.route("r1", KEY, [A, B]).replica
    assert led.in_flight(A) + led.in_flight(B) == 1
    assert not led.completed("r1", first)  # the late notice of the rejected attempt
    assert led.in_flight(A) + led.in_flight(B) == 1
    led.sent("r1", second)
    assert led.completed("r1", second)
    assert led.in_flight(A) + led.in_flight(B) == 0 and led.pending == 0


def test_a_rejection_notice_before_the_retry_releases_and_the_retry_counts_again() -> None:
    led, _ = ledger()
    first = led.route("r1", KEY, [A, B]).replica
    led.sent("r1", first)
    assert led.completed("r1", first)  # rejected, and its notice came first
    assert led.in_flight(first) == 0
    again = led.route("r1", KEY, [A, B]).replica
    assert led.in_flight(again) == 1


def test_a_request_given_up_before_it_was_sent_releases_its_load() -> None:
    led, _ = ledger()
    replica = led.route("r1", KEY, [A, B]).replica
    led.cancelled("r1")
    assert led.in_flight(replica) == 0 and led.pending == 0
    assert blocks(led, replica) == 0  # never sent: nothing computed there
    replica = led.route("r2", KEY, [A, B]).replica
    led.sent("r2", replica)
    led.cancelled("r2")  # too late: it runs, and its completion will come
    assert led.in_flight(replica) == 1


def test_the_first_token_is_predicted_from_the_queued_prefill() -> None:
    led, _ = ledger(rate=10_000.0)
    replica = led.route("r1", KEY, [A, B]).replica
    estimate = led.sent("r1", replica)
    assert estimate is not None
    assert estimate.delay_s == pytest.approx(0.1)  # 1,000 tokens at 10,000 tokens/s
    assert led.sent("r1", replica) is None  # Ray's second report of the same send
    load = led.router.loads.get(replica)
    assert load.prefilling == 1
    led.prefilled("r1", estimate.attempt)
    assert load.prefilling == 0 and load.in_flight == 1


def test_the_first_token_is_predicted_at_the_speed_a_replica_told() -> None:
    """A replica that reports its own prefill rate (``record_routing_stats``) is guessed at it,
    not at the settings' rate: 1,000 tokens at 2,000 tokens/s take 0.5 s, not 0.1 s."""
    led, _ = ledger(rate=10_000.0)
    for replica in (A, B):
        led.observe(replica, {"prefill_tokens_per_s": 2_000.0})
    replica = led.route("r1", KEY, [A, B]).replica
    estimate = led.sent("r1", replica)
    assert estimate is not None
    assert estimate.delay_s == pytest.approx(0.5, rel=0.1)


def test_a_replica_that_told_no_prefill_rate_is_guessed_at_the_settings_rate() -> None:
    """Its decode step alone: the guess is at ``prefill_tokens_per_s`` (2,000 here), not at
    the policy's prior rate (10,000), which nobody gave for it (a review)."""
    led, _ = ledger(rate=2_000.0)
    for replica in (A, B):
        led.observe(replica, {"decode_step_s": 0.02})
    replica = led.route("r1", KEY, [A, B]).replica
    estimate = led.sent("r1", replica)
    assert estimate is not None
    assert estimate.delay_s == pytest.approx(0.5)  # 1,000 tokens at 2,000 tokens/s


def test_a_guessed_first_token_waits_for_the_requests_sent_there_before_it() -> None:
    """Engines admit in arrival order: a guess due while a request sent to the same replica
    before it has no first token is not taken, and the ledger says when to ask again."""
    led, clock = ledger(rate=10_000.0)
    first = led.route("r1", KEY, [A, B]).replica
    early = led.sent("r1", first)
    led.route("r2", KEY, [A, B])
    late = led.sent("r2", first)  # consistent_hash: the same prompt goes to the same replica
    assert early is not None and late is not None
    load = led.router.loads.get(first)
    again = led.prefilled("r2", late.attempt)  # r1 still has no first token
    assert again is not None and again > 0
    assert load.prefilling == 2
    clock.now = early.delay_s
    assert led.prefilled("r1", early.attempt) is None
    assert led.prefilled("r2", late.attempt) is None
    assert load.prefilling == 0 and load.in_flight == 2


def test_a_prefill_timer_of_an_earlier_attempt_is_ignored() -> None:
    led, _ = ledger()
    replica = led.route("r1", KEY, [A, B]).replica
    estimate = led.sent("r1", replica)
    assert estimate is not None
    retry = led.route("r1", KEY, [A, B]).replica  # rejected, routed again
    led.prefilled("r1", estimate.attempt)
    assert led.router.loads.get(retry).prefilling == 1


def test_a_prefill_timer_of_an_attempt_whose_record_ended_is_ignored_by_the_retry() -> None:
    # The rejected attempt's notice came before the retry: its record ended, and the retry
    # began a new one, whose attempt the old timer named too (numbered per request).
    led, _ = ledger()
    replica = led.route("r1", KEY, [A, B]).replica
    estimate = led.sent("r1", replica)
    assert estimate is not None
    led.completed("r1", replica)  # the rejection's notice first
    retry = led.route("r1", KEY, [A, B]).replica
    assert led.sent("r1", retry) is not None
    led.prefilled("r1", estimate.attempt)  # the old attempt's timer
    assert led.router.loads.get(retry).prefilling == 1


def test_without_a_prefill_rate_there_is_no_estimate() -> None:
    led, _ = ledger(rate=None)
    replica = led.route("r1", KEY, [A, B]).replica
    assert led.sent("r1", replica) is None


def test_sync_adds_and_removes_replicas() -> None:
    led, _ = ledger()
    c = ReplicaId("c")
    led.sync([B, c])
    assert sorted(led.router.replicas) == [B, c]
    led.remove(c)
    assert led.router.replicas == [B]


def test_replica_stats_reach_the_load_view() -> None:
    led, _ = ledger()
    led.observe(A, {"num_running": 3, "num_waiting": 2, "kv_usage": 0.5, "other": "x"})
    led.observe(B, {"unrelated": 1})
    led.observe(ReplicaId("unknown"), {"num_running": 1})
    load = led.router.loads.get(A)
    assert (load.num_running, load.num_waiting, load.kv_usage) == (3, 2, 0.5)
    assert led.router.loads.get(B).num_running is None
    assert ReplicaId("unknown") not in led.router.replicas


def test_a_replica_s_own_speed_priors_from_its_routing_stats(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A deployment that knows its GPU reports its priors beside its load; the router takes
    them as if given at registration (its estimates say "given"), once: later reports, and
    reports after its speed is its own, change nothing. A replica Ray reports before the router
    has it gets them at the next poll; bad priors are logged and ignored."""
    led, _ = ledger()
    fleet = led.router.loads.speed.prefill_tokens_per_s
    c = ReplicaId("c")
    led.observe(c, {"prefill_tokens_per_s": 40_000})  # not the router's yet
    led.sync([A, B, c])
    led.observe(c, {"prefill_tokens_per_s": 40_000, "num_running": 1})
    led.observe(c, {"prefill_tokens_per_s": 5_000})  # the first report holds
    speed = led.router.loads.get(c).speed_report()
    assert (speed["prior_prefill_tokens_per_s"], speed["estimates_from"]) == (40_000.0, "given")
    assert led.router.loads.get(c).num_running == 1  # the load still read beside them
    with caplog.at_level("WARNING", logger="prefixroute.ray_serve._ledger"):
        led.observe(A, {"prefill_tokens_per_s": "fast", "decode_step_s": 0.01})
        led.observe(A, {"prefill_tokens_per_s": "fast"})
    assert len(caplog.records) == 1 and "fast" in caplog.records[0].getMessage()
    assert led.router.loads.get(A).speed_report()["prior_prefill_tokens_per_s"] == fleet
    assert led.router.loads.get(B).speed_report()["estimates_from"] != "given"


def test_a_replica_s_batch_size_from_its_routing_stats() -> None:
    """``max_running`` beside the load (its engine's batch size) is told: the router waits for
    a free slot there once the batch is full, and the speeds are still the fleet's to learn."""
    led, _ = ledger()
    led.observe(A, {"max_running": 16, "num_running": 3})
    load = led.router.loads.get(A)
    assert load.slots.size == 16 and load.speed_report()["estimates_from"] != "given"
    assert led.router.loads.get(B).slots.size is None


def test_settings_are_the_gateway_defaults_and_reject_unknown_keys() -> None:
    from prefixroute.core import ConfigError, UnknownPolicy

    settings = RouterSettings.from_kwargs({})
    assert settings.policy == "predicted_ttft"
    assert settings.block_chars == 64
    assert type(settings.build_router().policy) is type(make_policy("predicted_ttft"))
    with pytest.raises(ConfigError, match="unknown request_router_kwargs block_size; valid"):
        RouterSettings.from_kwargs({"block_size": 16})
    with pytest.raises(UnknownPolicy, match="valid"):
        RouterSettings.from_kwargs({"policy": "nope"})
    with pytest.raises(ConfigError, match="no parameter"):
        RouterSettings.from_kwargs({"policy": "prefix_affinity", "policy_params": {"x": 1}})
    for rate in (0, float("nan"), float("inf")):  # NaN passed "<= 0": guesses due at NaN s
        with pytest.raises(ConfigError, match="positive finite"):
            RouterSettings.from_kwargs({"prefill_tokens_per_s": rate})


@pytest.mark.parametrize("order", ["notice_first", "retry_first"])
def test_a_rejected_attempt_leaves_nothing_in_the_index_of_the_replica_that_rejected(
    order: str,
) -> None:
    led, _ = ledger()
    rejections_on(led)
    heard = led.listener = Heard()
    before = {r: blocks(led, r) for r in (A, B)}
    first = led.route("r1", KEY, [A, B]).replica
    other = B if first == A else A
    assert blocks(led, first) > before[first]
    led.sent("r1", first)  # Ray's future: sent there; no acceptance follows
    if order == "notice_first":
        assert led.completed("r1", first)  # the rejected attempt's notice
        assert blocks(led, first) == before[first]
        led.route("r1", KEY, [other])
    else:
        led.route("r1", KEY, [other])  # the retry, before the notice
        assert blocks(led, first) == before[first]
        assert not led.completed("r1", first)
    assert blocks(led, other) > before[other]
    led.sent("r1", other, accepted=True)
    assert led.completed("r1", other)
    assert blocks(led, other) > before[other]  # served: it stays
    assert ("withdrawn", "r1") in heard.heard  # the Redis sync hears it too


def test_an_accepted_attempt_keeps_its_blocks_and_so_does_any_without_the_protocol() -> None:
    led, _ = ledger()
    replica = led.route("r1", KEY, [A, B]).replica
    led.sent("r1", replica)
    assert led.completed("r1", replica)  # Ray sends without rejections here: no acceptances
    assert blocks(led, replica) > 0
    led, _ = ledger()
    rejections_on(led)
    replica = led.route("r1", KEY, [A, B]).replica
    led.sent("r1", replica)
    led.sent("r1", replica, accepted=True)  # the future first, then on_request_routed
    assert led.completed("r1", replica)
    view = led.router.view("probe", text="x" * 4000)
    assert led.router.index.holds(replica, view.block_hashes[-1])
