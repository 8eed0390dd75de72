"""Several Ray Serve routers, one view: ``sync_redis`` in ``request_router_kwargs`` (no cluster:
fake replicas, the hooks called in Ray's order, and a real ``redis-server``).

Without ``redis-server`` these skip, unless ``PREFIXROUTE_REDIS_REQUIRED=1``: then they fail.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from gateway.redis_server import RedisServer
from polling import until

from prefixroute.core import ConfigError, ReplicaId
from prefixroute.ray_serve import PrefixRouteRequestRouter
from prefixroute.ray_serve._router import OWN_ID

from .fakes import FakeReplica, chat, make_router, pending, send, settle
from .support import MARKS

pytestmark = MARKS

Routers = Callable[..., Any]


@pytest.fixture
async def routers(redis_server: RedisServer) -> AsyncIterator[Routers]:
    """Routers of one deployment, as two handles build them, joined to one Redis."""
    made: list[PrefixRouteRequestRouter] = []

    async def make(n: int, pool: list[FakeReplica], **kwargs: Any) -> list[Any]:
        for _ in range(n):
            router = make_router(sync_redis=redis_server.url, **kwargs)
            router.update_replicas(pool)
            await router.choose_replicas(pool, None)  # Ray's first call: the sync starts
            made.append(router)
        await until(lambda: all(r.sync.connected for r in made))
        return made[-n:]

    yield make
    for router in made:
        await router.sync.stop()


def applied(router: Any) -> float:
    metrics = router.sync.route_sync.metrics
    return float(metrics.applied._value.get())


def in_flight(router: Any, replica: FakeReplica) -> int:
    return int(router.ledger.in_flight(ReplicaId(replica.name)))


async def test_turns_alternating_between_two_routers_stay_on_one_replica(
    routers: Routers,
) -> None:
    pool = [FakeReplica(f"r{i}") for i in range(4)]
    a, b = await routers(2, pool)
    turns: list[str] = []
    served = []
    for turn in range(4):
        turns += [f"question {turn} " * 40] if turn == 0 else [f"answer {turn}", f"q{turn} " * 40]
        router = (a, b)[turn % 2]
        other = (a, b)[(turn + 1) % 2]
        before = applied(other)
        pr, chosen = await send(router, pool, chat(*turns))
        served.append(chosen.name)
        await until(lambda other=other, before=before: applied(other) > before)
        router.on_request_completed(chosen.replica_id, pr.metadata.internal_request_id)
        await until(lambda other=other, chosen=chosen: in_flight(other, chosen) == 0)
    assert len(set(served)) == 1, served
    assert applied(a) == applied(b) == 2


async def test_a_decision_at_one_router_is_load_at_the_other_until_it_ends(
    routers: Routers,
) -> None:
    pool = [FakeReplica(f"r{i}") for i in range(3)]
    a, b = await routers(2, pool)
    pr, chosen = await send(a, pool, chat("long question " * 100))
    await until(lambda: in_flight(b, chosen) == 1)
    assert sum(in_flight(b, r) for r in pool) == 1
    # Ray may report the end from another thread than its router loop's: the sync (whose
    # queue only its loop may touch) still hears it on its loop, and it reaches the other.
    threads: list[int] = []
    publish = a.sync.route_sync.completed

    def completed(request_id: str) -> None:
        threads.append(threading.get_ident())
        publish(request_id)

    a.sync.route_sync.completed = completed
    done = await asyncio.to_thread(
        a.ledger.completed, getattr(pr, OWN_ID), ReplicaId(chosen.name)
    )
    assert done
    await until(lambda: in_flight(b, chosen) == 0)
    assert threads == [threading.get_ident()]  # this test's thread runs the routers' loop
    assert in_flight(a, chosen) == 0


async def test_a_ray_override_moves_the_load_at_the_other_router(routers: Routers) -> None:
    pool = [FakeReplica(f"r{i}") for i in range(2)]
    a, b = await routers(2, pool)
    pr = pending(chat("q " * 100))
    ranks = await a.choose_replicas(pool, pr)
    ours, fallback = ranks[0][0], ranks[1][0]
    await until(lambda: in_flight(b, ours) == 1)
    pr.future.set_result(fallback)  # ours was full: Ray sent it to the next rank
    await settle()
    await until(lambda: in_flight(b, fallback) == 1 and in_flight(b, ours) == 0)


def test_sync_settings_are_checked() -> None:
    from prefixroute.ray_serve import RouterSettings

    assert RouterSettings().sync_redis is None
    bads = ({"sync_redis": "http://x"}, {"sync_redis": "redis://h:notaport/0"},
            {"sync_channel": ""}, {"sync_history": -1})  # fmt: skip
    for bad in bads:
        with pytest.raises(ConfigError, match="sync_"):
            RouterSettings.from_kwargs(bad)
    assert make_router().sync is None
    router = make_router(sync_redis="redis://127.0.0.1:1/0")  # not started: no connection yet
    assert router.sync is not None and not router.sync.started
    # the others' decisions are applied holding the lock every ledger hook holds
    assert router.sync.route_sync.remote.lock is router.ledger.lock
