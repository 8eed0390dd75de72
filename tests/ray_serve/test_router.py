"""The RequestRouter subclass, its hooks called in the order Ray calls them."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from prefixroute.core import ReplicaId
from prefixroute.ray_serve import UnroutableRequest

from .fakes import FakeReplica, chat, make_router, pending, send, settle
from .support import MARKS

pytestmark = MARKS


def replicas(n: int) -> list[Any]:
    return [FakeReplica(f"r{i}") for i in range(n)]


async def test_our_choice_first_then_everyone_else() -> None:
    router = make_router()
    pool = replicas(3)
    router.update_replicas(pool)
    ranks = await router.choose_replicas(pool, pending(chat("hello")))
    assert len(ranks) == 2 and len(ranks[0]) == 1
    assert sorted(r.name for r in ranks[0] + ranks[1]) == ["r0", "r1", "r2"]


async def test_a_conversation_stays_on_the_replica_that_holds_it() -> None:
    router = make_router()
    pool = replicas(4)
    router.update_replicas(pool)
    turns = ["first question " * 30, "an answer " * 10, "second question " * 30]
    pr, home = await send(router, pool, chat(turns[0]))
    router.on_request_completed(home.replica_id, pr.metadata.internal_request_id)
    pr, chosen = await send(router, pool, chat(*turns))
    assert chosen is home
    assert router.ledger.in_flight(ReplicaId(home.name)) == 1


async def test_completion_releases_the_load_and_cancellation_too() -> None:
    router = make_router()
    pool = replicas(2)
    router.update_replicas(pool)
    pr, chosen = await send(router, pool, chat("q " * 100))
    name = ReplicaId(chosen.name)
    assert router.ledger.in_flight(name) == 1
    router.on_request_completed(chosen.replica_id, pr.metadata.internal_request_id)
    assert router.ledger.in_flight(name) == 0

    given_up = pending(chat("another " * 100))
    ranks = await router.choose_replicas(pool, given_up)
    assert router.ledger.in_flight(ReplicaId(ranks[0][0].name)) == 1
    given_up.future.cancel()
    await settle()
    assert router.ledger.in_flight(ReplicaId(ranks[0][0].name)) == 0
    assert router.ledger.pending == 0


async def test_a_replica_ray_picks_instead_of_ours_carries_the_load() -> None:
    router = make_router()
    pool = replicas(2)
    router.update_replicas(pool)
    pr = pending(chat("q " * 100))
    ranks = await router.choose_replicas(pool, pr)
    fallback = ranks[1][0]  # ours was at max_ongoing_requests
    pr.future.set_result(fallback)
    await settle()
    assert router.ledger.in_flight(ReplicaId(fallback.name)) == 1
    assert router.ledger.in_flight(ReplicaId(ranks[0][0].name)) == 0
    router.on_request_completed(fallback.replica_id, pr.metadata.internal_request_id)
    assert router.ledger.in_flight(ReplicaId(fallback.name)) == 0


async def test_a_replica_that_rejected_the_request_is_not_left_holding_its_prompt() -> None:
    """Ray's rejection protocol (``Router._route_and_send_request_once``): an accepted attempt
    gets ``on_request_routed``; a rejected one is cancelled, its completion notice fires, and
    the same pending request, with a fresh future, is routed again."""
    router = make_router()
    pool = replicas(2)
    router.update_replicas(pool)
    index = router.ledger.router
    pr, home = await send(router, pool, chat("warm " * 100))  # accepted: the protocol is on
    router.on_request_completed(home.replica_id, pr.metadata.internal_request_id)
    before = {r.name: index.indexed_blocks(ReplicaId(r.name)) for r in pool}
    pr = pending(chat("q " * 200))
    first = (await router.choose_replicas(pool, pr))[0][0]
    pr.future.set_result(first)
    await settle()
    router.on_request_completed(first.replica_id, pr.metadata.internal_request_id)  # rejected
    assert index.indexed_blocks(ReplicaId(first.name)) == before[first.name]
    pr.reset_future()
    other = next(r for r in pool if r is not first)
    await router.choose_replicas([other], pr)
    pr.future.set_result(other)
    router.on_request_routed(pr, other.replica_id, None)
    await settle()
    router.on_request_completed(other.replica_id, pr.metadata.internal_request_id)
    assert index.indexed_blocks(ReplicaId(other.name)) > before[other.name]
    assert index.indexed_blocks(ReplicaId(first.name)) == before[first.name]


async def test_the_predicted_first_token_clears_prefilling() -> None:
    router = make_router(prefill_tokens_per_s=1e9)  # due at once
    pool = replicas(2)
    router.update_replicas(pool)
    pr, chosen = await send(router, pool, chat("q " * 100))
    load = router.ledger.router.loads.get(ReplicaId(chosen.name))
    for _ in range(50):  # call_later(~0 s): a few loop turns
        if load.prefilling == 0:
            break
        await settle()
    assert load.prefilling == 0 and load.in_flight == 1


async def test_a_request_without_prompt_or_messages_fails_its_caller() -> None:
    router = make_router()
    pool = replicas(2)
    router.update_replicas(pool)
    pr = pending({"no": "prompt"}, 42)
    ranks = await router.choose_replicas(pool, pr)
    assert ranks and ranks[0]  # non-empty: Ray then sees the finished future and stops
    assert pr.future.done()
    with pytest.raises(UnroutableRequest, match="'messages' or 'prompt'"):
        pr.future.result()
    assert router.ledger.pending == 0


async def test_replica_set_follows_updates_and_deaths() -> None:
    router = make_router()
    pool = replicas(3)
    router.update_replicas(pool)
    assert sorted(router.ledger.router.replicas) == ["r0", "r1", "r2"]
    router.update_replicas([*pool[1:], FakeReplica("r3")])  # scaled: r0 gone, r3 new
    assert sorted(router.ledger.router.replicas) == ["r1", "r2", "r3"]
    router.on_replica_actor_died(pool[1].replica_id)
    assert sorted(router.ledger.router.replicas) == ["r2", "r3"]
    assert "r1" not in {r.unique_id for r in router.curr_replicas}


async def test_replica_routing_stats_reach_the_load_view() -> None:
    router = make_router(policy="weighted_scorer")
    pool = replicas(2)
    pool[0].routing_stats = {"num_waiting": 7, "kv_usage": 0.9}
    router.update_replicas(pool)
    await router.choose_replicas(pool, pending(chat("q")))
    load = router.ledger.router.loads.get(ReplicaId("r0"))
    assert (load.num_waiting, load.kv_usage) == (7, 0.9)


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [({"polcy": "predicted_ttft"}, "valid: "), ({"policy": "no_such_policy"}, "no_such_policy"),
     ({"block_chars": 0}, "block"), ({"policy_params": {"bogus": 1}}, "bogus")],
)  # fmt: skip
async def test_bad_kwargs_fail_every_call_with_the_reason(
    kwargs: dict[str, Any], said: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Ray calls ``initialize_state`` from its long-poll callback, which only logs what it
    raises: the router was never built and every call waited for ever (an outside audit,
    2026-12-07). Now each call fails at once with the reason, logged once at error level."""
    from prefixroute.core import ConfigError

    router = make_router(**kwargs)
    assert [r.levelname for r in caplog.records if "refused" in r.getMessage()] == ["ERROR"]
    pool = replicas(2)
    router.update_replicas(pool)
    for _ in range(2):
        pr = pending(chat("hello"))
        await router.choose_replicas(pool, pr)
        assert isinstance(pr.future.exception(), ConfigError)
        assert said in str(pr.future.exception())
    assert router.ledger.pending == 0


async def test_a_failure_of_ours_fails_the_request_instead_of_hanging_it() -> None:
    router = make_router()
    pool = replicas(2)
    router.update_replicas(pool)

    def broken(*args: Any) -> Any:
        raise RuntimeError("a bug")

    router.ledger.route = broken
    pr = pending(chat("q"))
    assert await router.choose_replicas(pool, pr)
    with pytest.raises(RuntimeError, match="a bug"):
        pr.future.result()


async def test_one_poll_of_stats_is_read_once_however_many_requests_see_it() -> None:
    # Ray hands out the same stats object until its next poll: read per request, one poll of
    # a full batch (3 running, 1 waiting) taught a batch size of 3 after 8 requests.
    router = make_router()
    pool = replicas(2)
    router.update_replicas(pool)
    pool[0].routing_stats = {"num_running": 3, "num_waiting": 1}
    for i in range(10):
        await router.choose_replicas(pool, pending(chat(f"q{i}")))
    slots = router.ledger.router.loads.get(ReplicaId("r0")).slots
    assert slots.size is None  # one report: nothing learned yet
    for i in range(10):  # ten polls saying the same
        pool[0].routing_stats = {"num_running": 3, "num_waiting": 1}
        await router.choose_replicas(pool, pending(chat(f"p{i}")))
    assert slots.size == 3


async def test_stats_that_are_no_numbers_fail_no_request() -> None:
    # round() of a NaN or an infinity raised inside the ranking: every request of the handle
    # failed until the next poll. They are no reading, as on a metrics page.
    router = make_router(policy="weighted_scorer")
    pool = replicas(2)
    router.update_replicas(pool)
    pool[0].routing_stats = {"num_running": float("nan"), "num_waiting": math.inf, "kv_usage": -1}
    pr = pending(chat("q"))
    ranks = await router.choose_replicas(pool, pr)
    assert not pr.future.done() and ranks[0]
    load = router.ledger.router.loads.get(ReplicaId("r0"))
    assert (load.num_waiting, load.kv_usage) == (None, None)


async def test_a_request_cancelled_meanwhile_is_not_routed_again() -> None:
    router = make_router()
    pool = replicas(2)
    router.update_replicas(pool)
    pr = pending(chat("q"))
    pr.future.cancel()  # the caller gave up while Ray's backoff loop still asks
    await router.choose_replicas(pool, pr)
    assert all(router.ledger.router.loads.get(ReplicaId(r.name)).in_flight == 0 for r in pool)


def same_id(request: Any, like: Any) -> Any:
    """A pending request under ``like``'s internal request id: a second handle call made while
    serving one request (Ray's handle calls inherit it; module docstring of ray_serve/_router)."""
    pr = pending(request)
    pr.metadata = like.metadata
    return pr


async def test_calls_fanned_out_under_one_request_id_are_all_routed() -> None:
    """An ingress that gathers several calls: Ray's base router gave every replica found to
    the first pending request under the shared id, and the others waited for ever while their
    routing tasks spun (an outside audit, 2026-12-07). Driven through Ray's own routing
    tasks (``_choose_replica_for_request``)."""
    router = make_router()
    pool = replicas(3)
    router.update_replicas(pool)
    first = pending(chat("question zero " * 40))
    calls = [first] + [same_id(chat(f"question {i} " * 40), first) for i in (1, 2, 3)]
    chosen = await asyncio.wait_for(
        asyncio.gather(*(router._choose_replica_for_request(pr) for pr in calls)), timeout=10
    )
    assert all(c in pool for c in chosen)
    for pr, c in zip(calls, chosen, strict=True):
        assert pr.future.done() and pr.future.result() is c
    await settle()
    assert router.ledger.pending == 4  # four requests, each its own in the ledger


async def test_a_second_call_under_one_request_id_is_routed_on_its_own_prompt() -> None:
    """Before, an open record under the same internal id was taken for a retry: the second
    call was routed on the first one's prompt, and the first's completion notice ended it."""
    router = make_router()
    pool = replicas(4)
    router.update_replicas(pool)
    other, system = "another conversation entirely, " * 30, "Another assistant. " * 30
    pr, other_home = await send(router, pool, chat(other, system=system))
    router.on_request_completed(other_home.replica_id, pr.metadata.internal_request_id)
    first = pending(chat("the first call's conversation " * 30))
    await router.choose_replicas(pool, first)
    home = next(r for r in pool if r is not other_home)  # Ray sent it elsewhere: it may
    first.future.set_result(home)
    router.on_request_routed(first, home.replica_id, None)
    await settle()
    second = same_id(chat(other, "an answer", "and a follow-up", system=system), first)
    ranks = await router.choose_replicas(pool, second)
    assert ranks[0][0] is other_home  # its own prompt's prefix, not the first call's
    second.future.set_result(other_home)
    router.on_request_routed(second, other_home.replica_id, None)
    await settle()
    in_flight = router.ledger.in_flight
    assert (in_flight(ReplicaId(home.name)), in_flight(ReplicaId(other_home.name))) == (1, 1)
    # The notice names the shared id and a replica: it ends the call sent there.
    router.on_request_completed(home.replica_id, first.metadata.internal_request_id)
    assert (in_flight(ReplicaId(home.name)), in_flight(ReplicaId(other_home.name))) == (0, 1)
    router.on_request_completed(other_home.replica_id, first.metadata.internal_request_id)
    assert in_flight(ReplicaId(other_home.name)) == 0 and router.ledger.pending == 0
