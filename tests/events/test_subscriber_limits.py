"""What a KV-event peer can make the subscriber hold, and a second engine on one bound address
(the module docstring of ``events/_subscriber.py``).

A subscriber that binds takes whatever connects to its port: before, one message of any size
was read whole into memory, a replay kept every payload it was sent, and two engines pointed at
one address interleaved their streams with no word of why the index kept being cleared."""

from __future__ import annotations

import asyncio
import logging

import pytest
import zmq
import zmq.asyncio
from polling import until

from prefixroute.events import _subscriber
from prefixroute.events._subscriber import MAX_MESSAGE_BYTES

from .helpers import BIND_ANY, block, frames, payload, subscriber
from .test_subscriber_pins import FakeReplay, through_replay


async def test_a_message_over_the_limit_is_never_read(
    context: zmq.asyncio.Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_subscriber, "MAX_MESSAGE_BYTES", 4096)
    sub = subscriber(context, BIND_ANY)
    await sub.start()
    pub = context.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    try:
        assert sub._socket is not None and sub._socket.getsockopt(zmq.MAXMSGSIZE) == 4096
        assert sub.address is not None
        pub.connect(sub.address)
        big = frames(0, block(0, None))
        big[2] += b"\0" * 8192  # the payload past the limit
        for _ in range(20):  # the subscription reaches the PUB socket, then it is dropped
            await pub.send_multipart(big)
            await asyncio.sleep(0.02)
        assert sub.stats.batches == 0 and sub.stats.decode_errors == 0
    finally:
        pub.close(linger=0)
        await sub.stop()


def test_the_limit_leaves_room_for_any_engine_step() -> None:
    # A step of 64k prefilled tokens is about 0.4 MB of events: 64 MiB is 100x that, and far
    # below what a peer could otherwise make us hold per message.
    assert 32 << 20 <= MAX_MESSAGE_BYTES <= 256 << 20


async def test_a_replay_past_its_byte_budget_fails_and_clears(
    context: zmq.asyncio.Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    one = payload(block(1, 1))
    monkeypatch.setattr(_subscriber, "REPLAY_MAX_BYTES", len(one) + 1)  # room for one of two
    batches = {1: one, 2: payload(block(2, 2))}
    sub, _ = await through_replay(context, batches, 0, 3)  # 1 and 2 lost
    stats = sub.stats
    assert (stats.gaps, stats.replayed, stats.replay_failures) == (1, 0, 1)
    assert stats.resyncs == {"gap": 1}


async def test_a_replay_within_its_byte_budget_closes_the_gap(
    context: zmq.asyncio.Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches = {1: payload(block(1, 1)), 2: payload(block(2, 2))}
    monkeypatch.setattr(_subscriber, "REPLAY_MAX_BYTES", sum(map(len, batches.values())))
    sub, _ = await through_replay(context, batches, 0, 3)
    assert (sub.stats.replayed, sub.stats.replay_failures) == (2, 0)


async def test_a_batch_sent_twice_in_a_replay_is_kept_once(
    context: zmq.asyncio.Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    one = payload(block(1, 1))
    monkeypatch.setattr(_subscriber, "REPLAY_MAX_BYTES", len(one))
    replay = FakeReplay(context, {1: one})
    real_serve = replay.sock.send_multipart

    async def twice(parts: list[bytes]) -> None:  # every reply sent two times
        await real_serve(parts)
        if parts[3] != (-1).to_bytes(8, "big", signed=True):
            await real_serve(parts)

    replay.sock.send_multipart = twice  # type: ignore[method-assign]
    try:
        sub = subscriber(context, _replay_endpoint(replay.address))
        await sub.receive(frames(0, block(0, None)))
        await sub.receive(frames(2, block(2, 2)))
    finally:
        await replay.close()
    assert (sub.stats.replayed, sub.stats.replay_failures) == (1, 0)


def _replay_endpoint(address: str) -> _subscriber.EventEndpoint:
    return _subscriber.EventEndpoint("tcp://127.0.0.1:1", False, address)


async def test_two_publishers_on_one_bound_address_are_warned_of(
    context: zmq.asyncio.Context, caplog: pytest.LogCaptureFixture
) -> None:
    sub = subscriber(context, BIND_ANY)
    await sub.start()
    pubs = [context.socket(zmq.PUB) for _ in range(2)]
    try:
        assert sub.address is not None
        with caplog.at_level(logging.WARNING, logger="prefixroute.events._subscriber"):
            pubs[0].connect(sub.address)
            await until(lambda: sub.publishers == 1)
            assert "publishers connected" not in caplog.text  # one engine is how it should be
            pubs[1].connect(sub.address)
            await until(lambda: sub.publishers == 2)
            await until(lambda: "2 publishers connected to " + sub.address in caplog.text)
            pubs[1].close(linger=0)
            await until(lambda: sub.publishers == 1)
            pubs[0].close(linger=0)
            await until(lambda: sub.publishers == 0)  # none left: the next one alone is fine
    finally:
        for p in pubs:
            p.close(linger=0)
        await sub.stop()
