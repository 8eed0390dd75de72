"""A stream heard first past sequence 0 catches up from the engine's replay endpoint, and a
payload nested too deeply is a decode error like any other (an outside audit, 2026-12-06).

Before, a subscriber that joined late (the engine ran before it, or the PUB socket lost the
first batch, as it usually does) never asked for the batches before, so the first prompt's
blocks, a shared system prompt under which every later block hangs, stayed unknown for good:
every later block was an orphan. And msgspec's RecursionError on a 5 KB payload cleared the
replica as an unexpected error instead of being counted and skipped."""

from __future__ import annotations

import asyncio
import logging

import pytest
import zmq.asyncio
from polling import until

from prefixroute.core import PrefixIndex
from prefixroute.events import (
    BadEndpoint,
    EventDecodeError,
    EventEndpoint,
    EventPublisher,
    EventSubscriber,
    StreamState,
)

from .helpers import HASHER, R, frames, indexed, payload, stored, subscriber

WITH_REPLAY = "bind:tcp://127.0.0.1:*,replay=tcp://127.0.0.1:*"


async def engine(context: zmq.asyncio.Context, **kwargs: int) -> EventPublisher:
    """A started publisher that binds and serves replays, as a vLLM engine does."""
    pub = EventPublisher(EventEndpoint.parse(WITH_REPLAY), context, **kwargs)
    await pub.start()
    return pub


def listener(
    context: zmq.asyncio.Context, pub: EventPublisher, index: PrefixIndex
) -> EventSubscriber:
    """A subscriber (not started) of ``pub``'s stream and replays, into ``index``."""
    assert pub.address is not None
    return subscriber(context, EventEndpoint(pub.address, False, pub.replay_address), index)


async def test_a_late_subscriber_applies_what_the_engine_published_before_it(
    context: zmq.asyncio.Context,
) -> None:
    pub = await engine(context, buffer_steps=100)
    index = indexed()
    try:
        pub.publish([stored(list(range(8)), None, [1, 2])])  # seq 0: nobody listens yet
        pub.publish([stored(list(range(8, 12)), 2, [3])])  # seq 1: continues it
        sub = listener(context, pub, index)
        await sub.start()
        try:
            while sub.stats.batches == 0:  # the subscription reaches the PUB socket
                pub.publish([])
                await asyncio.sleep(0.01)
            pub.publish([stored(list(range(12, 16)), 3, [4])])  # hangs under seq 0's blocks
            await until(lambda: index.blocks_of(R) == 4)
        finally:
            await sub.stop()
    finally:
        await pub.stop()
    assert index.match(HASHER.hash_tokens(list(range(16)))) == {R: 4}
    assert sub.state is StreamState.LIVE  # the whole stream from 0: in step with the engine
    assert sub.stats.caught_up >= 2 and sub.indexer.stats.orphan_blocks == 0


async def test_without_a_replay_endpoint_a_late_stream_is_resyncing(
    context: zmq.asyncio.Context,
) -> None:
    index = indexed()
    sub = subscriber(context, index=index)
    await sub.receive(frames(5, stored(list(range(4, 8)), 1, [2])))
    assert sub.state is StreamState.RESYNCING and sub.stats.caught_up == 0
    assert sub.indexer.stats.orphan_blocks == 1


async def test_a_deeply_nested_payload_is_a_decode_error_not_a_resync(
    context: zmq.asyncio.Context,
) -> None:
    index = indexed()
    sub = subscriber(context, index=index)
    await sub.receive(frames(0, stored(list(range(4)), None, [1])))
    nested = b"\x93\xcb" + bytes(8) + b"\x91" * 5000 + b"\xc0\xc0"  # [ts, [[[...]]], None]
    with pytest.raises(EventDecodeError) as bad:
        await sub.receive([b"", (1).to_bytes(8, "big"), nested])
    assert str(bad.value) == "not a vLLM KV-event batch: nested too deeply"
    assert index.blocks_of(R) == 1 and sub.stats.resyncs == {}


async def _bound_again(spec: str, context: zmq.asyncio.Context) -> EventPublisher:
    """A publisher bound to the address another just closed: ZMQ closes a socket in the
    background, so the address may stay taken a moment (seen under a loaded CI run)."""
    for _ in range(100):
        new = EventPublisher(EventEndpoint.parse(spec), context)
        try:
            await new.start()
        except BadEndpoint:
            await asyncio.sleep(0.05)
            continue
        return new
    raise AssertionError(f"{spec} stayed taken for 5 s")


async def test_an_engine_restarted_at_the_same_address_starts_a_new_stream(
    context: zmq.asyncio.Context,
) -> None:
    """The new engine's first batches are lost, and the first number heard is the old
    stream's next: before, that read as the old stream going on, and the old engine's blocks
    stayed in the index, routed on but no longer held (an outside audit, 2026-12-06)."""
    old = EventPublisher(EventEndpoint.parse("bind:tcp://127.0.0.1:*"), context)
    await old.start()
    assert old.address is not None
    index = indexed()
    sub = subscriber(context, EventEndpoint(old.address, False), index)
    await sub.start()
    try:
        while sub.stats.batches == 0:
            old.publish([])
            await asyncio.sleep(0.01)
        last = old.publish([stored(list(range(8)), None, [1, 2])])
        await until(lambda: index.blocks_of(R) == 2)
        await old.stop()  # the engine dies; a new one binds the same address
        new = await _bound_again(f"bind:{old.address}", context)
        try:
            for _ in range(last + 1):  # its batches up to the old stream's last: all lost
                new.publish([], drop=True)
            await asyncio.sleep(0.5)  # the subscriber reconnects (ZMQ retries every 0.1 s)
            for _ in range(250):  # until the subscriber has reconnected and heard one
                new.publish([stored(list(range(50, 54)), None, [7])])  # the old stream's next
                await asyncio.sleep(0.02)
                if index.match(HASHER.hash_tokens(list(range(50, 54)))):
                    break
        finally:
            await new.stop()
    finally:
        await sub.stop()
    assert index.match(HASHER.hash_tokens(list(range(8)))) == {}  # the old engine's blocks
    assert index.match(HASHER.hash_tokens(list(range(50, 54)))) == {R: 1}


# --- pins for the subscriber's mutation group (docs/mutation.md) ------------------------------


async def test_the_batch_after_a_disconnection_starts_a_new_stream_once(
    context: zmq.asyncio.Context, caplog: pytest.LogCaptureFixture
) -> None:
    index = indexed()
    sub = subscriber(context, index=index)
    await sub.receive(frames(0, stored(list(range(8)), None, [1, 2])))
    assert sub.stats.last_batch_at is not None
    sub._rejoin = True  # as the socket's monitor sets it (_watch)
    caplog.set_level(logging.WARNING, logger="prefixroute.events")
    await sub.receive(frames(1, stored(list(range(50, 54)), None, [7])))  # the old next number
    assert sub.stats.resyncs == {"reconnect": 1}
    assert "publisher reconnected; entries cleared" in caplog.text
    assert index.match(HASHER.hash_tokens(list(range(8)))) == {}
    await sub.receive(frames(2, stored(list(range(60, 64)), None, [8])))
    assert sub.stats.resyncs == {"reconnect": 1}  # once
    assert index.blocks_of(R) == 2


async def test_a_stream_first_heard_at_1_catches_up_its_batch_0(
    context: zmq.asyncio.Context,
) -> None:
    pub = await engine(context)
    index = indexed()
    try:
        pub.publish([stored(list(range(4)), None, [1])], drop=True)  # seq 0: lost
        sub = listener(context, pub, index)
        sub.stats.caught_up = 5  # counted on from here
        await sub.receive(frames(1, stored(list(range(4, 8)), 1, [2])))
    finally:
        await pub.stop()
    assert sub.state is StreamState.LIVE and sub.stats.caught_up == 6
    assert index.blocks_of(R) == 2


async def test_a_replay_buffer_that_does_not_reach_back_to_0_applies_what_it_holds(
    context: zmq.asyncio.Context,
) -> None:
    pub = await engine(context, buffer_steps=2)
    index = indexed()
    try:
        pub.publish([stored(list(range(4)), None, [1])], drop=True)  # seq 0: out of the buffer
        pub.publish([stored(list(range(4, 8)), 1, [2])], drop=True)  # seq 1
        pub.publish([stored(list(range(20, 24)), None, [5])], drop=True)  # seq 2
        sub = listener(context, pub, index)
        await sub.receive(frames(3, stored(list(range(24, 28)), 5, [6])))
    finally:
        await pub.stop()
    assert sub.state is StreamState.RESYNCING and sub.stats.caught_up == 2
    assert sub.stats.resyncs == {} and index.match(HASHER.hash_tokens(list(range(20, 28)))) == {
        R: 2
    }


async def test_a_bad_batch_in_the_catch_up_trusts_none_of_it(
    context: zmq.asyncio.Context,
) -> None:
    pub = await engine(context)
    index = indexed()
    try:
        pub.publish([stored(list(range(4)), None, [1])], drop=True)
        pub._buffer.append((1, b"\xc1"))  # seq 1: not msgpack
        sub = listener(context, pub, index)
        await sub.receive(frames(2, stored(list(range(30, 34)), None, [9])))
    finally:
        await pub.stop()
    assert sub.state is StreamState.RESYNCING
    assert index.match(HASHER.hash_tokens(list(range(4)))) == {}  # seq 0 was taken back
    assert index.blocks_of(R) == 1  # seq 2's own root block


async def test_the_reader_and_the_monitor_run_named_while_started_and_end_at_stop(
    context: zmq.asyncio.Context,
) -> None:
    def ours() -> list[str]:
        return sorted(t.get_name().split()[0] for t in asyncio.all_tasks()
                      if t.get_name().startswith(("kv-events", "kv-peers")))  # fmt: skip

    sub = subscriber(context, "bind:tcp://127.0.0.1:*")
    await sub.start()
    assert ours() == ["kv-events", "kv-peers"]
    tasks = [t for t in asyncio.all_tasks() if t.get_name().startswith(("kv-events", "kv-peers"))]
    await sub.stop()
    await asyncio.sleep(0)
    assert ours() == []
    # Cancelled, both: not left to fail on a closed socket (an error nobody retrieves)
    assert all(t.cancelled() for t in tasks)


async def test_a_catch_up_whose_replay_stalls_applies_what_came_before_the_stall(
    context: zmq.asyncio.Context,
) -> None:
    """A replay endpoint that stops answering mid-way (no end marker) is waited for one reply
    timeout, and the batches it did send are applied: they reach back to 0 here."""
    from .test_subscriber_pins import FakeReplay

    batches = {0: payload(stored(list(range(4)), None, [1])),
               1: payload(stored(list(range(4, 8)), 1, [2]))}  # fmt: skip
    replay = FakeReplay(context, batches, end=False)
    index = indexed()
    try:
        sub = subscriber(context, EventEndpoint("tcp://127.0.0.1:1", False, replay.address),
                         index, replay_timeout_s=0.05)  # fmt: skip
        await sub.receive(frames(2, stored(list(range(8, 12)), 2, [3])))
    finally:
        await replay.close()
    assert sub.stats.caught_up == 2 and sub.state is StreamState.LIVE
    assert index.match(HASHER.hash_tokens(list(range(12)))) == {R: 3}


async def test_unknown_event_types_are_remembered_up_to_16_and_their_batches_apply(
    context: zmq.asyncio.Context,
) -> None:
    import msgspec

    from prefixroute.events._subscriber import UNKNOWN_TYPES_LOGGED

    index = indexed()
    sub = subscriber(context, index=index)
    names = [f"Made{i}" for i in range(UNKNOWN_TYPES_LOGGED + 4)]
    raw = msgspec.msgpack.encode([0.0, [[n] for n in names], None])
    await sub.receive([b"", (0).to_bytes(8, "big"), raw])
    assert len(sub._unknown_seen) == UNKNOWN_TYPES_LOGGED == 16
    assert sub.stats.batches == 1 and sub.stats.unknown_events == len(names)
