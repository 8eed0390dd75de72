"""The Redis sync in the failures a fleet meets (docs/deployment.md, "Several instances,
approximate mode"): a malformed ``sync_redis`` URL.

Found by an audit that ran ``prefixroute serve`` instances against a real ``redis-server``.
"""

from __future__ import annotations

import asyncio
import sys

import pytest
from polling import until
from prometheus_client.registry import CollectorRegistry

from prefixroute.core import (
    ConfigError,
    ReplicaId,
    Router,
    make_policy,
)
from prefixroute.gateway import GatewayConfig
from prefixroute.sync import RouteSync

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


async def test_a_sync_whose_client_cannot_be_built_keeps_trying_and_counts_it() -> None:
    """Past the config check (a caller that builds RouteSync itself): the failure is counted
    and retried like any other, never a task that ends unseen."""
    sync = instance("me", "redis://127.0.0.1:notaport/0")
    await sync.start()
    try:
        await until(lambda: sample(sync, "prefixroute_sync_errors_total", kind="internal") >= 2)
        assert all(not t.done() for t in sync._tasks)
    finally:
        await sync.stop()
