"""Signed sync messages (``sync_secret``, sync/_signing.py) and bounded ones (sync/_wire.py).

From an outside audit (2026-12-06): anyone who could publish to the sync channel was believed.
One forged ``Stored`` message let a tenant read another tenant's stored Responses, one forged
decision of 2**64 prompt tokens kept a replica out of every instance's routing. With a shared
secret every message carries an HMAC and the others are dropped and counted; every field is
bounded whatever the secret."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import aiohttp
import msgspec
import pytest
import redis
from polling import until
from prometheus_client.registry import CollectorRegistry

from prefixroute.core import BlockHash, ConfigError, ReplicaId, Router, make_policy
from prefixroute.gateway import GatewayConfig, TenancyConfig
from prefixroute.gateway._state import STATE
from prefixroute.sync._redis import RouteSync
from prefixroute.sync._signing import Signer
from prefixroute.sync._wire import Progress, Routed, Stored, decode, encode_stored

from .helpers import STEADY, ClusterFactory, GatewayFactory, post_json, words
from .redis_server import RedisServer
from .test_precise import metrics
from .test_sync import all_connected

SECRET = "a shared secret of the fleet"
CHANNEL = "prefixroute:routed"


def test_a_signed_message_opens_under_its_secret_only() -> None:
    payload = encode_stored("i", None, "resp_1", ReplicaId("http://r:1"))
    signed = Signer(SECRET).sign(payload)
    assert Signer(SECRET).open(signed) == payload
    assert Signer("another secret").open(signed) is None
    tampered = signed[:-1] + bytes([signed[-1] ^ 1])
    assert Signer(SECRET).open(tampered) is None
    assert Signer(SECRET).open(payload) is None  # unsigned
    assert Signer(SECRET).open(signed[:10]) is None  # shorter than a tag


def test_with_a_secret_an_unsigned_message_is_dropped_and_counted() -> None:
    registry = CollectorRegistry()
    router = Router(make_policy("round_robin"))
    sync = RouteSync("redis://127.0.0.1:1/0", CHANNEL, router, registry, secret=SECRET)
    payload = encode_stored("i", None, "resp_1", ReplicaId("http://r:1"))
    assert sync._open(payload) is None
    assert registry.get_sample_value("prefixroute_sync_errors_total", {"kind": "auth"}) == 1
    assert sync._open(Signer(SECRET).sign(payload)) == payload
    plain = RouteSync("redis://127.0.0.1:1/0", CHANNEL, router, CollectorRegistry())
    assert plain._open(payload) == payload  # no secret: believed, as before


def test_a_live_message_under_another_secret_is_said_once_a_minute(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Instances with different secrets share nothing, and that showed only in a counter (an
    outside audit, 2026-12-07). A live message that fails its check is logged, at most once a
    minute; the history's (written before a secret was set, say) only counted."""
    import prefixroute.sync._redis as redis_module

    now = [1000.0]
    monkeypatch.setattr(redis_module.time, "monotonic", lambda: now[0])
    sync = RouteSync("redis://127.0.0.1:1/0", CHANNEL, Router(make_policy("round_robin")),
                     CollectorRegistry(), secret=SECRET)  # fmt: skip
    other = Signer("another secret").sign(encode_stored("i", None, "resp_1", ReplicaId("http://r:1")))
    said = lambda: [r for r in caplog.records if "signature" in r.getMessage()]  # noqa: E731
    with caplog.at_level(logging.WARNING, logger="prefixroute.sync._redis"):
        assert sync._open(other) is None  # the history's: counted, not said
        assert said() == []
        for _ in range(3):
            assert sync._open(other, True) is None
        assert len(said()) == 1 and "different sync secret" in said()[0].getMessage()
        now[0] += 61
        assert sync._open(other, True) is None
        assert len(said()) == 2


@pytest.mark.parametrize(
    "message",
    [
        Routed("i", "http://r:1", b"", "q", 2**64 - 1),  # a replica out of routing for minutes
        Routed("i", "http://r:1", b"\0" * 8 * (2**17 + 1)),  # a stall of the event loop
        Stored("i", None, "resp_" + "x" * 1_000_000, "http://r:1"),  # memory without bound
        Stored("i", "t" * 300, "resp_1", "http://r:1"),
    ],
)
def test_a_message_past_its_bounds_is_a_decode_error(message: Routed | Stored) -> None:
    raw = msgspec.msgpack.encode(message)
    with pytest.raises(msgspec.ValidationError):
        decode(raw)


def test_tenant_isolation_with_sync_needs_a_secret() -> None:
    isolated = TenancyConfig(isolation=True, cache_salt_secret="s" * 32)
    with pytest.raises(ConfigError, match="needs sync_secret_file"):
        GatewayConfig(sync_redis="redis://127.0.0.1:6379/0", tenancy=isolated)
    GatewayConfig(sync_redis="redis://127.0.0.1:6379/0", tenancy=isolated, sync_secret=SECRET)
    GatewayConfig(tenancy=isolated)  # no sync: nothing to sign


async def known(session: aiohttp.ClientSession, url: str, response_id: str) -> bool:
    async with session.get(url + f"/v1/responses/{response_id}") as resp:
        return resp.status == 200


async def test_a_forged_stored_message_reaches_only_the_instance_without_a_secret(
    make_cluster: ClusterFactory,
    make_gateway: GatewayFactory,
    session: aiohttp.ClientSession,
    redis_server: RedisServer,
) -> None:
    cluster = await make_cluster(2)
    urls = [r.url for r in cluster.replicas]
    alone = await make_gateway(urls, seed=0, **STEADY)  # stores a response no instance knows
    sync = {"sync_redis": redis_server.url, **STEADY}
    signed = await make_gateway(urls, seed=1, sync_secret=SECRET, **sync)
    trusting = await make_gateway(urls, seed=2, **sync)
    await all_connected(session, [signed, trusting], up=True)
    body = {"input": words(40), "max_output_tokens": 1}
    status, headers, raw = await post_json(session, alone.url + "/v1/responses", body)
    assert status == 200, raw
    names = {alone.app[STATE].registry.public_name(ReplicaId(u)): u for u in urls}
    rid, replica = json.loads(raw)["id"], names[headers["x-prefixroute-replica"]]
    assert not await known(session, signed.url, rid) and not await known(session, trusting.url, rid)

    [(tenant, _)] = alone.app[STATE].responses._owners  # the default tenant's, as recorded
    forged = encode_stored("evil", tenant, rid, ReplicaId(replica))
    client = redis.Redis.from_url(redis_server.url)
    try:
        client.publish(CHANNEL, forged)
        await until(lambda: known(session, trusting.url, rid))  # believed without a secret

        async def refused() -> bool:  # heard by the signed instance, and dropped
            text = await metrics(session, signed.url)  # (the sample exists from the first)
            return 'prefixroute_sync_errors_total{kind="auth"}' in text

        await until(refused)
        assert not await known(session, signed.url, rid)
        client.publish(CHANNEL, Signer(SECRET).sign(forged))  # one signed under the secret
        await until(lambda: known(session, signed.url, rid))
    finally:
        client.close()


def on_a_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[list[float], Router, ReplicaId, RouteSync]:
    """A sync that hears no Redis, in front of one replica, its remote requests' clock at
    1,000 s (``clock[0]``, for the test to move): (clock, router, replica, sync)."""
    import prefixroute.sync._remote as remote_module

    clock = [1000.0]
    monkeypatch.setattr(remote_module.time, "monotonic", lambda: clock[0])
    router = Router(make_policy("round_robin"))
    r = ReplicaId("http://r:1")
    router.add_replica(r)
    sync = RouteSync("redis://127.0.0.1:9/0", "c", router, CollectorRegistry(), instance_id="me")
    return clock, router, r, sync


def test_the_requests_of_an_instance_no_longer_heard_leave_the_load_view(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An instance killed outright sends no ends: its requests left the others' load views
    only after REMOTE_TTL_S (ten minutes), pushing traffic off the replicas they named (an
    outside audit, 2026-12-06). Now an instance not heard for SILENT_S is gone; one that says
    it is alive (an empty progress message, every ALIVE_EVERY_S) keeps its requests."""
    from prefixroute.sync._remote import ALIVE_EVERY_S, REMOTE_TTL_S, SILENT_S
    from prefixroute.sync._wire import encode_progress

    from .test_sync import remote_decision

    clock, router, r, sync = on_a_clock(monkeypatch)
    sync.remote.apply(remote_decision("alive", "q1", r))
    sync.remote.apply(remote_decision("killed", "q2", r))
    assert router.replica_load(r).in_flight == 2
    while clock[0] < 1000.0 + SILENT_S + ALIVE_EVERY_S:  # well under REMOTE_TTL_S
        clock[0] += ALIVE_EVERY_S
        sync.remote.apply(encode_progress("alive", "", False))  # its heartbeat
        sync.remote.expire(clock[0])
    assert SILENT_S + ALIVE_EVERY_S < REMOTE_TTL_S
    assert router.replica_load(r).in_flight == 1  # "killed"'s request is gone, "alive"'s stays
    sync.remote.apply(encode_progress("alive", "q1", True))
    assert router.replica_load(r).in_flight == 0


def test_a_killed_instances_requests_leave_within_ten_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """docs/deployment.md: every instance says it is alive every second, and the requests of
    one not heard for 10 s are dropped (it was 30 s, and a killed instance's requests held the
    survivors' in-flight cap all that time: an outside audit, 2026-12-07)."""
    from prefixroute.sync._remote import ALIVE_EVERY_S

    from .test_sync import remote_decision

    assert ALIVE_EVERY_S <= 1.0
    clock, router, r, sync = on_a_clock(monkeypatch)
    sync.remote.apply(remote_decision("killed", "q", r))
    for at, counted in ((1009.9, 1), (1010.1, 0)):  # 9.9 s unheard: kept; 10.1 s: gone
        clock[0] = at
        sync.remote.expire(at)
        assert router.replica_load(r).in_flight == counted, at


async def test_every_instance_says_it_is_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    import prefixroute.sync._redis as redis_module

    monkeypatch.setattr(redis_module, "ALIVE_EVERY_S", 0.01)
    router = Router(make_policy("round_robin"))
    sync = RouteSync("redis://127.0.0.1:9/0", "c", router, CollectorRegistry(), instance_id="me")
    sync._tasks = [asyncio.create_task(sync._alive())]  # the heartbeat alone, no Redis
    try:
        await asyncio.sleep(0.05)
        payload, keep = sync._queue.get_nowait()
    finally:
        sync._tasks[0].cancel()
    message = decode(payload)
    assert isinstance(message, Progress) and not keep
    assert (message.instance, message.request_id, message.done) == ("me", "", False)
    assert message.seq == 1 and message.open == 0  # the first; nothing of ours in flight
    assert abs(message.sent_at - time.time()) < 5


def test_a_decision_for_a_replica_named_otherwise_is_counted_and_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One instance given ``http://localhost:...``, the others ``http://127.0.0.1:...``:
    sharing was off without a word or a metric (an outside audit, 2026-12-06)."""
    from .test_sync import remote_decision

    registry = CollectorRegistry()
    router = Router(make_policy("round_robin"))
    router.add_replica(ReplicaId("http://127.0.0.1:1"))
    sync = RouteSync("redis://127.0.0.1:9/0", "c", router, registry, instance_id="me")
    caplog.set_level(logging.WARNING, logger="prefixroute.sync")
    for i in range(3):
        assert not sync.remote.apply(remote_decision("other", f"q{i}", "http://localhost:1"))
    skipped = {"reason": "unknown_replica"}
    assert registry.get_sample_value("prefixroute_sync_skipped_total", skipped) == 3
    assert caplog.text.count("http://localhost:1, which this instance does not know") == 1


def _signed_sync(
    monkeypatch: pytest.MonkeyPatch, wall: float, registry: CollectorRegistry | None = None
) -> tuple[RouteSync, Router, ReplicaId]:
    """A sync with a secret whose wall clock reads ``wall``, over one replica."""
    import prefixroute.sync._remote as remote_module

    monkeypatch.setattr(remote_module, "_wall_clock", lambda: wall)
    router = Router(make_policy("round_robin"))
    r = ReplicaId("http://r:1")
    router.add_replica(r)
    sync = RouteSync("redis://127.0.0.1:9/0", "c", router, registry or CollectorRegistry(),
                     instance_id="me", secret="s" * 32)  # fmt: skip
    return sync, router, r


def test_a_signed_decision_sent_again_after_its_end_is_not_load_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Recorded signed decisions (thousands sit in the history) sent again on the channel
    counted their long-finished requests for ten minutes each: 2,000 of them made every
    request a 503, signature or not (an outside audit, 2026-12-06). Now a decision counts once,
    and only while fresh."""
    from prefixroute.sync._wire import encode_progress

    from .test_sync import remote_decision

    registry = CollectorRegistry()
    sync, router, r = _signed_sync(monkeypatch, time.time(), registry)
    decision = remote_decision("other", "q1", r)
    assert sync.remote.apply(decision)
    assert router.replica_load(r).in_flight == 1
    sync.remote.apply(encode_progress("other", "q1", True))
    assert router.replica_load(r).in_flight == 0
    sync.remote.apply(decision)  # the same message again: its request is over
    assert router.replica_load(r).in_flight == 0
    skipped = {"reason": "replayed"}
    assert registry.get_sample_value("prefixroute_sync_skipped_total", skipped) == 1


def test_a_retry_decided_after_its_first_attempt_ended_is_load(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """serve (and the Ray router) end a failed attempt, then route the retry under the same
    request id: a new decision, sent later. Taken for a replay of an ended request, it counted
    nowhere, on the replica the retry went to, in every other instance (the review of
    2026-12-07). The first decision sent again still counts nothing."""
    import prefixroute.sync._wire as wire_module
    from prefixroute.sync._wire import encode_progress

    from .test_sync import remote_decision

    wall = time.time()
    sync, router, r = _signed_sync(monkeypatch, wall)
    monkeypatch.setattr(wire_module.time, "time", lambda: wall - 1.0)
    first = remote_decision("other", "q1", r)
    monkeypatch.setattr(wire_module.time, "time", lambda: wall)
    retry = remote_decision("other", "q1", r)
    assert sync.remote.apply(first)
    sync.remote.apply(encode_progress("other", "q1", True))  # the attempt failed: ended
    assert sync.remote.apply(retry)
    assert router.replica_load(r).in_flight == 1
    sync.remote.apply(encode_progress("other", "q1", True))
    sync.remote.apply(first)
    sync.remote.apply(retry)  # replays: no load
    assert router.replica_load(r).in_flight == 0


@pytest.mark.parametrize("offset", [-61.0, 61.0])
def test_a_signed_decision_sent_more_than_a_minute_from_now_is_not_load(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, offset: float
) -> None:
    """Not load, but still a decision: its index entry is applied. Dropped whole, a clock
    more than a minute off turned every shared prefix off between the instances, unsaid (an
    outside audit, 2026-12-07): so it is also said, once per instance."""
    from .test_sync import remote_decision

    sent = time.time()
    decision = remote_decision("other", "q1", ReplicaId("http://r:1"))  # sent_at: now
    sync, router, r = _signed_sync(monkeypatch, sent - offset)
    with caplog.at_level(logging.WARNING, logger="prefixroute.sync._remote"):
        assert sync.remote.apply(decision)
        sync.remote.apply(remote_decision("other", "q2", r))
    assert router.replica_load(r).in_flight == 0
    assert router.index.match([BlockHash(7), BlockHash(8)]) == {r: 2}
    said = [m for m in caplog.messages if "from this instance's clock" in m]
    assert len(said) == 1 and "other" in said[0]


@pytest.mark.parametrize("offset", [-59.0, 59.0])
def test_a_signed_decision_within_a_minute_either_way_is_load(
    monkeypatch: pytest.MonkeyPatch, offset: float
) -> None:
    from .test_sync import remote_decision

    sent = time.time()
    decision = remote_decision("other", "q1", ReplicaId("http://r:1"))
    sync, router, r = _signed_sync(monkeypatch, sent - offset)
    assert sync.remote.apply(decision)
    assert router.replica_load(r).in_flight == 1


def test_unsigned_sync_takes_decisions_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a secret every message is believed (docs/security.md): an old decision too."""
    from prefixroute.sync._wire import encode_progress

    from .test_sync import remote_decision

    router = Router(make_policy("round_robin"))
    r = ReplicaId("http://r:1")
    router.add_replica(r)
    sync = RouteSync("redis://127.0.0.1:9/0", "c", router, CollectorRegistry(), instance_id="me")
    decision = remote_decision("other", "q1", r)
    sync.remote.apply(decision)
    sync.remote.apply(encode_progress("other", "q1", True))
    assert sync.remote.apply(decision)
    assert router.replica_load(r).in_flight == 1


def test_ended_requests_are_forgotten_once_no_replay_of_them_could_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import prefixroute.sync._remote as remote_module
    from prefixroute.sync._remote import FRESH_S
    from prefixroute.sync._wire import encode_progress

    from .test_sync import remote_decision

    clock = [1000.0]
    monkeypatch.setattr(remote_module.time, "monotonic", lambda: clock[0])
    sync, _, r = _signed_sync(monkeypatch, time.time())
    for i in range(3):
        sync.remote.apply(remote_decision("other", f"q{i}", r))
        sync.remote.apply(encode_progress("other", f"q{i}", True))
        clock[0] += 1.0
    # The ends came at 1000, 1001 and 1002.
    sync.remote.expire(1000.5 + FRESH_S)  # q0 ended FRESH_S + 0.5 ago, q1 FRESH_S - 0.5
    assert list(sync.remote._ended) == ["other/q1", "other/q2"]
    sync.remote.expire(1001.0 + FRESH_S)  # q1 exactly FRESH_S ago: kept
    assert list(sync.remote._ended) == ["other/q1", "other/q2"]


def test_a_heartbeat_drops_the_requests_its_instance_no_longer_has_open(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each heartbeat says how many of its instance's counted requests have not ended: one
    that never heard their ends (it subscribed later, and recorded decisions were sent
    again; or an end was lost) counted them for REMOTE_TTL_S, keeping their replica out of
    its routing (an outside audit, 2026-12-07). The excess goes, oldest sent first, and the
    same decisions sent again count no more."""
    import prefixroute.sync._wire as wire_module
    from prefixroute.sync._wire import encode_alive

    from .test_sync import remote_decision

    wall = time.time()
    registry = CollectorRegistry()
    sync, router, r = _signed_sync(monkeypatch, wall, registry)
    monkeypatch.setattr(wire_module.time, "time", lambda: wall - 2.0)
    old = remote_decision("other", "q1", r)
    monkeypatch.setattr(wire_module.time, "time", lambda: wall - 1.0)
    young = remote_decision("other", "q2", r)
    monkeypatch.setattr(wire_module.time, "time", lambda: wall)
    sync.remote.apply(young)  # heard out of order: the sending time decides, not arrival
    sync.remote.apply(old)
    sync.remote.apply(remote_decision("third", "q3", r))  # another instance's: its own count
    assert router.replica_load(r).in_flight == 3
    sync.remote.apply(encode_alive("other", 1, 2))  # as many as we hold: nothing goes
    assert router.replica_load(r).in_flight == 3
    sync.remote.apply(encode_alive("other", 2, 1))
    assert router.replica_load(r).in_flight == 2
    assert "other/q1" not in sync.remote._remote and "other/q2" in sync.remote._remote
    assert registry.get_sample_value("prefixroute_sync_expired_total") == 1
    sync.remote.apply(old)  # sent again: taken as ended
    assert router.replica_load(r).in_flight == 2
    sync.remote.apply(encode_alive("other", 3, 0))
    assert router.replica_load(r).in_flight == 1  # the third instance's is left alone


def test_a_heartbeat_sent_again_is_no_sign_of_life(monkeypatch: pytest.MonkeyPatch) -> None:
    """A killed instance's recorded heartbeat, sent again every half second, kept its
    requests counted for as long as it was repeated (an outside audit, 2026-12-07). With
    signed messages an instance that numbers its heartbeats is heard only from one numbered
    past the last and sent within FRESH_S; its decisions and ends are no sign of life."""
    import prefixroute.sync._remote as remote_module
    import prefixroute.sync._wire as wire_module
    from prefixroute.sync._remote import FRESH_S
    from prefixroute.sync._wire import encode_alive

    from .test_sync import remote_decision

    wall = time.time()
    sync, _, r = _signed_sync(monkeypatch, wall)
    clock = [1000.0]
    monkeypatch.setattr(remote_module.time, "monotonic", lambda: clock[0])
    heard = sync.remote._heard
    beat = encode_alive("other", 7, 1)
    sync.remote.apply(beat)
    assert heard["other"] == 1000.0
    clock[0] = 1005.0
    sync.remote.apply(beat)  # the same one again
    sync.remote.apply(encode_alive("other", 6, 1))  # an older one
    sync.remote.apply(remote_decision("other", "q9", r))
    assert heard["other"] == 1000.0
    monkeypatch.setattr(wire_module.time, "time", lambda: wall - FRESH_S - 1)
    stale = encode_alive("other", 8, 1)  # numbered past the last, but sent long ago
    sync.remote.apply(stale)
    assert heard["other"] == 1000.0
    monkeypatch.setattr(wire_module.time, "time", lambda: wall)
    sync.remote.apply(encode_alive("other", 9, 1))
    assert heard["other"] == 1005.0
    # An instance that predates the numbers is heard from any live message, as before.
    sync.remote.apply(remote_decision("legacy", "q1", r))
    assert heard["legacy"] == 1005.0


async def test_stop_sends_what_is_queued_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """A graceful stop cancelled the publisher with the drained requests' ends still queued:
    the others counted those requests for SILENT_S more (an outside audit, 2026-12-07).
    Now what is queued goes out first, a heartbeat last, for up to FLUSH_S."""
    router = Router(make_policy("round_robin"))
    sync = RouteSync("redis://127.0.0.1:9/0", "c", router, CollectorRegistry(), instance_id="me")
    sent: list[bytes] = []

    async def publisher() -> None:  # stands for _publish_some: takes the queue at its pace
        while True:
            sync._unsent = [await sync._queue.get()]  # until Redis took it, as there
            await asyncio.sleep(0.01)
            sent.append(sync._unsent[0][0])
            sync._unsent = []

    sync._tasks = [asyncio.create_task(publisher())]
    sync.completed("q1")
    await sync.stop()
    kinds = [decode(p) for p in sent]
    assert [(m.request_id, m.done) for m in kinds if isinstance(m, Progress)] == [
        ("q1", True), ("", False)
    ]
