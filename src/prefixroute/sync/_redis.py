"""Approximate mode across instances: share routing decisions through Redis PUB/SUB.

Each instance's index records only its own decisions, so behind a round-robin balancer a
conversation's second turn reaches an instance that never saw the first and may land on a cold
replica. With ``sync_redis`` every decision is published as (instance, replica, block hashes) on
one channel, and every instance applies the others' decisions to its own router
(``_remote``), which records them as it records its own: the indexes converge on the union
of all decisions. In precise mode a decision becomes a speculative entry at the other instances,
as it is at the instance that made it. Load is shared the same way: a decision carries the
request's id and sizes, and its first token and end follow as progress messages.

Why PUB/SUB and not a Redis Stream: a decision is useful for seconds (until the next turn), a
late one is harmless and a lost one costs one cache miss, so live sharing needs no storage, no
consumer state and no acknowledgements. PUB/SUB alone would lose what was sent while an
instance was away, and an instance started later (scale-out) would begin with an empty index.
So each batch is also pushed onto a capped list (``<channel>:history``, the last ``history``
decisions and withdrawals, trimmed in the same pipeline), and an instance reads it each time it
subscribes: after the subscription, so nothing falls between the two (a decision in both is
applied twice, which only refreshes it), oldest first, so recency in the index comes out as it
was, and without the decisions a withdrawal followed (their replicas computed none of it).
Precise mode keeps no history: the engines' events are its index.

The same sync serves the endpoint picker and the Ray Serve router: one channel and format. It
needs a ``Router`` and a Prometheus registry, and runs on the loop that calls ``start``. The
replica of each stored Responses API answer travels the same way, in the history too, so that a
conversation continued by id at any instance goes where its response is stored (``stored``).

Nothing here is on the request path. :meth:`RouteSync.routed` (and its ``first_token`` and
``completed``) puts the message in a bounded queue and returns; a full queue (Redis slow or
down) drops its oldest message and counts it. A publisher task drains the queue in pipelined
batches, a subscriber task applies what others sent. Redis down, at start or mid-run, costs
only the sharing: both tasks retry with exponential backoff, and routing goes on from the local
index meanwhile. The messages' format is in ``_wire``, the metrics in ``_metrics``.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from typing import Any

import redis.asyncio as aioredis
from prometheus_client.registry import CollectorRegistry
from redis.asyncio.client import PubSub
from redis.exceptions import AuthenticationError, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeout

from prefixroute._tasks import cancel_and_wait
from prefixroute.core import Decision, ReplicaId, RequestView, Router
from prefixroute.sync._history import without_withdrawn
from prefixroute.sync._metrics import SyncMetrics
from prefixroute.sync._remote import ALIVE_EVERY_S, RemoteRequests, StoredHook
from prefixroute.sync._signing import Signer
from prefixroute.sync._url import redacted
from prefixroute.sync._wire import (
    encode,
    encode_alive,
    encode_progress,
    encode_stored,
    encode_withdrawn,
)

log = logging.getLogger(__name__)

QUEUE_SIZE = 4096  # decisions waiting to be published; more are dropped
BATCH = 256  # decisions sent in one pipeline
BACKOFF_MIN_S = 0.05  # first reconnect delay, seconds
BACKOFF_MAX_S = 2.0  # longest reconnect delay, seconds
SOCKET_TIMEOUT_S = 2.0  # connect and command timeout, seconds
POLL_S = 1.0  # longest wait for one subscriber message, seconds
AUTH_SAID_EVERY_S = 60.0  # a live message's bad signature is logged at most this often
HEARTBEAT_S = 5.0  # a subscription quiet this long is PINGed (_listen), seconds
HISTORY = 4096  # decisions kept in Redis for instances that (re)connect later
HISTORY_CHUNK = 256  # history entries applied between yields to the event loop
FLUSH_S = 1.0  # longest wait at stop for the queue to go out (the drained requests' ends)


# One connection's work: runs until Redis fails; calls its argument once the link is up.
_Work = Callable[["aioredis.Redis", Callable[[], None]], Awaitable[None]]


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
        lock: AbstractContextManager[Any] | None = None,
        secret: str | None = None,
    ) -> None:
        self.url = url
        self.channel = channel
        self.history = history  # decisions kept for later instances; 0 = none
        self.history_key = f"{channel}:history"
        self.router = router
        self.instance_id = instance_id or uuid.uuid4().hex[:16]
        self.metrics = SyncMetrics(registry)
        self._signer = Signer(secret) if secret is not None else None  # (_signing)
        # ``lock``: held around every call into the router, for a router that other threads
        # also call (Ray Serve's); the gateway and the picker call theirs from one loop only.
        self.remote = RemoteRequests(
            router, self.instance_id, self.metrics, self.share_load, lock=lock,
            fresh_only=secret is not None,
        )  # fmt: skip
        # (payload, kept in the history): decisions are, progress messages are not
        self._queue: asyncio.Queue[tuple[bytes, bool]] = asyncio.Queue(QUEUE_SIZE)
        self._tasks: list[asyncio.Task[None]] = []
        self._connected = False
        self._unsent: list[tuple[bytes, bool]] = []  # a batch whose connection failed
        self._history_refused = False  # Redis refuses the history's writes (logged once)
        self._auth_said = -AUTH_SAID_EVERY_S  # when a message's bad signature was last logged
        self._open_ids: set[str] = set()  # our counted requests whose ends are not sent yet
        self._alive_seq = 0  # heartbeats sent

    @property
    def connected(self) -> bool:
        """Subscribed: the others' decisions reach this instance's index."""
        return self._connected

    def status(self) -> dict[str, bool | int]:
        """For /health: subscribed or not, and how many other instances are heard."""
        return {"connected": self._connected, "instances": self.remote.instances()}

    def _set_connected(self, up: bool) -> None:
        self._connected = up
        self.metrics.connected.set(1 if up else 0)

    # --- what the proxy (or the picker, or the Ray router) tells us: never blocks or raises ---
    def routed(self, view: RequestView, decision: Decision) -> None:
        """A request was routed: share the index entry and count it in the others' loads."""
        payload = encode(self.instance_id, decision.replica, view.block_hashes, view, decision)
        self._put(payload, keep=self.router.insert_on_route)  # precise mode keeps no history
        if self._tasks and view.request_id:
            self._open_ids.add(view.request_id)

    def first_token(self, request_id: str) -> None:
        self._put(encode_progress(self.instance_id, request_id, False), keep=False)

    def completed(self, request_id: str) -> None:
        self._put(encode_progress(self.instance_id, request_id, True), keep=False)
        self._open_ids.discard(request_id)

    def withdrawn(self, request_id: str) -> None:
        """The replica turned the request away: the others take back the blocks its decision
        added too. Kept in the history beside the decision (``_history.without_withdrawn``)."""
        payload = encode_withdrawn(self.instance_id, request_id)
        self._put(payload, keep=self.router.insert_on_route)  # as its decision was

    def stored(self, tenant: str | None, response_id: str, replica: ReplicaId) -> None:
        """``replica`` answered ``tenant``'s Responses API response ``response_id`` (and may
        store it): the others send its continuations there too. Kept in the history, so that
        an instance that starts later knows the recent ones."""
        self._put(encode_stored(self.instance_id, tenant, response_id, replica))

    @property
    def on_stored(self) -> StoredHook | None:
        """Where the others' stored responses are noted (the front end's map)."""
        return self.remote.on_stored

    @on_stored.setter
    def on_stored(self, hook: StoredHook | None) -> None:
        self.remote.on_stored = hook

    def _put(self, payload: bytes, keep: bool = True) -> None:
        if not self._tasks:
            return
        if len(self._unsent) + self._queue.qsize() >= QUEUE_SIZE:
            # Redis slow or down: the oldest message is the least useful, and the batch Redis
            # did not take is older than the queue (dropped first, the queue lost ends whose
            # decisions went out); oldest first, a decision goes before its progress messages.
            if self._unsent:
                self._unsent.pop(0)
            else:
                self._queue.get_nowait()
            self.metrics.dropped.inc()
        if self._signer is not None:
            payload = self._signer.sign(payload)
        self._queue.put_nowait((payload, keep))

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._forever(self._publish_some), name="sync-publisher"),
            asyncio.create_task(self._forever(self._subscribe), name="sync-subscriber"),
            asyncio.create_task(self._alive(), name="sync-alive"),
        ]

    async def _alive(self) -> None:
        """Say this instance is alive every ``ALIVE_EVERY_S``: the others drop the requests of
        one they stop hearing (``_remote``), as when it dies without sending their ends, and
        those beyond the count of ours still open that each heartbeat carries."""
        while True:
            await asyncio.sleep(ALIVE_EVERY_S)
            self._say_alive()

    def _say_alive(self) -> None:
        self._alive_seq += 1
        keys, seq = self.remote.keys, self._alive_seq
        self._put(encode_alive(self.instance_id, seq, len(self._open_ids), keys), keep=False)

    async def stop(self) -> None:
        """End both tasks; returns once they have ended (:func:`cancel_and_wait`, which also
        outlasts a cancellation lost inside the client). First, for up to ``FLUSH_S``, the queue
        goes out, a heartbeat last: cancelled unsent, the drained requests' ends were lost."""
        if self._tasks:
            self._say_alive()
            deadline = time.monotonic() + FLUSH_S
            while (not self._queue.empty() or self._unsent) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
        tasks, self._tasks = self._tasks, []
        # return_exceptions: a task that had failed must not keep the other running
        await asyncio.gather(*map(cancel_and_wait, tasks), return_exceptions=True)
        self._set_connected(False)
        self.remote.forget()

    def _client(self) -> aioredis.Redis:
        # No retries of our own inside redis-py: a failure goes back to _forever's backoff.
        return aioredis.Redis.from_url(
            self.url,
            socket_timeout=SOCKET_TIMEOUT_S,
            socket_connect_timeout=SOCKET_TIMEOUT_S,
            retry=None,
            health_check_interval=30,  # PING a connection idle this long before using it
        )

    async def _forever(self, work: _Work) -> None:
        """Run ``work`` with a fresh client; on a Redis failure wait (backoff) and start again."""
        delay = BACKOFF_MIN_S
        said = ""  # the last failure logged at WARNING: a new kind is logged again

        def up() -> None:
            nonlocal delay, said
            delay, said = BACKOFF_MIN_S, ""

        while True:
            client = None
            try:
                # Built inside the try: a URL redis-py rejects raised here, outside it, and
                # ended the task with nothing logged or counted (GatewayConfig now rejects
                # such URLs at start; a caller that skips the check still gets retries).
                client = self._client()
                await work(client, up)
            except (RedisError, OSError) as exc:
                self.metrics.errors.labels("redis").inc()
                # A wrong password is no outage that passes: say so in words an operator acts on.
                why = "Redis refused the URL's credentials" if isinstance(
                    exc, AuthenticationError) else "sync through Redis failed"  # fmt: skip
                # Once per outage, and again when its cause changes (Redis down at start,
                # then a wrong password: before, only "connection refused" was ever logged).
                kind = f"{why}: {type(exc).__name__}"
                level = logging.WARNING if kind != said else _level(delay)
                said = kind
                log.log(level, "%s (%s); routing local-only", why, exc)
            except Exception:  # a bug must not end the sharing for good: log it, start over
                self.metrics.errors.labels("internal").inc()
                level = _level(delay, logging.ERROR)  # a traceback per spell, not per retry
                log.log(level, "sync: unexpected error; restarting", exc_info=True)
            finally:
                if work == self._subscribe:
                    self._set_connected(False)
                    self.remote.forget()  # their ends may be lost while we are away
                if client is not None:
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
                # A refused command comes back in its place (a lost connection still raises).
                results = await pipe.execute(raise_on_error=False)
            refused = [r for r in results[: len(batch)] if isinstance(r, Exception)]
            if refused:
                raise refused[0]  # not published: the batch waits for the retry
            # Published: the batch is sent, whatever became of the history. Before, a Redis at
            # maxmemory (it refuses LPUSH, never PUBLISH) failed the whole batch: the others got
            # it again at every retry, forever, and nothing queued behind it went out.
            self._unsent = []
            self._history_written(results[len(batch) :])
            up()
            self.metrics.published.inc(len(batch))

    def _history_written(self, results: list[Any]) -> None:
        """Count and log (once per spell) the history's refused writes (a Redis at maxmemory, a
        key of another type). Sharing goes on; instances that (re)connect start colder."""
        if not results:
            return  # a batch with nothing for the history (first tokens, ends) tells nothing
        refused = next((r for r in results if isinstance(r, Exception)), None)
        if refused is None:
            if self._history_refused:
                log.info("sync: the history in %s is written again", self.history_key)
            self._history_refused = False
            return
        self.metrics.errors.labels("redis").inc()
        if not self._history_refused:
            log.warning(
                "sync: Redis refused the history in %s (%s): decisions are still shared, but "
                "instances that start or reconnect now miss them",
                self.history_key,
                refused,
            )
        self._history_refused = True

    async def _subscribe(self, client: aioredis.Redis, up: Callable[[], None]) -> None:
        async with client.pubsub(ignore_subscribe_messages=True) as pubsub:
            await pubsub.subscribe(self.channel)
            await self._replay(client)  # caught up before we say so
            self._set_connected(True)
            up()
            log.info("sync: subscribed to %s on %s", self.channel, redacted(self.url))
            await self._listen(pubsub)

    async def _listen(self, pubsub: PubSub) -> None:
        """Apply the others' messages; PING a quiet subscription, and give it up (a
        ``TimeoutError``: ``_forever`` reconnects) when the PING goes unanswered.

        A Redis that hangs (SIGSTOP, a full disk) or a link that drops packets closes nothing,
        and redis-py's health check only sends its PING, never waits for the answer: the
        subscription looked alive for as long as it lasted, ``connected`` stayed 1 and the
        others' requests stayed counted in flight, their ends never heard."""
        heard = time.monotonic()  # last reply of any kind on this connection
        pinged_at: float | None = None  # our PING still unanswered since
        while True:
            message = await pubsub.get_message(timeout=POLL_S)
            now = time.monotonic()
            if message is not None:  # a PONG too
                heard, pinged_at = now, None
                if message.get("type") == "message" and (data := self._open(message["data"], True)):
                    self.remote.apply(data)
            elif pinged_at is not None and now - pinged_at > SOCKET_TIMEOUT_S:
                raise RedisTimeout(f"no answer to PING in {SOCKET_TIMEOUT_S:g} s")
            elif pinged_at is None and now - heard >= HEARTBEAT_S:
                await pubsub.ping()  # sent only: its PONG comes back through get_message
                pinged_at = now
            self.remote.expire_due(now)

    async def _replay(self, client: aioredis.Redis) -> None:
        """Apply the history, oldest first: what was decided before this (re)connection."""
        if not self.history or not self.router.insert_on_route:
            return  # off, or precise mode: the engines' events are the index
        try:
            payloads = await client.lrange(self.history_key, 0, self.history - 1)
        except ResponseError as exc:  # a key of another type: no history, sharing goes on
            self.metrics.errors.labels("redis").inc()  # (it failed every subscription)
            log.warning("sync: cannot read the history in %s (%s)", self.history_key, exc)
            return
        applied = 0
        opened = [self._open(p) for p in payloads if isinstance(p, bytes)]  # always bytes
        kept = without_withdrawn([p for p in opened if p is not None])
        for i, payload in enumerate(kept):
            if i and not i % HISTORY_CHUNK:
                await asyncio.sleep(0)  # thousands of inserts: let requests through meanwhile
            applied += self.remote.apply(payload, live=False)
        self.metrics.replayed.inc(applied)
        if payloads:
            log.info("sync: applied %d of %d decisions from the history", applied, len(payloads))

    def _open(self, message: bytes, live: bool = False) -> bytes | None:
        """``message``'s payload, its signature checked under ``secret`` (_signing); None
        (counted) when it does not match, and said once a minute of a ``live`` one: instances
        with different secrets share nothing, and that showed only in a counter. Without a
        secret, ``message`` itself."""
        if self._signer is None:
            return message
        payload = self._signer.open(message)
        if payload is None:
            self.metrics.errors.labels("auth").inc()
            if live and time.monotonic() - self._auth_said >= AUTH_SAID_EVERY_S:
                self._auth_said = time.monotonic()
                log.warning("sync: a message on the channel failed its signature check: another "
                            "instance with a different sync secret, or none? Not applied")
        return payload


def _level(delay: float, first: int = logging.WARNING) -> int:
    """``first`` once per outage (read after the work failed: ``up`` has reset ``delay`` if
    the link was up meanwhile); the retries that follow are logged at debug level."""
    return first if delay == BACKOFF_MIN_S else logging.DEBUG
