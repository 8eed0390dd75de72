"""Several approximate-mode instances sharing their decisions through a real Redis.

Three gateways front the same emulated replicas; a conversation's turns go to them in turn, as a
round-robin balancer would send them. Each gateway has its own seed, so without sharing the
second turn reaches an instance that knows nothing of the first (it predicts no cached tokens).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import msgspec
import pytest
from polling import until

from prefixroute.core import BlockHash, ConfigError, ReplicaId
from prefixroute.gateway import Gateway, GatewayConfig

from .helpers import STEADY, ClusterFactory, FakeFactory, GatewayFactory, Reply, question, send
from .redis_server import RedisServer
from .test_precise import metric, metrics, unset

TURNS = 4


async def gauge(session: aiohttp.ClientSession, gw: Gateway, name: str) -> float:
    return metric(await metrics(session, gw.url), name)


async def fleet(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, redis_url: str | None
) -> list[Gateway]:
    cluster = await make_cluster(3)
    urls = [r.url for r in cluster.replicas]
    return [await make_gateway(urls, seed=i, sync_redis=redis_url, **STEADY) for i in range(3)]


async def all_connected(session: aiohttp.ClientSession, gws: list[Gateway], up: bool) -> None:
    async def check() -> bool:
        values = [await gauge(session, gw, "prefixroute_sync_connected") for gw in gws]
        return all(v == (1.0 if up else 0.0) for v in values)

    await until(check)


@pytest.fixture
async def synced(
    make_cluster: ClusterFactory,
    make_gateway: GatewayFactory,
    session: aiohttp.ClientSession,
    redis_server: RedisServer,
) -> list[Gateway]:
    """Three instances over three replicas, connected to one live Redis."""
    gws = await fleet(make_cluster, make_gateway, redis_server.url)
    await all_connected(session, gws, up=True)
    return gws


async def conversation(
    session: aiohttp.ClientSession, gws: list[Gateway], name: str, shared: bool
) -> list[Reply]:
    """``TURNS`` turns, turn i at instance i % 3; with ``shared``, each turn waits until the
    other instances applied the previous decision and heard that it ended (in production: the
    user's think time). Without the end, an instance may still count the previous turn in
    flight on its replica and, rightly, send the next turn to an idle one."""
    messages: list[dict[str, str]] = []
    replies: list[Reply] = []
    for turn in range(TURNS):
        messages.append(question(name, turn))
        gw = gws[turn % len(gws)]
        others = [g for g in gws if g is not gw]
        before = (
            [await gauge(session, g, "prefixroute_sync_applied_total") for g in others]
            if shared
            else []
        )
        body = {"model": "emulated", "messages": messages, "max_tokens": 4}
        reply = await send(session, gw.url, "/v1/chat/completions", body)
        assert reply.complete, reply
        replies.append(reply)
        messages.append({"role": "assistant", "content": reply.text})
        if shared:

            async def applied(gs: list[Gateway] = others, before: list[float] = before) -> bool:
                now = [await gauge(session, g, "prefixroute_sync_applied_total") for g in gs]
                left = [await gauge(session, g, "prefixroute_sync_remote_in_flight") for g in gs]
                return all(n > b for n, b in zip(now, before, strict=True)) and not any(left)

            await until(applied)
    return replies


def predicted(replies: list[Reply]) -> list[int]:
    return [int(r.headers["x-prefixroute-predicted-cached-tokens"]) for r in replies]


def replicas(replies: list[Reply]) -> set[str]:
    return {r.headers["x-prefixroute-replica"] for r in replies}


async def test_turns_at_three_instances_land_on_one_replica_with_sharing(
    session: aiohttp.ClientSession, synced: list[Gateway]
) -> None:
    gws = synced
    replies = await conversation(session, gws, "a", shared=True)
    assert len(replicas(replies)) == 1
    assert predicted(replies)[0] == 0 and all(p > 0 for p in predicted(replies)[1:])
    cached = [r.usage["prompt_tokens_details"]["cached_tokens"] for r in replies if r.usage]
    assert cached[0] == 0 and all(c > 0 for c in cached[1:])
    text = await metrics(session, gws[0].url)
    assert metric(text, "prefixroute_sync_published_total") >= 2  # turns 1 and 4
    assert unset(text, "prefixroute_sync_errors")  # no error of any kind


async def test_without_sharing_the_next_instance_knows_nothing(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    gws = await fleet(make_cluster, make_gateway, None)
    replies = await conversation(session, gws, "b", shared=False)
    assert predicted(replies)[:3] == [0, 0, 0]  # each instance sees the conversation first


async def test_redis_down_means_local_only_and_sharing_resumes_after_restart(
    session: aiohttp.ClientSession, redis_server: RedisServer, synced: list[Gateway]
) -> None:
    gws = synced
    await conversation(session, gws, "c", shared=True)
    redis_server.stop()
    await all_connected(session, gws, up=False)
    down = await conversation(session, gws, "d", shared=False)  # every request still succeeds
    assert predicted(down)[:3] == [0, 0, 0]  # local-only: nothing arrives from the others
    text = await metrics(session, gws[0].url)
    assert metric(text, "prefixroute_sync_errors_total") > 0
    redis_server.start()  # same port: the instances reconnect by themselves (backoff)
    await all_connected(session, gws, up=True)
    replies = await conversation(session, gws, "e", shared=True)
    assert len(replicas(replies)) == 1
    assert all(p > 0 for p in predicted(replies)[1:])


async def test_redis_down_at_start_is_no_error(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    from .redis_server import free_port

    gws = await fleet(make_cluster, make_gateway, f"redis://127.0.0.1:{free_port()}/0")
    replies = await conversation(session, gws, "f", shared=False)
    assert all(r.complete for r in replies)
    text = await metrics(session, gws[0].url)
    assert metric(text, "prefixroute_sync_connected") == 0


@pytest.mark.parametrize("history", [4096, 0])
async def test_an_instance_started_later_begins_warm_from_the_history(
    make_cluster: ClusterFactory,
    make_gateway: GatewayFactory,
    session: aiohttp.ClientSession,
    redis_server: RedisServer,
    history: int,
) -> None:
    cluster = await make_cluster(3)
    urls = [r.url for r in cluster.replicas]
    first = await make_gateway(urls, seed=0, sync_redis=redis_server.url, sync_history=history)
    await all_connected(session, [first], up=True)
    messages = [{"role": "user", "content": " ".join(f"late{i}" for i in range(300))}]
    body = {"model": "emulated", "messages": messages, "max_tokens": 4}
    turn1 = await send(session, first.url, "/v1/chat/completions", body)
    assert turn1.complete, turn1

    async def published() -> bool:
        return await gauge(session, first, "prefixroute_sync_published_total") >= 1

    await until(published)
    # Scale-out: a second instance starts after the first turn was routed and published.
    later = await make_gateway(urls, seed=1, sync_redis=redis_server.url, sync_history=history)
    await all_connected(session, [later], up=True)  # connected: the history is applied
    messages += [
        {"role": "assistant", "content": turn1.text},
        {"role": "user", "content": "and then?"},
    ]
    turn2 = await send(session, later.url, "/v1/chat/completions", body | {"messages": messages})
    replayed = await gauge(session, later, "prefixroute_sync_replayed_total")
    if history:
        assert replayed == 1
        assert replicas([turn1, turn2]) == {turn1.headers["x-prefixroute-replica"]}
        assert predicted([turn2])[0] > 0
        assert turn2.usage["prompt_tokens_details"]["cached_tokens"] > 0
    else:
        assert replayed == 0
        assert predicted([turn2])[0] == 0  # PUB/SUB alone: the late instance knows nothing


def test_sync_settings() -> None:
    with pytest.raises(ConfigError, match="redis://"):
        GatewayConfig(sync_redis="localhost:6379")
    precise = GatewayConfig(  # precise mode shares load and speculative entries
        replicas=("http://127.0.0.1:9",),
        kv_events=("http://127.0.0.1:9=connect:tcp://127.0.0.1:9",),
        sync_redis="redis://127.0.0.1:6379",
    )
    assert precise.precise and precise.sync_redis is not None
    assert GatewayConfig(sync_redis="redis://10.0.0.5:6379/1").sync_channel == "prefixroute:routed"
    with pytest.raises(ConfigError, match="sync_history"):
        GatewayConfig(sync_redis="redis://10.0.0.5:6379/1", sync_history=-1)


def test_sync_settings_from_toml_and_flags(tmp_path: Path) -> None:
    import argparse

    from prefixroute.commands.serve import add_parser, config_from_args

    path = tmp_path / "gw.toml"
    path.write_text('sync_redis = "redis://a:6379/0"\nsync_channel = "fleet-a"\n')
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    config = config_from_args(parser.parse_args(["serve", "--config", str(path)]))
    assert (config.sync_redis, config.sync_channel) == ("redis://a:6379/0", "fleet-a")
    args = parser.parse_args(["serve", "--config", str(path), "--sync-redis", "redis://b:1"])
    assert config_from_args(args).sync_redis == "redis://b:1"
    assert config_from_args(args).sync_history == 4096
    args = parser.parse_args(["serve", "--config", str(path), "--sync-history", "0"])
    assert config_from_args(args).sync_history == 0


def test_decisions_encode_compactly() -> None:
    from prefixroute.sync._wire import (
        Progress,
        Routed,
        Withdrawn,
        decode,
        encode,
        encode_progress,
        encode_withdrawn,
    )

    hashes = [BlockHash(h) for h in (0, 1, 2**64 - 1, 12345678901234567890)]
    payload = encode("me", ReplicaId("http://r:1"), hashes)
    assert len(payload) < 8 * len(hashes) + 32
    msg = decode(payload)
    assert isinstance(msg, Routed)
    assert (msg.instance, msg.replica, msg.block_hashes()) == ("me", "http://r:1", hashes)
    assert msg.request_id == ""  # an index entry only: counted as nobody's load
    bad = decode(b"\x94\x00\xa2me\xa1r\xc4\x03abc")  # 3 bytes: not a whole hash
    assert isinstance(bad, Routed)
    with pytest.raises(ValueError):
        bad.block_hashes()
    assert decode(encode_progress("me", "req-1", True)) == Progress("me", "req-1", True)
    assert len(encode_progress("me", "req-1", True)) < 16
    assert decode(encode_withdrawn("me", "req-1")) == Withdrawn("me", "req-1")
    # An instance that predates withdrawals skips one as undecodable, rather than reading it
    # as a first token (which would end the request's prefill in its load view).
    older = msgspec.msgpack.Decoder(Routed | Progress)
    with pytest.raises(msgspec.DecodeError):
        older.decode(encode_withdrawn("me", "req-1"))
    with pytest.raises(msgspec.DecodeError):
        decode(b"\x93\x07\xa2me\xc3")  # an unknown tag
    with pytest.raises(msgspec.DecodeError):  # a negative size would corrupt the load view
        decode(msgspec.msgpack.encode([0, "me", "r", b"", "q", -5, 1, 0]))


def remote_decision(
    instance: str,
    request_id: str,
    replica: str,
    prompt: int = 400,
    cached: int = 100,
    hashes: list[BlockHash] | None = None,
) -> bytes:
    from prefixroute.core import Decision, DecisionReason, RequestView
    from prefixroute.sync._wire import encode

    chain = [BlockHash(7), BlockHash(8)] if hashes is None else hashes
    view = RequestView(
        request_id=request_id, block_hashes=chain, block_size=16,
        prompt_tokens=prompt, prompt_units=prompt, output_tokens=50,
    )  # fmt: skip
    decision = Decision(ReplicaId(replica), DecisionReason.PREFIX_MATCH, cached)
    return encode(instance, ReplicaId(replica), view.block_hashes, view, decision)


def test_the_others_requests_count_in_the_load_view_until_they_end() -> None:
    """Without Redis: messages as they would arrive, applied one by one."""
    from prometheus_client.registry import CollectorRegistry

    from prefixroute.core import Router, make_policy
    from prefixroute.sync._redis import RouteSync
    from prefixroute.sync._remote import EXPIRE_EVERY_S, REMOTE_TTL_S
    from prefixroute.sync._wire import encode, encode_progress

    router = Router(make_policy("round_robin"))
    r = ReplicaId("http://r:1")
    router.add_replica(r)
    registry = CollectorRegistry()
    sync = RouteSync("redis://127.0.0.1:9/0", "c", router, registry, instance_id="me")
    load = router.loads.get(r)

    def sample(name: str) -> float:
        return registry.get_sample_value(name) or 0.0

    assert sync.remote.apply(remote_decision("other", "q1", r))
    assert (load.in_flight, load.prefilling, load.queued_prefill_tokens) == (1, 1, 300)
    assert router.index.match([BlockHash(7), BlockHash(8)]) == {r: 2}
    assert sample("prefixroute_sync_remote_in_flight") == 1
    sync.remote.apply(encode_progress("other", "q1", False))  # first token: prefill is over
    assert (load.in_flight, load.prefilling, load.queued_prefill_tokens) == (1, 0, 0)
    sync.remote.apply(encode_progress("other", "q1", True))
    assert load.in_flight == 0 and sample("prefixroute_sync_remote_in_flight") == 0
    sync.remote.apply(encode_progress("other", "q1", True))  # a repeated end changes nothing
    assert load.in_flight == 0 and load.completed == 1

    # Ours, from the history, or for a replica we do not route to: never load.
    sync.remote.apply(remote_decision("me", "q2", r))
    sync.remote.apply(remote_decision("other", "q3", r), live=False)
    sync.remote.apply(remote_decision("other", "q4", "http://elsewhere:1"))
    assert sync.remote.apply(encode("other", r, [BlockHash(9)]))  # an index entry, no request
    assert load.in_flight == 0 and sample("prefixroute_sync_remote_in_flight") == 0

    # An end never heard: expired after the TTL; a broken subscription drops them all.
    sync.remote.apply(remote_decision("other", "q5", r))
    sync.remote.apply(remote_decision("other", "q6", r))
    assert load.in_flight == 2
    import time

    sync.remote.expire(time.monotonic() + 1)
    assert load.in_flight == 2
    sync.remote.expire(time.monotonic() + REMOTE_TTL_S + 1)
    assert load.in_flight == 0 and sample("prefixroute_sync_expired_total") == 2
    sync.remote.apply(remote_decision("other", "q7", r))
    sync.remote.forget()
    assert load.in_flight == 0 and sample("prefixroute_sync_remote_in_flight") == 0

    # The subscriber offers every loop turn for expiry; a pass runs once per EXPIRE_EVERY_S.
    far = time.monotonic() + REMOTE_TTL_S + 10
    sync.remote.expire_due(far)
    sync.remote.apply(remote_decision("other", "q8", r))
    sync.remote.expire_due(far + EXPIRE_EVERY_S / 2)
    assert load.in_flight == 1
    sync.remote.expire_due(far + EXPIRE_EVERY_S)
    assert load.in_flight == 0


def test_a_request_another_instance_withdrew_leaves_this_index_too() -> None:
    """The replica turned the other instance's request away (``Router.withdraw`` there): the
    blocks its decision added here go too, those the replica held before stay, and the
    request stays in the load view until its end."""
    from prometheus_client.registry import CollectorRegistry

    from prefixroute.core import Router, make_policy
    from prefixroute.sync._redis import RouteSync
    from prefixroute.sync._wire import encode, encode_progress, encode_withdrawn

    router = Router(make_policy("round_robin"))
    r = ReplicaId("http://r:1")
    router.add_replica(r)
    sync = RouteSync("redis://127.0.0.1:9/0", "c", router, CollectorRegistry(), instance_id="me")
    sync.remote.apply(remote_decision("other", "q1", r))  # blocks 7, 8: served
    sync.remote.apply(encode_progress("other", "q1", True))
    chain = [BlockHash(h) for h in (7, 8, 9, 10)]
    assert sync.remote.apply(remote_decision("other", "q2", r, hashes=chain))
    assert router.indexed_blocks(r) == 4
    sync.remote.apply(encode_withdrawn("other", "q2"))
    assert router.index.match(chain) == {r: 2}  # 9 and 10 taken back, 7 and 8 kept
    assert router.replica_load(r).in_flight == 1  # until its end
    sync.remote.apply(encode_progress("other", "q2", True))
    assert router.replica_load(r).in_flight == 0

    # Not counted as load (no request id): nothing is kept to withdraw, and nothing leaks.
    view_less = encode("other", r, [BlockHash(11)])
    assert sync.remote.apply(view_less)
    sync.remote.apply(encode_withdrawn("other", ""))
    assert router.indexed_blocks(r) == 3
    # A withdrawal of a request never heard of (routed before we subscribed) does nothing.
    sync.remote.apply(encode_withdrawn("other", "q0"))
    assert router.indexed_blocks(r) == 3


def test_the_history_replays_no_decision_that_a_withdrawal_followed() -> None:
    """``without_withdrawn``'s contract: the history comes newest first and goes out oldest
    first; a withdrawal removes itself and its request's latest decision before it, not a
    decision routed after it (a retry elsewhere), nor another instance's request of the same id,
    nor a decision without an id; what cannot be decoded passes for ``apply`` to count."""
    from prefixroute.sync._history import without_withdrawn
    from prefixroute.sync._wire import encode, encode_progress, encode_withdrawn

    first = remote_decision("a", "q1", "http://r:1")
    retry = remote_decision("a", "q1", "http://r:2", hashes=[BlockHash(9)])
    again = remote_decision("a", "q1", "http://r:3", hashes=[BlockHash(10)])
    same_id = remote_decision("b", "q1", "http://r:1", hashes=[BlockHash(11)])
    other = remote_decision("a", "q2", "http://r:1", hashes=[BlockHash(12)])
    keyless = encode("a", ReplicaId("http://r:1"), [BlockHash(13)])
    junk = b"\xc1 not msgpack"
    oldest_first = [
        first, same_id, other, encode_withdrawn("a", "q1"), keyless, junk,
        encode_withdrawn("a", ""), retry, encode_progress("a", "q2", True),
        again, encode_withdrawn("a", "q1"),
    ]  # fmt: skip
    replayed = without_withdrawn(list(reversed(oldest_first)))
    assert replayed == [same_id, other, keyless, junk, retry, encode_progress("a", "q2", True)]
    assert without_withdrawn([]) == []


def test_in_precise_mode_a_live_remote_decision_is_a_speculative_entry() -> None:
    """The engines' events own the index; the others' decisions only bridge the wait."""
    from prometheus_client.registry import CollectorRegistry

    from prefixroute.core import Router, make_policy
    from prefixroute.sync._redis import RouteSync

    router = Router(make_policy("round_robin"), insert_on_route=False, speculative_ttl_s=60.0)
    r = ReplicaId("http://r:1")
    router.add_replica(r)
    sync = RouteSync("redis://127.0.0.1:9/0", "c", router, CollectorRegistry(), instance_id="me")
    sync.remote.apply(remote_decision("other", "q0", r), live=False)  # from the history
    assert router.speculative_entries() == 0
    assert sync.remote.apply(remote_decision("other", "q1", r))
    assert router.speculative_entries() == 2 and router.index_entries() == 0
    assert router.replica_load(r).in_flight == 1 and len(sync.remote) == 1


async def test_a_request_at_one_instance_is_in_flight_at_the_others(
    make_cluster: ClusterFactory,
    make_gateway: GatewayFactory,
    session: aiohttp.ClientSession,
    redis_server: RedisServer,
) -> None:
    from prefixroute.emulate import EmulatorConfig
    from prefixroute.sim.replica import ReplicaConfig

    slow = EmulatorConfig(ReplicaConfig(block_size=1), time_scale=1.0)  # 15 ms per token
    cluster = await make_cluster(2, slow)
    urls = [r.url for r in cluster.replicas]
    gws = [await make_gateway(urls, seed=i, sync_redis=redis_server.url, **STEADY) for i in (0, 1)]
    await all_connected(session, gws, up=True)

    def remote(gw: Gateway) -> tuple[int, int]:  # (in flight, prefilling) over all replicas
        loads = [gw.router.loads.get(ReplicaId(u)) for u in urls]
        return sum(x.in_flight for x in loads), sum(x.prefilling for x in loads)

    body = {"model": "emulated", "prompt": "hello " * 50, "max_tokens": 120, "stream": True}
    request = asyncio.create_task(send(session, gws[0].url, "/v1/completions", body))
    await until(lambda: remote(gws[1])[0] == 1)  # routed at gws[0], counted at gws[1]
    await until(lambda: remote(gws[1]) == (1, 0))  # its first token streamed: decoding
    reply = await request
    assert reply.complete, reply
    await until(lambda: remote(gws[1]) == (0, 0))
    assert await gauge(session, gws[1], "prefixroute_sync_remote_in_flight") == 0


async def test_a_full_queue_drops_the_oldest_message_and_never_blocks() -> None:
    from prometheus_client.registry import CollectorRegistry

    from prefixroute.core import Router, make_policy
    from prefixroute.sync._redis import QUEUE_SIZE, RouteSync

    from .redis_server import free_port

    router = Router(make_policy("round_robin"))
    registry = CollectorRegistry()
    sync = RouteSync(f"redis://127.0.0.1:{free_port()}/0", "c", router, registry)

    def dropped() -> float:
        return registry.get_sample_value("prefixroute_sync_dropped_total") or 0.0

    sync.completed("q0")  # not started: nothing is queued
    assert dropped() == 0
    await sync.start()
    try:
        for i in range(QUEUE_SIZE + 10):
            sync.completed(f"q{i}")
        assert dropped() >= 10 - 1  # the publisher may hold one
        assert not sync.connected
    finally:
        await sync.stop()


def test_with_a_lock_every_call_into_the_router_holds_it() -> None:
    """A router other threads also call (Ray Serve's) hands its lock to the sync: the others'
    decisions, progress, expiry and forgetting all reach the router holding it."""
    import time

    from prometheus_client.registry import CollectorRegistry

    from prefixroute.core import Router, make_policy
    from prefixroute.sync._redis import RouteSync
    from prefixroute.sync._remote import REMOTE_TTL_S
    from prefixroute.sync._wire import encode_progress, encode_withdrawn

    class Lock:
        held = False

        def __enter__(self) -> None:
            assert not self.held
            self.held = True

        def __exit__(self, *exc: object) -> None:
            self.held = False

    lock = Lock()
    router = Router(make_policy("round_robin"))
    r = ReplicaId("http://r:1")
    router.add_replica(r)
    calls: list[str] = []
    names = ("has_replica", "remote_routed", "remote_dispatch", "first_token", "withdraw",
             "complete")  # fmt: skip
    for name in names:

        def guarded(*args: object, _real: object = getattr(router, name), _name: str = name,
                    **kwargs: object) -> object:  # fmt: skip
            assert lock.held, f"{_name} called without the lock"
            calls.append(_name)
            return _real(*args, **kwargs)  # type: ignore[operator]

        setattr(router, name, guarded)
    sync = RouteSync(
        "redis://127.0.0.1:9/0", "c", router, CollectorRegistry(), instance_id="me", lock=lock
    )
    assert sync.remote.apply(remote_decision("other", "q1", r))
    sync.remote.apply(encode_progress("other", "q1", False))
    sync.remote.apply(encode_withdrawn("other", "q1"))
    sync.remote.apply(encode_progress("other", "q1", True))
    sync.remote.apply(remote_decision("other", "q2", r))
    sync.remote.expire(time.monotonic() + REMOTE_TTL_S + 1)
    sync.remote.apply(remote_decision("other", "q3", r))
    sync.remote.forget()
    assert not lock.held
    assert calls.count("remote_routed") == 3 and calls.count("complete") == 3
    assert {"has_replica", "remote_dispatch", "first_token", "withdraw"} <= set(calls)


async def test_a_request_a_replica_turned_away_leaves_no_blocks_at_the_other_instances(
    make_fake: FakeFactory,
    make_gateway: GatewayFactory,
    session: aiohttp.ClientSession,
    redis_server: RedisServer,
) -> None:
    # One instance's request is turned away by a full replica (SGLang's 429) and served by the
    # other: every instance's index says the full one holds nothing of it. Before, only the
    # instance that routed it took its blocks back, and the others sent the prefix's next
    # requests to the full replica, predicted cheap.
    from .fakes import one_event_stream, queue_full

    full = await make_fake(handler=queue_full)
    free = await make_fake(handler=one_event_stream)
    urls = [full.url, free.url]
    gws = [
        await make_gateway(urls, seed=i, sync_redis=redis_server.url, policy="round_robin",
                           **STEADY)
        for i in (0, 1)
    ]  # fmt: skip
    await all_connected(session, gws, up=True)
    for i in range(4):
        body = {"prompt": f"question {i} " + "word " * 100, "max_tokens": 1, "stream": True}
        assert (await send(session, gws[0].url, "/v1/completions", body)).status == 200
    full_id, free_id = (gws[1].registry.find(u).id for u in urls)  # type: ignore[union-attr]
    # Heard at the other instance: the served ones are there, the turned-away ones are not.
    await until(lambda: gws[1].router.indexed_blocks(free_id) > 0)
    await until(lambda: gws[1].router.replica_load(free_id).in_flight == 0)
    assert gws[1].router.indexed_blocks(full_id) == 0
    assert gws[0].router.indexed_blocks(full_id) == 0
    # An instance started later replays the history: the served decisions, not the withdrawn.
    later = await make_gateway(urls, seed=2, sync_redis=redis_server.url, policy="round_robin",
                               **STEADY)  # fmt: skip
    await all_connected(session, [later], up=True)  # connected: the history is applied
    later_full, later_free = (later.registry.find(u).id for u in urls)  # type: ignore[union-attr]
    assert later.router.indexed_blocks(later_free) > 0
    assert later.router.indexed_blocks(later_full) == 0


async def test_an_outage_drops_the_oldest_messages_first_so_no_decision_outlives_its_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Redis down: the batch Redis did not take is older than everything queued since, so a
    full queue drops from it first (module docstring: "drops its oldest message"). Dropping
    from the queue first kept a decision while its end went, and every other instance counted
    that request in flight for REMOTE_TTL_S (an outside audit, 2026-12-02)."""
    from prometheus_client.registry import CollectorRegistry

    import prefixroute.sync._redis as sync_redis
    from prefixroute.core import Decision, DecisionReason, Router, make_policy
    from prefixroute.sync._redis import RouteSync

    monkeypatch.setattr(sync_redis, "QUEUE_SIZE", 8)
    monkeypatch.setattr(sync_redis, "BACKOFF_MIN_S", 0.01)
    r = ReplicaId("http://r:1")

    def instance(name: str) -> tuple[Router, RouteSync]:
        router = Router(make_policy("round_robin"))
        router.add_replica(r)
        return router, RouteSync("redis://127.0.0.1:9/0", "c", router, CollectorRegistry(),
                                 instance_id=name)  # fmt: skip

    router, pub = instance("pub")
    await pub.start()  # nothing listens there: every batch fails
    try:
        decision = Decision(r, DecisionReason.PREFIX_MATCH, 0)
        pub.routed(router.view("q1", tokens=list(range(64))), decision)
        await until(lambda: bool(pub._unsent))  # the decision's batch, kept for the retry
        pub.completed("q1")  # its end, queued behind it
        for i in range(8):  # the outage goes on: more than the queue holds
            pub.first_token(f"x{i}")
        queued = list(pub._queue._queue)  # type: ignore[attr-defined]
        pending = [p for p, _ in pub._unsent] + [p for p, _ in queued]
        assert len(pending) == 8
    finally:
        await pub.stop()
    other, sub = instance("me")
    for payload in pending:  # what the others hear once Redis is back
        sub.remote.apply(payload)
    assert other.replica_load(r).in_flight == 0
