"""The subscriber's promises from its module docstring, at their edges (docs/mutation.md):

- a restart (a number not above the last) clears, and only a restart *at 0* is a fresh, empty
  engine: at any other number the engine may hold blocks we never heard of (resyncing);
- a replay that does not cover the whole gap is a failure: clear and resync, never trust a gap
  that was never filled;
- ``missed`` counts the batches a gap lost, and ``replayed`` those the replay recovered.

A fake engine's replay socket (a ZMQ ROUTER speaking vLLM 0.32's protocol) answers whatever the
test tells it to.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import zmq
import zmq.asyncio

from prefixroute.core import PrefixIndex
from prefixroute.events import (
    AllBlocksCleared,
    BadEndpoint,
    EventDecodeError,
    EventEndpoint,
    EventSubscriber,
    StreamState,
)

from .helpers import BIND_ANY, HASHER, NOWHERE, R, block, frames, indexed, payload, stored
from .helpers import subscriber as make_subscriber

END = (-1).to_bytes(8, "big", signed=True)


class FakeReplay:
    """An engine's replay socket that sends the batches it is given, then the end marker
    (unless told not to)."""

    def __init__(
        self, context: zmq.asyncio.Context, batches: dict[int, bytes], end: bool = True
    ) -> None:
        self.batches = batches
        self.end = end  # False: stall after the batches, as an engine that stops answering
        self.requests: list[int] = []
        self.sock = context.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind("tcp://127.0.0.1:*")
        self.address = self.sock.getsockopt(zmq.LAST_ENDPOINT).decode()  # type: ignore[union-attr]
        self.task = asyncio.get_running_loop().create_task(self._serve())

    async def _serve(self) -> None:
        while True:
            identity, delimiter, start = await self.sock.recv_multipart()
            assert delimiter == b""  # a DEALER speaking to a ROUTER: empty frame first
            self.requests.append(int.from_bytes(start, "big"))
            for seq in sorted(self.batches):
                frames = [identity, b"", b"", seq.to_bytes(8, "big"), self.batches[seq]]
                await self.sock.send_multipart(frames)
            if self.end:
                await self.sock.send_multipart([identity, b"", b"", END, b""])

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        self.sock.close(linger=0)


def subscriber(
    context: zmq.asyncio.Context, replay: str | None = None, timeout_s: float = 1.0
) -> EventSubscriber:
    endpoint = EventEndpoint(NOWHERE.address, False, replay)
    return make_subscriber(context, endpoint, replay_timeout_s=timeout_s)


async def through_replay(
    context: zmq.asyncio.Context, batches: dict[int, bytes], *sent: int
) -> tuple[EventSubscriber, FakeReplay]:
    """A fresh subscriber, with ``batches`` on its replay socket, is sent block ``i`` of one
    chain as batch ``i`` for each of ``sent``, in order; the replay socket is closed after."""
    replay = FakeReplay(context, batches)
    try:
        sub = subscriber(context, replay.address)
        for i in sent:
            await sub.receive(frames(i, block(i, None if i == 0 else i)))
    finally:
        await replay.close()
    return sub, replay


async def test_a_restart_at_a_number_above_zero_is_resyncing_not_live(
    context: zmq.asyncio.Context,
) -> None:
    sub = subscriber(context)
    await sub.receive(frames(0, block(0, None)))
    await sub.receive(frames(1, block(1, 1)))
    await sub.receive(frames(2, block(2, 2)))
    assert sub.state is StreamState.LIVE
    await sub.receive(frames(1, stored(list(range(50, 54)), None, [9])))  # not above 2
    assert (sub.stats.restarts, sub.stats.resyncs) == (1, {"restart": 1})
    assert sub.state is StreamState.RESYNCING  # it ran before: it may hold unknown blocks
    assert sub.indexer.index.blocks_of(R) == 1  # cleared, then the new batch applied


async def test_a_full_replay_closes_the_gap_and_counts_each_missed_batch(
    context: zmq.asyncio.Context,
) -> None:
    batches = {1: payload(block(1, 1)), 2: payload(block(2, 2))}
    sub, replay = await through_replay(context, batches, 0, 3)  # 1 and 2 lost
    assert replay.requests == [1]  # asked from the first missing number
    stats = sub.stats
    assert (stats.gaps, stats.missed, stats.replayed, stats.replay_failures) == (1, 2, 2, 0)
    assert stats.batches == 4 and stats.resyncs == {}
    assert sub.state is StreamState.LIVE
    assert sub.indexer.index.match(HASHER.hash_tokens(list(range(16)))) == {R: 4}


async def test_a_partial_replay_is_a_failure_and_clears(context: zmq.asyncio.Context) -> None:
    # The engine still has batch 2 but no longer batch 1: the gap stays open.
    sub, _ = await through_replay(context, {2: payload(block(2, 2))}, 0, 3)
    stats = sub.stats
    assert (stats.gaps, stats.missed, stats.replayed, stats.replay_failures) == (1, 2, 0, 1)
    assert stats.resyncs == {"gap": 1}
    assert sub.state is StreamState.RESYNCING
    assert sub.indexer.index.blocks_of(R) == 0  # block 0 no longer trusted; block 3 orphaned
    assert stats.batches == 2  # nothing of the partial replay was applied


async def test_missed_counts_the_batches_of_every_gap(context: zmq.asyncio.Context) -> None:
    sub = subscriber(context)  # no replay: every gap resyncs
    await sub.receive(frames(0, block(0, None)))
    await sub.receive(frames(4, block(4, 4)))  # 1, 2, 3 lost
    await sub.receive(frames(5, block(5, 5)))
    await sub.receive(frames(7, block(7, 7)))  # 6 lost
    stats = sub.stats
    assert (stats.gaps, stats.missed, stats.replayed, stats.replay_failures) == (2, 4, 0, 0)
    assert stats.resyncs == {"gap": 2}


async def test_the_replay_ends_at_the_end_marker_not_at_the_timeout(
    context: zmq.asyncio.Context,
) -> None:
    replay = FakeReplay(context, {1: payload(block(1, 1))})
    try:
        sub = subscriber(context, replay.address, timeout_s=5.0)
        await sub.receive(frames(0, block(0, None)))
        started = time.monotonic()
        await sub.receive(frames(2, block(2, 2)))
        elapsed = time.monotonic() - started
    finally:
        await replay.close()
    assert sub.stats.replayed == 1 and sub.state is StreamState.LIVE
    assert elapsed < 2.0  # the end marker (sequence -1) ends it, not the 5 s wait


async def test_a_replayed_batch_that_does_not_decode_fails_the_replay(
    context: zmq.asyncio.Context,
) -> None:
    sub, _ = await through_replay(context, {1: b"\xc1 not msgpack"}, 0, 2)
    assert (sub.stats.replayed, sub.stats.replay_failures) == (0, 1)
    assert sub.stats.resyncs == {"gap": 1} and sub.state is StreamState.RESYNCING
    replay = FakeReplay(context, {3: b"\xc1 not msgpack"})
    try:
        sub.endpoint = EventEndpoint(sub.endpoint.address, False, replay.address)
        await sub.receive(frames(4, block(4, 4)))  # 3 lost: a second failure, counted
    finally:
        await replay.close()
    assert (sub.stats.replay_failures, sub.stats.resyncs) == (2, {"gap": 2})


async def test_every_counter_counts_every_time(context: zmq.asyncio.Context) -> None:
    # Two of everything: the counters add up, they do not just flag.
    replay = FakeReplay(context, {})  # answers nothing: every replay fails
    try:
        sub = subscriber(context, replay.address)
        await sub.receive(frames(0, block(0, None), block(1, 1)))  # 2 events
        await sub.receive(frames(2, AllBlocksCleared()))  # gap 1, failed replay; 1 event
        await sub.receive(frames(4, AllBlocksCleared()))  # gap 2, failed replay; 1 event
        await sub.receive(frames(1, block(0, None)))  # restart 1
        await sub.receive(frames(0, block(0, None)))  # restart 2
    finally:
        await replay.close()
    s = sub.stats
    assert (s.batches, s.events, s.gaps, s.missed) == (5, 6, 2, 2)
    assert (s.replay_failures, s.replayed, s.restarts) == (2, 0, 2)
    assert s.resyncs == {"gap": 2, "cleared": 2, "restart": 2}
    batches = {1: payload(block(1, 1)), 3: payload(block(3, 3))}
    sub, _ = await through_replay(context, batches, 0, 2, 4)  # 1 and 3 replayed
    assert (sub.stats.replayed, sub.stats.missed, sub.stats.replay_failures) == (2, 2, 0)


async def test_decode_errors_are_counted_one_by_one_on_the_socket(
    context: zmq.asyncio.Context, caplog: pytest.LogCaptureFixture
) -> None:
    """Each one counted; logged once a minute (a peer that sent 3,000 wrote 3,000 warnings:
    an outside audit, 2026-12-07)."""
    index = indexed()
    sub = make_subscriber(context, BIND_ANY, index)
    assert sub.address is None  # until started
    await sub.stop()  # stopping what never started is harmless
    await sub.start()
    raw = context.socket(zmq.PUB)
    try:
        raw.connect(sub.address or "")
        while sub.stats.batches == 0:  # until the subscription is through
            await raw.send_multipart(frames(0))
            await asyncio.sleep(0.01)
        before = sub.stats.decode_errors
        await raw.send_multipart([b"", (1).to_bytes(8, "big"), b"garbage"])
        await raw.send_multipart([b"", (1).to_bytes(8, "big"), b"more garbage"])
        await raw.send_multipart(frames(1, block(0, None)))
        deadline = time.monotonic() + 5
        while index.blocks_of(R) == 0:
            assert time.monotonic() < deadline, sub.stats
            await asyncio.sleep(0.005)
        assert sub.stats.decode_errors - before == 2
        warned = [r for r in caplog.records if r.levelname == "WARNING"]
        assert len(warned) == 1 and "KV events of" in warned[0].getMessage(), warned
        task = sub._task
        await sub.stop()
        assert task is not None and task.done()  # stopped means the reader is gone
    finally:
        raw.close(linger=0)
        await sub.stop()


def test_replay_replies_without_the_delimiter_are_read_too() -> None:
    from prefixroute.events._subscriber import _replay_reply

    seq = (5).to_bytes(8, "big")
    assert _replay_reply([seq, b"p"]) == (5, b"p")
    assert _replay_reply([b"kv", seq, b"p"]) == (5, b"p")


async def test_bad_addresses_say_what_could_not_be_done(context: zmq.asyncio.Context) -> None:
    index = PrefixIndex()
    first = make_subscriber(context, BIND_ANY, index)
    await first.start()
    try:
        address = first.address or ""
        second = make_subscriber(context, EventEndpoint(address, True), index)
        with pytest.raises(BadEndpoint, match=f"^cannot bind {address}: "):
            await second.start()
    finally:
        await first.stop()
    bad = make_subscriber(context, EventEndpoint("nonsense://x", False), index)
    with pytest.raises(BadEndpoint, match="^cannot connect nonsense://x: "):
        await bad.start()
    assert EventDecodeError  # (imported for the module's error tree; decode errors above)
