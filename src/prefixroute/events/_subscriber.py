"""One replica's KV-event stream: a ZMQ SUB socket read by an asyncio task.

Each message goes through three steps: its sequence number is checked, its payload decoded, its
events applied to the replica's :class:`PreciseIndexer`. What goes wrong is handled so that the
index never trusts entries the engine may no longer hold:

* **A gap** (numbers skipped: the PUB socket dropped batches, or we were slow). With a replay
  endpoint we ask the engine for the missing batches (vLLM's ROUTER protocol: send the first
  missing number; receive ``[topic, seq, payload]`` up to an end marker, sequence -1) and apply
  them in order.
  Without one, or when the replay does not cover the gap, we clear the replica's entries and
  mark it resyncing.
* **A late join** (the first number heard is not 0: the engine ran before we listened, or its
  first batch was lost, as a PUB socket's first usually is). With a replay endpoint we ask for
  every batch before it that the engine still buffers and apply them first: a young engine's
  whole stream, or an old one's recent stores and evictions.
* **A restart** (a number not above the last: a new engine counts from 0 again). Its cache
  started empty, so we clear and carry on from the new stream. The socket's monitor also
  tells every disconnection of the publisher: the next batch then starts a new stream (clear,
  then the late join's catch-up), whatever its number.
* **AllBlocksCleared** clears the replica's entries, and after it we are exactly in step again.

State: ``waiting`` until the first batch; ``live`` while the stream is known to be complete;
``resyncing`` after we cleared for a gap or joined a stream late, meaning the engine may hold
blocks it told us about before we listened. Those entries are rebuilt as the engine stores them
again; an AllBlocksCleared or a fresh engine (sequence 0) makes the replica ``live`` again.

A payload that does not decode is counted and skipped; the stream goes on. An event of a type
we do not know (a newer engine's) is counted and skipped, its type logged once, and the rest
of its batch applies. Any other error while handling a message is logged (one line) and clears
the replica (cause ``error``): the stream goes on then too. A message over
``MAX_MESSAGE_BYTES`` is never read (ZMQ drops its sender, and the gap that follows is handled as
any other), and a replay keeps at most ``REPLAY_MAX_BYTES``. The socket and the replay socket
come from one ``zmq.asyncio.Context`` owned by whoever starts subscribers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from prefixroute._tasks import cancel_and_wait
from prefixroute._tracebacks import WarningLimiter
from prefixroute.core import ReplicaId
from prefixroute.events._decode import read_batch
from prefixroute.events._endpoint import EventEndpoint, is_ipv6
from prefixroute.events._errors import BadEndpoint, EventDecodeError
from prefixroute.events._indexer import PreciseIndexer
from prefixroute.events._sequence import SeqOutcome, SequenceTracker
from prefixroute.events._wire import (
    END_SEQ,
    AllBlocksCleared,
    KVEventBatch,
    decode_seq,
    unpack_frames,
)

log = logging.getLogger(__name__)
RESYNC_SAID = "KV events of %s: %s; entries cleared, resyncing"  # pragma: no mutate (a log line)

REPLAY_TIMEOUT_S = 1.0  # seconds to wait for each replayed batch before giving up
REPLAY_DEADLINE_S = 10.0  # seconds for a whole replay, however its replies come
APPLY_CHUNK = 256  # replayed batches applied between yields to the event loop
UNKNOWN_TYPES_LOGGED = 16  # distinct unknown event types logged (and remembered) per stream
RCV_HWM = 100_000  # messages queued in our socket before ZMQ drops (vLLM's own default)
# The largest message read: ZMQ drops a peer that sends more. A vLLM batch is one engine step's
# events, each stored block with its token ids (~5 bytes a token): a step of 64k prefilled
# tokens is about 0.4 MB, so this leaves 100x room while a peer on a bound port (or a broken
# publisher) cannot make us buffer gigabytes per message.
MAX_MESSAGE_BYTES = 64 << 20
REPLAY_MAX_BYTES = 512 << 20  # payloads kept from one replay; past it, the replay failed


class StreamState(StrEnum):
    WAITING = "waiting"  # no batch received yet
    LIVE = "live"  # every batch since a known-empty cache (or since start at seq 0) applied
    RESYNCING = "resyncing"  # cleared after a gap or a late join: rebuilding from new events


@dataclass(slots=True)
class StreamStats:
    """Counts since creation, for /metrics."""

    batches: int = 0  # batches applied (replayed ones included)
    events: int = 0  # events in those batches
    gaps: int = 0  # times sequence numbers were skipped
    missed: int = 0  # batches lost to gaps (replayed or not)
    replayed: int = 0  # batches recovered through the replay socket
    replay_failures: int = 0  # gaps the replay did not close
    caught_up: int = 0  # batches from before we listened, applied from the replay (_join)
    last_batch_at: float | None = None  # time.monotonic() of the last batch applied
    restarts: int = 0  # sequence resets (publisher restarted)
    resyncs: dict[str, int] = field(default_factory=dict)  # entries cleared, by cause
    decode_errors: int = 0  # messages that were not KV-event batches
    unknown_events: int = 0  # events of types we do not know, skipped (a newer engine's)


class EventSubscriber:
    """Reads one replica's KV events into its indexer until stopped."""

    def __init__(
        self,
        endpoint: EventEndpoint,
        indexer: PreciseIndexer,
        context: zmq.asyncio.Context,
        *,
        replay_timeout_s: float = REPLAY_TIMEOUT_S,
    ) -> None:
        self.endpoint = endpoint
        self.indexer = indexer
        self.context = context
        self.replay_timeout_s = replay_timeout_s
        self.stats = StreamStats()
        self.state = StreamState.WAITING
        self.sequence = SequenceTracker()
        self.address: str | None = None  # the bound or connected address, once started
        self._socket: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None
        self._unknown_seen: set[str] = set()  # unknown event types already logged
        self._monitor: asyncio.Task[None] | None = None  # reads the socket's disconnections
        self._watching: zmq.asyncio.Socket | None = None  # from this monitor socket
        self._rejoin = False  # a peer went away: the next batch starts a new stream
        self.publishers = 0  # engines connected to our bound address (bind mode only)
        self._said = WarningLimiter(log)  # a peer's repeated bad messages: once a minute a kind

    @property
    def replica(self) -> ReplicaId:
        return self.indexer.replica

    # --- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        """Bind or connect, and start reading. Raises BadEndpoint if the address is unusable."""
        self.open()

    def open(self) -> None:
        """:meth:`start`, from a plain function on the running loop (ZMQ binds and connects
        at once): a replica's stream starts as the registry adds it, in the same step."""
        if self._task is not None:
            return
        sock = self.context.socket(zmq.SUB)
        try:
            sock.setsockopt(zmq.RCVHWM, RCV_HWM)
            sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SUBSCRIBE, self.endpoint.topic.encode())
            self.address = _attach(sock, self.endpoint.address, self.endpoint.bind)
        except BaseException:
            sock.close(linger=0)
            raise
        self._socket = sock
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._run(), name=f"kv-events {self.replica}")
        peers = zmq.EVENT_DISCONNECTED | zmq.EVENT_ACCEPTED
        self._watching = watch = sock.get_monitor_socket(peers)
        self._monitor = loop.create_task(self._watch(watch), name=f"kv-peers {self.replica}")
        log.info("KV events of %s: %s", self.replica, self.endpoint)

    async def stop(self) -> None:
        task, self._task = self._task, None
        monitor, self._monitor = self._monitor, None
        await cancel_and_wait(task)
        await cancel_and_wait(monitor)
        sock, self._socket = self._socket, None
        watching, self._watching = self._watching, None
        if sock is not None:
            sock.disable_monitor()
            sock.close(linger=0)
        if watching is not None:  # here, not in _watch: a task cancelled unstarted runs no
            watching.close(linger=0)  # finally, and an open socket hangs the context's term

    async def _watch(self, monitor: zmq.asyncio.Socket) -> None:
        """Note every disconnection of the publisher: an engine that restarts comes back
        with an empty cache and a new stream, whose first number we may never hear (lost to
        the PUB socket), so the next batch starts over (:meth:`receive`). Before, a restarted
        engine whose first heard number came after the old stream's last was taken for the
        old one, and every entry of the old engine stayed, routed on but no longer held.
        On a bound address it also counts the publishers connected, and warns when there
        are two: a misconfiguration no sequence number can sort out."""
        while True:
            event = parse_monitor_message(await monitor.recv_multipart())
            if event["event"] == zmq.EVENT_DISCONNECTED:
                self._rejoin = True
                self.publishers = max(0, self.publishers - 1)
            elif event["event"] == zmq.EVENT_ACCEPTED:  # a publisher reached our bound port
                self.publishers += 1
                if self.publishers > 1:
                    # Two engines on one address: their batches interleave, each switch reads
                    # as a restart, and the index is cleared all the time.
                    log.warning(
                        "KV events of %s: %d publishers connected to %s; each engine needs "
                        "an address of its own", self.replica, self.publishers, self.address,
                    )  # fmt: skip

    # --- the stream -----------------------------------------------------------------------
    async def _run(self) -> None:
        assert self._socket is not None
        sock = self._socket
        while True:
            frames = await sock.recv_multipart()
            try:
                await self.receive(frames)
            except EventDecodeError as exc:
                self.stats.decode_errors += 1
                self._said.warning("decode", "KV events of %s: %s", self.replica, exc)
            except Exception as exc:  # noqa: BLE001 - one message must not end the stream
                # A message we did not foresee: its batch may be half applied, so the entries
                # are cleared (cause "error") and the next message is read as usual.
                self._resync(f"error ({type(exc).__name__}: {exc})", cause="error")

    async def receive(self, frames: list[bytes]) -> None:
        """Handle one published message (sequence check, replay or resync, then apply)."""
        _, seq, payload = unpack_frames(frames)
        batch = self._decode(payload)  # a bad payload leaves the sequence untouched
        if self._rejoin:  # the publisher went away meanwhile: maybe another engine now
            self._rejoin = False
            self.sequence = SequenceTracker()
            self._resync("publisher reconnected", cause="reconnect")
        missing = self.sequence.missing(seq)
        outcome = self.sequence.observe(seq)
        if outcome is SeqOutcome.FIRST:
            # A stream that starts at 0 is a fresh engine with an empty cache; any other number
            # means it ran before we listened and may hold blocks we never heard of, unless
            # its replay endpoint still has every batch before (_join).
            whole = seq == 0 or await self._join(seq)
            self.state = StreamState.LIVE if whole else StreamState.RESYNCING
        elif outcome is SeqOutcome.GAP:
            self.stats.gaps += 1
            self.stats.missed += missing.stop - missing.start  # len() overflows past 2**63
            if not await self._replay(missing):
                self._resync("gap")
        elif outcome is SeqOutcome.RESTART:
            self.stats.restarts += 1
            self._resync("restart")
            if seq == 0:
                self.state = StreamState.LIVE
        self._apply(batch)

    def _decode(self, payload: bytes) -> KVEventBatch:
        """The payload's batch; events of types we do not know are counted, each type logged
        once, and left out (``_decode``: their batch's other events still apply)."""
        batch, unknown = read_batch(payload)
        if unknown:
            self.stats.unknown_events += len(unknown)
            for kind in set(unknown) - self._unknown_seen:
                if len(self._unknown_seen) >= UNKNOWN_TYPES_LOGGED:  # a flood of made-up names
                    break
                self._unknown_seen.add(kind)
                log.warning(
                    "KV events of %s: skipping events of unknown type %r", self.replica, kind[:64]
                )
        return batch

    def _apply(self, batch: KVEventBatch) -> None:
        self.stats.batches += 1
        self.stats.last_batch_at = time.monotonic()
        self.stats.events += len(batch.events)
        cleared = any(isinstance(e, AllBlocksCleared) for e in batch.events)
        self.indexer.apply(batch)
        if cleared:
            self.stats.resyncs["cleared"] = self.stats.resyncs.get("cleared", 0) + 1
            self.state = StreamState.LIVE  # the engine is empty, and so are we

    def _resync(self, why: str, cause: str | None = None) -> None:
        """Clear the replica's entries; ``cause`` (``why`` by default) labels the count."""
        cause = why if cause is None else cause
        self.indexer.clear()
        self.stats.resyncs[cause] = self.stats.resyncs.get(cause, 0) + 1
        self.state = StreamState.RESYNCING
        self._said.warning(cause, RESYNC_SAID, self.replica, why)

    async def _replay(self, missing: range) -> bool:
        """Fetch and apply the ``missing`` batches; False if the replay did not close the gap."""
        if self.endpoint.replay is None or not missing or missing.start < 0:
            return False  # a start below 0 (after a number read as negative) has no request
        got = await self._fetch(missing)
        if got is None or len(got) != len(missing):
            self.stats.replay_failures += 1
            return False
        try:
            await self._apply_all(got[seq] for seq in missing)
        except EventDecodeError as exc:
            self.stats.replay_failures += 1
            log.warning("KV events of %s: replay failed: %s", self.replica, exc)
            return False
        self.stats.replayed += len(missing)
        return True

    async def _join(self, seq: int) -> bool:
        """A stream first heard at ``seq`` > 0: the engine ran before we listened. Ask its
        replay endpoint for every batch before ``seq`` it still buffers (vLLM keeps the last
        10,000) and apply the run of them that ends at ``seq - 1``, oldest first: what it
        stored and evicted meanwhile. True when that run starts at 0, the whole stream (the
        first batch after an engine starts is usually lost to the PUB socket's slow joiner,
        and with it the first prompt's blocks, under which every later block hangs)."""
        got = await self._fetch(range(0, seq)) if seq > 0 else None
        start = seq
        while got and start - 1 in got:
            start -= 1
        try:
            if got:
                await self._apply_all(got[n] for n in range(start, seq))
        except EventDecodeError as exc:  # a hole in what was applied: trust none of it
            self.indexer.clear()
            log.warning("KV events of %s: catching up failed: %s", self.replica, exc)
            return False
        self.stats.caught_up += seq - start
        return start == 0

    async def _apply_all(self, payloads: Iterable[bytes]) -> None:
        """Decode and apply ``payloads`` in order, letting requests through every few."""
        for i, payload in enumerate(payloads):
            if i and not i % APPLY_CHUNK:
                await asyncio.sleep(0)
            self._apply(self._decode(payload))

    async def _fetch(self, missing: range) -> dict[int, bytes] | None:
        """The batches of ``missing`` the replay endpoint sends back, by number (None: no
        endpoint, or it failed). Each reply within ``replay_timeout_s``, all of them within
        ``REPLAY_DEADLINE_S``: a peer that trickles replies outside the range stalls the
        stream no longer than that."""
        if self.endpoint.replay is None:
            return None
        sock = self.context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        got: dict[int, bytes] = {}
        kept = 0  # bytes in got
        deadline = asyncio.get_running_loop().time() + REPLAY_DEADLINE_S
        try:
            sock.setsockopt(zmq.IPV6, int(is_ipv6(self.endpoint.replay)))
            sock.connect(self.endpoint.replay)
            await sock.send_multipart([b"", missing.start.to_bytes(8, "big")])
            while asyncio.get_running_loop().time() < deadline:
                if not await sock.poll(self.replay_timeout_s * 1000):
                    break
                reply = _replay_reply(await sock.recv_multipart())
                if reply is None or reply[0] == END_SEQ:
                    break
                seq, payload = reply
                if seq in missing and seq not in got:
                    kept += len(payload)
                    if kept > REPLAY_MAX_BYTES:  # more than any engine's buffer holds
                        log.warning("KV events of %s: replay over %d MiB, dropped",
                                    self.replica, REPLAY_MAX_BYTES >> 20)
                        return None
                    got[seq] = payload
        except zmq.ZMQError as exc:
            log.warning("KV events of %s: replay failed: %s", self.replica, exc)
            return None
        finally:
            sock.close(linger=0)
        return got


def _replay_reply(frames: list[bytes]) -> tuple[int, bytes] | None:
    """``(seq, payload)`` from a replay reply, None if malformed.

    After the DEALER's empty delimiter, vLLM 0.32 sends ``[topic, seq, payload]`` (its end
    marker: ``[b"", -1, b""]``); earlier versions sent ``[seq, payload]``. Both are read.
    """
    rest = frames[1:] if frames and frames[0] == b"" else frames
    if len(rest) == 3:
        rest = rest[1:]
    if len(rest) != 2:
        return None
    try:
        return decode_seq(rest[0]), rest[1]
    except EventDecodeError:
        return None


def _attach(sock: zmq.asyncio.Socket, address: str, bind: bool) -> str:
    """Bind or connect; returns the address in use (a bound ``*`` port resolved)."""
    try:
        sock.setsockopt(zmq.IPV6, int(is_ipv6(address)))
        if not bind:
            sock.connect(address)
            return address
        sock.bind(address)
    except zmq.ZMQError as exc:
        raise BadEndpoint(f"cannot {'bind' if bind else 'connect'} {address}: {exc}") from exc
    last = sock.getsockopt(zmq.LAST_ENDPOINT)
    return last.decode() if isinstance(last, bytes) else address
