"""Approximate mode across instances: share routing decisions through Redis PUB/SUB.

Each instance's index records only its own decisions, so behind a round-robin balancer a
conversation's second turn reaches an instance that never saw the first and may land on a cold
replica. With ``sync_redis`` every decision is published as (instance, replica, block hashes) on
one channel, and every instance applies the others' decisions to its own index with the same
``index.insert`` its router uses: the indexes converge on the union of all decisions.

Why PUB/SUB and not a Redis Stream: a decision is useful for seconds (until the next turn), a
late one is harmless and a lost one costs one cache miss, so live sharing needs no storage, no
consumer state and no acknowledgements. PUB/SUB alone would lose what was sent while an
instance was away, and an instance started later (scale-out) would begin with an empty index.
So each batch is also pushed onto a capped list (``<channel>:history``, the last ``history``
decisions, trimmed in the same pipeline), and an instance reads it each time it subscribes:
after the subscription, so nothing falls between the two (a decision in both is applied twice,
which only refreshes it), and oldest first, so recency in the index comes out as it was.

In precise mode the index follows the engines' KV events, which every instance hears, so a
decision is not inserted: it becomes a speculative entry at the other instances, as it is at
the instance that made it, until the engine's events come back. Without it, instances routing
a new prefix at once could send it to one replica each. Precise mode keeps no history.

Load is shared the same way. A decision carries the request's id and sizes, and a request's
first token and end follow as small progress messages, so every instance counts the others'
requests in flight in its load view (``LoadTracker.count_dispatch``): without that, each
instance sees only a third of the load behind a three-way balancer, and all of them pile a
conversation's turns onto the replica that holds it. Only live messages count (the history
replays index entries, never load). A remote request whose end never arrives (its instance
died, or this one was disconnected) is dropped after ``REMOTE_TTL_S``, and all of them are
dropped when the subscription breaks, since its progress messages are lost meanwhile.

Nothing here is on the request path. :meth:`RouteSync.publish` puts the message in a bounded
queue and returns; a full queue (Redis slow or down) drops its oldest message and counts it.
A publisher task drains the queue in pipelined batches, a subscriber task applies what others
sent. Redis down, at start or mid-run, costs only the sharing: both tasks retry with
exponential backoff, and routing goes on from the local index meanwhile. Decisions are
encoded as msgpack arrays with the hashes as little-endian uint64 bytes (8 bytes a block).
"""

from __future__ import annotations

import array
import asyncio
import logging
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Annotated

import msgspec
import redis.asyncio as aioredis
from prometheus_client import Counter, Gauge
from prometheus_client.registry import CollectorRegistry
from redis.exceptions import RedisError

from prefixroute.core import BlockHash, Decision, ReplicaId, RequestView, Router

log = logging.getLogger(__name__)

QUEUE_SIZE = 4096  # decisions waiting to be published; more are dropped
BATCH = 256  # decisions sent in one pipeline
BACKOFF_MIN_S = 0.05  # first reconnect delay, seconds
BACKOFF_MAX_S = 2.0  # longest reconnect delay, seconds
SOCKET_TIMEOUT_S = 2.0  # connect and command timeout, seconds
POLL_S = 1.0  # longest wait for one subscriber message, seconds
HISTORY = 4096  # decisions kept in Redis for instances that (re)connect later
HISTORY_CHUNK = 256  # history entries applied between yields to the event loop
REMOTE_TTL_S = 600.0  # a remote request not heard of for this long is taken as over, seconds
EXPIRE_EVERY_S = 1.0  # how often remote requests are checked for expiry, seconds


# One connection's work: runs until Redis fails; calls its argument once the link is up.
_Work = Callable[["aioredis.Redis", Callable[[], None]], Awaitable[None]]


Size = Annotated[int, msgspec.Meta(ge=0)]  # a negative size is a decode error, not load


class Routed(msgspec.Struct, array_like=True, frozen=True, tag=0):
    """One routing decision as it travels, a msgpack array led by its tag (0)."""

    instance: str  # the publishing instance's id (its own messages are ignored)
    replica: str  # replica id (normalized base URL): instances must name replicas alike
    hashes: bytes  # the request's block hashes, little-endian uint64, root first
    request_id: str = ""  # the publisher's id for the request ("": not counted as load)
    prompt_tokens: Size = 0  # the request's sizes, for the others' load views, tokens
    output_tokens: Size = 0
    predicted_cached_tokens: Size = 0

    def block_hashes(self) -> list[BlockHash]:
        """The hashes as ints; ValueError unless a whole number of 8-byte hashes."""
        packed = array.array("Q")
        packed.frombytes(self.hashes)
        if sys.byteorder != "little":
            packed.byteswap()
        return [BlockHash(h) for h in packed]


class Progress(msgspec.Struct, array_like=True, frozen=True, tag=1):
    """A routed request's first token (``done`` false) or end (``done`` true)."""

    instance: str
    request_id: str
    done: bool


Message = Routed | Progress

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)


def encode(
    instance: str,
    replica: ReplicaId,
    hashes: Sequence[BlockHash],
    view: RequestView | None = None,
    decision: Decision | None = None,
) -> bytes:
    """A decision; with ``view`` and ``decision``, also the request's id and sizes."""
    packed = array.array("Q", hashes)
    if sys.byteorder != "little":
        packed.byteswap()
    if view is None or decision is None:
        return _encoder.encode(Routed(instance, replica, packed.tobytes()))
    return _encoder.encode(
        Routed(
            instance,
            replica,
            packed.tobytes(),
            view.request_id,
            view.prompt_tokens,
            view.output_tokens,
            decision.predicted_cached_tokens,
        )
    )


def encode_progress(instance: str, request_id: str, done: bool) -> bytes:
    return _encoder.encode(Progress(instance, request_id, done))


def decode(payload: bytes) -> Message:
    """A message; raises ``msgspec.DecodeError`` (ValueError comes from ``block_hashes``)."""
    return _decoder.decode(payload)


class SyncMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.published = Counter(
            "prefixroute_sync_published",
            "Routing decisions published to the other instances.",
            registry=registry,
        )
        self.applied = Counter(
            "prefixroute_sync_applied",
            "Other instances' routing decisions applied to this instance's index.",
            registry=registry,
        )
        self.dropped = Counter(
            "prefixroute_sync_dropped",
            "Routing decisions not published because the queue was full (Redis slow or down).",
            registry=registry,
        )
        self.errors = Counter(
            "prefixroute_sync_errors",
            "Sync failures: redis (connection lost or refused, timeouts), decode, internal.",
            ["kind"],
            registry=registry,
        )
        self.replayed = Counter(
            "prefixroute_sync_replayed",
            "Decisions applied from the Redis history on (re)connecting (warm start).",
            registry=registry,
        )
        self.connected = Gauge(
            "prefixroute_sync_connected",
            "1 while subscribed to the other instances' decisions (history applied), else 0.",
            registry=registry,
        )
        self.remote_in_flight = Gauge(
            "prefixroute_sync_remote_in_flight",
            "Other instances' requests counted in this instance's load view.",
            registry=registry,
        )
        self.expired = Counter(
            "prefixroute_sync_expired",
            "Other instances' requests dropped from the load view without hearing their end.",
            registry=registry,
        )


class RouteSync:
    """Publishes this instance's decisions and applies the others', for the app's lifetime."""

    # Count the others' requests in the load view. Off only to measure what it is worth
    # (benchmarks/multi_instance.py); the index entries are shared either way.
    share_load: bool = True

    def __init__(
        self,
        url: str,
        channel: str,
        router: Router,
        registry: CollectorRegistry,
        instance_id: str | None = None,
        history: int = HISTORY,
    ) -> None:
        self.url = url
        self.channel = channel
        self.history = history  # decisions kept for later instances; 0 = none
        self.history_key = f"{channel}:history"
        self.router = router
        self.instance_id = instance_id or uuid.uuid4().hex[:16]
        self.metrics = SyncMetrics(registry)
        # (payload, kept in the history): decisions are, progress messages are not
        self._queue: asyncio.Queue[tuple[bytes, bool]] = asyncio.Queue(QUEUE_SIZE)
        self._tasks: list[asyncio.Task[None]] = []
        self._connected = False
        self._unsent: list[tuple[bytes, bool]] = []  # a batch whose connection failed
        # Others' requests counted in the router's load view: "instance/request id" -> when
        # dispatched (time.monotonic()), oldest first, for expiry.
        self._remote: dict[str, float] = {}
        self._expired_at = 0.0  # last expiry pass, time.monotonic()
        self.metrics.remote_in_flight.set_function(lambda: len(self._remote))

    @property
    def connected(self) -> bool:
        """Subscribed: the others' decisions reach this instance's index."""
        return self._connected

    def _set_connected(self, up: bool) -> None:
        self._connected = up
        self.metrics.connected.set(1 if up else 0)

    # --- what the proxy tells us (never blocks, never raises) --------------------------------
    def routed(self, view: RequestView, decision: Decision) -> None:
        """A request was routed: share the index entry and count it in the others' loads."""
        payload = encode(self.instance_id, decision.replica, view.block_hashes, view, decision)
        self._put(payload, keep=self.router.insert_on_route)  # precise mode keeps no history

    def first_token(self, request_id: str) -> None:
        self._put(encode_progress(self.instance_id, request_id, False), keep=False)

    def completed(self, request_id: str) -> None:
        self._put(encode_progress(self.instance_id, request_id, True), keep=False)

    def _put(self, payload: bytes, keep: bool = True) -> None:
        if not self._tasks:
            return
        if self._queue.full():  # Redis slow or down: the oldest message is the least useful
            self._queue.get_nowait()
            self.metrics.dropped.inc()
        self._queue.put_nowait((payload, keep))

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._forever(self._publish_some), name="sync-publisher"),
            asyncio.create_task(self._forever(self._subscribe), name="sync-subscriber"),
        ]

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._set_connected(False)
        self._forget_remote()

    def _client(self) -> aioredis.Redis:
        # No retries of our own inside redis-py: a failure goes back to _forever's backoff.
        return aioredis.Redis.from_url(
            self.url,
            socket_timeout=SOCKET_TIMEOUT_S,
            socket_connect_timeout=SOCKET_TIMEOUT_S,
            retry=None,
            health_check_interval=30,  # PING an idle subscription: finds a silently dead link
        )

    async def _forever(self, work: _Work) -> None:
        """Run ``work`` with a fresh client; on a Redis failure wait (backoff) and start again."""
        delay = BACKOFF_MIN_S

        def up() -> None:
            nonlocal delay
            delay = BACKOFF_MIN_S

        while True:
            client = self._client()
            try:
                await work(client, up)
            except (RedisError, OSError) as exc:
                self.metrics.errors.labels("redis").inc()
                # Warn once per outage; the retries that follow are logged at debug level.
                level = logging.WARNING if delay == BACKOFF_MIN_S else logging.DEBUG
                log.log(level, "sync through Redis failed (%s); routing local-only", exc)
            except Exception:  # a bug must not end the sharing for good: log it, start over
                self.metrics.errors.labels("internal").inc()
                log.exception("sync: unexpected error; restarting")
            finally:
                if work == self._subscribe:
                    self._set_connected(False)
                    self._forget_remote()  # their ends may be lost while we are away
                await client.aclose()
            await asyncio.sleep(delay)
            delay = min(delay * 2, BACKOFF_MAX_S)

    async def _publish_some(self, client: aioredis.Redis, up: Callable[[], None]) -> None:
        while True:
            batch, self._unsent = self._unsent or [await self._queue.get()], []
            while len(batch) < BATCH and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            self._unsent = batch  # until Redis took it; a failure leaves it for the next try
            async with client.pipeline(transaction=False) as pipe:
                for payload, _ in batch:
                    pipe.publish(self.channel, payload)
                kept = [payload for payload, keep in batch if keep]
                if self.history and kept:
                    pipe.lpush(self.history_key, *kept)  # newest first
                    pipe.ltrim(self.history_key, 0, self.history - 1)
                await pipe.execute()
            self._unsent = []
            up()
            self.metrics.published.inc(len(batch))

    async def _subscribe(self, client: aioredis.Redis, up: Callable[[], None]) -> None:
        async with client.pubsub(ignore_subscribe_messages=True) as pubsub:
            await pubsub.subscribe(self.channel)
            await self._replay(client)  # caught up before we say so
            self._set_connected(True)
            up()
            log.info("sync: subscribed to %s on %s", self.channel, self.url)
            while True:
                message = await pubsub.get_message(timeout=POLL_S)
                if message is not None and message.get("type") == "message":
                    self._apply(message["data"])
                now = time.monotonic()
                if now - self._expired_at >= EXPIRE_EVERY_S:
                    self._expire(now)

    async def _replay(self, client: aioredis.Redis) -> None:
        """Apply the history, oldest first: what was decided before this (re)connection."""
        if not self.history or not self.router.insert_on_route:
            return  # off, or precise mode: the engines' events are the index
        payloads = await client.lrange(self.history_key, 0, self.history - 1)
        applied = 0
        for i, payload in enumerate(reversed(payloads)):
            if i and not i % HISTORY_CHUNK:
                await asyncio.sleep(0)  # thousands of inserts: let requests through meanwhile
            if isinstance(payload, bytes):  # always, without decode_responses
                applied += self._apply(payload, count=False)
        self.metrics.replayed.inc(applied)
        if payloads:
            log.info("sync: applied %d of %d decisions from the history", applied, len(payloads))

    def _apply(self, payload: bytes, count: bool = True) -> bool:
        """Apply another instance's message; False when skipped (ours, unknown, undecodable).

        ``count`` is False for the history: its decisions go into the index, and neither they
        nor anything else from it counts as load (those requests are long over).
        """
        try:
            msg = decode(payload)
        except msgspec.DecodeError:
            self.metrics.errors.labels("decode").inc()
            return False
        if msg.instance == self.instance_id:
            return False  # our own: in the index and the load view already
        if isinstance(msg, Progress):
            if count:
                self._progress(f"{msg.instance}/{msg.request_id}", msg.done)
            return False  # not a decision
        try:  # only now: every instance also hears its own decisions, whose hashes it has
            hashes = msg.block_hashes()
        except ValueError:
            self.metrics.errors.labels("decode").inc()
            return False
        replica = ReplicaId(msg.replica)
        if not self.router.has_replica(replica):
            return False  # a replica we don't route to
        if hashes and self.router.insert_on_route:
            self.router.index.insert(replica, hashes)
        elif hashes and count and self.router.speculative is not None:
            self.router.speculative.add(replica, hashes, time.monotonic())  # precise mode
        if count:
            self.metrics.applied.inc()
            if msg.request_id and self.share_load:
                self._count(msg, replica)
        return True

    # --- the others' load -------------------------------------------------------------------
    def _count(self, msg: Routed, replica: ReplicaId) -> None:
        key = f"{msg.instance}/{msg.request_id}"
        now = time.monotonic()
        self.router.loads.count_dispatch(
            key,
            replica,
            prompt_tokens=msg.prompt_tokens,
            output_tokens=msg.output_tokens,
            predicted_cached_tokens=msg.predicted_cached_tokens,
            now=now,
        )
        self._remote.pop(key, None)  # a retry re-dispatches: it moves to the young end
        self._remote[key] = now

    def _progress(self, key: str, done: bool) -> None:
        if key not in self._remote:
            return  # routed before we subscribed, or already expired
        now = time.monotonic()
        if done:
            del self._remote[key]
            self.router.loads.complete(key, now)
        else:
            # Heard through Redis, late by the message's trip: not a measured first token.
            self.router.loads.first_token(key, now, measured=False)

    def _expire(self, now: float) -> None:
        """Drop remote requests dispatched more than ``REMOTE_TTL_S`` ago (end never heard)."""
        self._expired_at = now
        cutoff = now - REMOTE_TTL_S
        stale = []
        for key, at in self._remote.items():
            if at > cutoff:
                break  # oldest first: the rest are younger
            stale.append(key)
        for key in stale:
            del self._remote[key]
            self.router.loads.complete(key, now)
        self.metrics.expired.inc(len(stale))

    def _forget_remote(self) -> None:
        """Drop every remote request from the load view (their ends can no longer be heard)."""
        now = time.monotonic()
        for key in self._remote:
            self.router.loads.complete(key, now)
        self._remote.clear()
