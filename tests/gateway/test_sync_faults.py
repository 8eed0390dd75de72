"""The Redis sync in the failures a fleet meets (docs/deployment.md, "Several instances,
approximate mode"): a malformed ``sync_redis`` URL, a full Redis, a password in the URL
(docs/security.md: logged as ``***``), a Redis that hangs.

Found by an audit that ran ``prefixroute serve`` instances against a real ``redis-server``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

import pytest
import redis
from polling import until
from prometheus_client.registry import CollectorRegistry
from stubborn import Stubborn

from prefixroute.core import (
    ConfigError,
    Decision,
    DecisionReason,
    ReplicaId,
    Router,
    make_policy,
)
from prefixroute.gateway import GatewayConfig
from prefixroute.sync import RouteSync

from .redis_server import RedisServer

R = ReplicaId("http://r:1")

# Each of these once started a gateway whose sync then failed for good: the first two killed
# its tasks with nothing logged and nothing counted, the third logged a traceback every 2 s.
MALFORMED = [
    "redis://127.0.0.1:notaport/0",
    "redis://[::1",
    "redis://127.0.0.1:6379/0?foo=bar",
    "redis://127.0.0.1:6379/0?socket_timeout=abc",
    "redis://127.0.0.1:6379/abc",  # redis-py ignores the database silently: 0 it would be
    "unix://",
]


REGISTRIES: dict[str, CollectorRegistry] = {}  # instance id -> its metrics


def instance(name: str, url: str) -> RouteSync:
    router = Router(make_policy("round_robin"))
    router.add_replica(R)
    REGISTRIES[name] = CollectorRegistry()
    return RouteSync(url, "c", router, REGISTRIES[name], instance_id=name)


def sample(sync: RouteSync, name: str, **labels: str) -> float:
    return REGISTRIES[sync.instance_id].get_sample_value(name, labels) or 0.0


@pytest.mark.parametrize("url", MALFORMED)
def test_a_malformed_sync_url_is_a_config_error(url: str) -> None:
    with pytest.raises(ConfigError, match="sync_redis"):
        GatewayConfig(replicas=("http://r:1",), sync_redis=url)


async def test_serve_with_a_malformed_sync_url_exits_with_one_line() -> None:
    """Documented for every bad setting: one line on stderr, exit status 2, no traceback."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "prefixroute.cli", "serve", "--port", "0",
        "--replica", "http://127.0.0.1:9", "--sync-redis", "redis://127.0.0.1:notaport/0",
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 2
    lines = err.decode().strip().splitlines()
    assert len(lines) == 1 and "sync_redis" in lines[0], lines


async def test_a_sync_whose_client_cannot_be_built_keeps_trying_and_counts_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Past the config check (a caller that builds RouteSync itself): the failure is counted
    and retried like any other, never a task that ends unseen; its traceback is logged once
    per task, not at every retry."""
    caplog.set_level(logging.INFO, logger="prefixroute.sync")
    sync = instance("me", "redis://127.0.0.1:notaport/0")
    await sync.start()
    try:
        await until(lambda: sample(sync, "prefixroute_sync_errors_total", kind="internal") >= 6)
        assert all(not t.done() for t in sync._tasks)
    finally:
        await sync.stop()
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2 and all(r.exc_info for r in errors)  # publisher, subscriber


async def test_every_outage_is_logged_once(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A warning per outage, the retries at debug level: a second outage is warned of too."""
    import prefixroute.sync._redis as sync_redis

    monkeypatch.setattr(sync_redis, "BACKOFF_MIN_S", 0.01)
    monkeypatch.setattr(sync_redis, "BACKOFF_MAX_S", 0.05)
    caplog.set_level(logging.WARNING, logger="prefixroute.sync")
    sync = instance("me", redis_server.url)

    def warned() -> int:
        return caplog.text.count("sync through Redis failed")

    await sync.start()
    try:
        for outage in (1, 2):
            await until(lambda: sync.connected)
            redis_server.stop()
            await until(lambda: warned() == outage)  # noqa: B023 (awaited at once)
            await asyncio.sleep(0.2)  # retries meanwhile: not warned of again
            assert warned() == outage
            redis_server.start()
    finally:
        await sync.stop()


async def test_a_full_redis_still_shares_every_decision_once(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis at maxmemory (noeviction) refuses the history's LPUSH but still PUBLISHes. Before,
    the whole batch counted as failed: it was published again at every retry, forever, and
    nothing queued behind its 256 messages went out, so the others re-counted its decisions
    in flight while their ends waited in the queue (phantom load, never expired)."""
    import prefixroute.sync._redis as sync_redis

    caplog.set_level(logging.INFO, logger="prefixroute.sync")
    monkeypatch.setattr(sync_redis, "BACKOFF_MIN_S", 0.01)
    monkeypatch.setattr(sync_redis, "BACKOFF_MAX_S", 0.05)
    pub, sub = instance("pub", redis_server.url), instance("sub", redis_server.url)
    await sub.start()
    await pub.start()
    try:
        await until(lambda: sub.connected)
        admin = redis.Redis.from_url(redis_server.url)
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", "1")  # every write that needs memory is refused
        admin.close()
        n = 200  # more decisions than one batch, their ends queued behind them
        for i in range(n):
            view = pub.router.view(f"q{i}", tokens=[i] * 64)
            pub.routed(view, Decision(R, DecisionReason.PREFIX_MATCH, 0))
        for i in range(n):
            pub.completed(f"q{i}")
        await until(lambda: sample(pub, "prefixroute_sync_published_total") == 2 * n)
        await until(lambda: sample(sub, "prefixroute_sync_applied_total") == n)
        await until(lambda: sub.router.replica_load(R).in_flight == 0)
        await asyncio.sleep(0.3)  # several retries' time: nothing is published again
        assert sample(sub, "prefixroute_sync_applied_total") == n
        assert sample(pub, "prefixroute_sync_errors_total", kind="redis") >= 1  # seen
        assert caplog.text.count("refused the history") == 1  # once while it lasts
        assert "written again" not in caplog.text  # batches of ends alone write no history
    finally:
        await pub.stop()
        await sub.stop()


async def test_a_history_key_of_another_type_still_lets_the_sync_subscribe(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Another application's key under the history's name (WRONGTYPE): before, every
    subscription failed on reading it, so no instance heard any other while the publisher's
    log said "decisions are still shared" (an outside audit, 2026-12-06)."""
    admin = redis.Redis.from_url(redis_server.url)
    admin.set("c:history", "not a list")  # instance()'s channel is "c"
    admin.close()
    pub, sub = instance("pub", redis_server.url), instance("sub", redis_server.url)
    await sub.start()
    await pub.start()
    try:
        await until(lambda: sub.connected)
        view = pub.router.view("q", tokens=[1] * 64)
        pub.routed(view, Decision(R, DecisionReason.PREFIX_MATCH, 0))
        await until(lambda: sample(sub, "prefixroute_sync_applied_total") == 1)
        assert "cannot read the history" in caplog.text
    finally:
        await pub.stop()
        await sub.stop()


async def test_the_redis_password_stays_out_of_the_logs(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    admin = redis.Redis.from_url(redis_server.url)
    admin.config_set("requirepass", "s3cret-pw")
    admin.close()
    url = f"redis://:s3cret-pw@127.0.0.1:{redis_server.port}/0"
    sync = instance("me", url)
    with caplog.at_level(logging.DEBUG, logger="prefixroute.sync"):
        await sync.start()
        try:
            await until(lambda: sync.connected)
        finally:
            await sync.stop()
    assert "subscribed" in caplog.text
    assert "s3cret-pw" not in caplog.text


async def test_a_new_cause_in_one_outage_is_warned_of_again(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis down, then up with a password the URL lacks: before, only the first cause
    (connection refused) was ever warned of, the credentials' never (an outside audit)."""
    import prefixroute.sync._redis as sync_redis

    monkeypatch.setattr(sync_redis, "BACKOFF_MIN_S", 0.01)
    monkeypatch.setattr(sync_redis, "BACKOFF_MAX_S", 0.05)
    caplog.set_level(logging.WARNING, logger="prefixroute.sync")
    redis_server.stop()
    sync = instance("me", redis_server.url)
    await sync.start()
    try:
        await until(lambda: "sync through Redis failed" in caplog.text)
        redis_server.start("--requirepass", "another-pw")
        await until(lambda: "refused the URL's credentials" in caplog.text)
    finally:
        await sync.stop()


async def test_a_wrong_redis_password_is_named_in_the_log(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Retried with backoff like any outage (Redis trouble must not stop routing), but the
    warning says what to fix, without the password it was given."""
    admin = redis.Redis.from_url(redis_server.url)
    admin.config_set("requirepass", "right-pw")
    admin.close()
    sync = instance("me", f"redis://:wrong-pw@127.0.0.1:{redis_server.port}/0")
    with caplog.at_level(logging.WARNING, logger="prefixroute.sync"):
        await sync.start()
        try:
            await until(lambda: "credentials" in caplog.text)
            assert not sync.connected
        finally:
            await sync.stop()
    assert "Redis refused the URL's credentials" in caplog.text
    assert "wrong-pw" not in caplog.text


async def test_serve_logs_its_sync_url_without_the_password() -> None:
    from .helpers import read_until

    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "prefixroute.cli", "serve", "--port", "0", "--emulate", "1",
        "--emulate-time-scale", "0.01", "--sync-redis", "redis://:s3cret-pw@127.0.0.1:9/0",
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    seen: list[str] = []
    try:
        async with asyncio.timeout(30):
            await read_until(proc.stderr, r"gateway serving", seen)
    finally:
        proc.kill()
        await proc.wait()
    text = "".join(seen)
    assert "sharing decisions through redis://:***@127.0.0.1:9/0" in text, text
    assert "s3cret-pw" not in text


def test_redacted_hides_only_the_password() -> None:
    from prefixroute.sync import redacted

    assert redacted("redis://:pw@h:1/0") == "redis://:***@h:1/0"
    assert redacted("rediss://bob:pw@h/2") == "rediss://bob:***@h/2"
    assert redacted("redis://h:1/0") == "redis://h:1/0"
    assert redacted("redis://bob@h:1/0") == "redis://bob@h:1/0"  # a name alone is no secret
    assert redacted("redis://:pw@[::1/0") == "redis://***@[::1/0"  # unparseable: all of it
    # redis-py also takes the password as an option, and a '#' in one splits the URL there
    # (an outside audit: both printed the password in the start-up lines).
    assert redacted("redis://h:1/0?password=pw&db=2") == "redis://h:1/0?password=***&db=2"
    assert redacted("redis://:p#w@h:1/0") == "redis://***@h:1/0"


async def test_a_hung_redis_is_a_lost_subscription(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis stopped (SIGSTOP: as a hung server or a link that drops packets, nothing is
    closed): ``connected`` goes to 0 and the others' requests leave the load view, as when the
    subscription breaks (docs/deployment.md: "all of them are dropped when the subscription
    breaks, since their ends are lost meanwhile"; "Alert when connected stays at 0"). Before,
    both stayed as they were for as long as Redis hung (over a minute, seen with serve)."""
    import prefixroute.sync._redis as sync_redis

    monkeypatch.setattr(sync_redis, "HEARTBEAT_S", 0.5, raising=False)  # 5 s in production
    monkeypatch.setattr(sync_redis, "SOCKET_TIMEOUT_S", 0.5)
    pub, sub = instance("pub", redis_server.url), instance("sub", redis_server.url)
    await sub.start()
    await pub.start()
    assert redis_server.proc is not None
    pid = redis_server.proc.pid
    try:
        await until(lambda: sub.connected)
        view = pub.router.view("q1", tokens=[1] * 64)
        pub.routed(view, Decision(R, DecisionReason.PREFIX_MATCH, 0))
        await until(lambda: sub.router.replica_load(R).in_flight == 1)
        await asyncio.sleep(1.0)  # quiet a while: nothing but PINGs and their answers
        assert sub.connected
        os.kill(pid, signal.SIGSTOP)
        await until(lambda: not sub.connected, timeout_s=8)
        assert sub.router.replica_load(R).in_flight == 0  # its end can no longer be heard
        assert sample(sub, "prefixroute_sync_connected") == 0
        os.kill(pid, signal.SIGCONT)
        await until(lambda: sub.connected, timeout_s=8)  # and back once Redis answers
    finally:
        os.kill(pid, signal.SIGCONT)
        await pub.stop()
        await sub.stop()


async def test_stop_ends_a_task_that_lost_its_cancellation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A shutdown must not hang on the sync (a CI run once waited ten minutes on a
    subscription that went on after its cancellation). The subscriber here swallows the first
    cancellation, as a client library that turns it into a timeout would: stop() still ends."""
    import prefixroute._tasks as tasks

    monkeypatch.setattr(tasks, "STOP_WAIT_S", 0.05)
    sync = instance("stubborn", "redis://127.0.0.1:1/0")  # nothing is ever asked of it
    stubborn = Stubborn(takes=2)
    monkeypatch.setattr(sync, "_subscribe", stubborn.run)
    await sync.start()
    await asyncio.sleep(0.01)  # both tasks under way
    await asyncio.wait_for(sync.stop(), timeout=5)
    assert stubborn.swallowed == 2  # the first cancellation lost, the second taken
    assert not sync.connected
