"""Tests for prefixroute.events._subscriber (and the publisher it talks to): real ZMQ sockets on
127.0.0.1, both connection directions, gaps with and without replay, restarts, resets."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import zmq
import zmq.asyncio
from polling import until

from prefixroute.core import PrefixIndex
from prefixroute.events import (
    AllBlocksCleared,
    BadEndpoint,
    EventDecodeError,
    EventEndpoint,
    EventPublisher,
    EventSubscriber,
    StreamState,
)

from .helpers import BIND_ANY, HASHER, R, frames, indexed, stored, subscriber

Pair = tuple[EventPublisher, EventSubscriber, PrefixIndex]
MakePair = Callable[..., Awaitable[Pair]]


@pytest.fixture
async def make_pair(context: zmq.asyncio.Context) -> AsyncIterator[MakePair]:
    started: list[Any] = []

    async def make(
        publisher_binds: bool = True, replay: bool = False, replay_timeout_s: float = 1.0,
        host: str = "127.0.0.1",
    ) -> Pair:  # fmt: skip
        index = indexed()
        if publisher_binds:
            spec = f"bind:tcp://{host}:*" + (f",replay=tcp://{host}:*" if replay else "")
            pub = EventPublisher(EventEndpoint.parse(spec), context)
            await pub.start()
            started.append(pub)
            assert pub.address is not None
            sub_ep = EventEndpoint(pub.address, False, pub.replay_address)
            sub = subscriber(context, sub_ep, index, replay_timeout_s=replay_timeout_s)
            await sub.start()
            started.append(sub)
        else:
            bind = EventEndpoint(f"tcp://{host}:*", True) if host != "127.0.0.1" else BIND_ANY
            sub = subscriber(context, bind, index, replay_timeout_s=replay_timeout_s)
            await sub.start()
            started.append(sub)
            assert sub.address is not None
            pub = EventPublisher(EventEndpoint(sub.address, False), context)
            await pub.start()
            started.append(pub)
        # A PUB socket drops what it sends before the subscription reaches it: send empty
        # batches until one arrives (the stream then starts "late", at a number above 0).
        while sub.stats.batches == 0:
            pub.publish([])
            await asyncio.sleep(0.01)
        return pub, sub, index

    yield make
    for thing in reversed(started):
        await thing.stop()


@pytest.mark.parametrize("publisher_binds", [True, False], ids=["engine-binds", "gateway-binds"])
async def test_events_flow_in_both_directions(make_pair: MakePair, publisher_binds: bool) -> None:
    pub, sub, index = await make_pair(publisher_binds)
    tokens = list(range(8))
    pub.publish([AllBlocksCleared(), stored(tokens, None, [1, 2])])
    await until(lambda: index.blocks_of(R) == 2)
    assert sub.state is StreamState.LIVE  # the engine is empty, and so were we: in step
    assert index.match(HASHER.hash_tokens(tokens)) == {R: 2}
    assert sub.stats.resyncs == {"cleared": 1}


async def test_a_gap_is_closed_by_replay(make_pair: MakePair) -> None:
    pub, sub, index = await make_pair(replay=True)
    pub.publish([AllBlocksCleared(), stored(list(range(4)), None, [1])])
    pub.publish([stored(list(range(4, 8)), 1, [2])], drop=True)  # lost on the way
    pub.publish([stored(list(range(8, 12)), 2, [3])])
    await until(lambda: index.blocks_of(R) == 3)
    assert index.match(HASHER.hash_tokens(list(range(12)))) == {R: 3}
    assert (sub.stats.gaps, sub.stats.replayed, sub.stats.replay_failures) == (1, 1, 0)
    assert sub.state is StreamState.LIVE
    assert "gap" not in sub.stats.resyncs


@pytest.mark.parametrize("publisher_binds", [True, False], ids=["engine-binds", "gateway-binds"])
async def test_events_and_replays_over_ipv6(make_pair: MakePair, publisher_binds: bool) -> None:
    """A bracketed address (``tcp://[::1]:5557``, an IPv6 pod network) needs ZMQ's IPV6 option
    on every socket that uses it, off by default: the stream, and the replay socket."""
    pub, sub, index = await make_pair(publisher_binds, replay=publisher_binds, host="[::1]")
    assert sub.address is not None and sub.address.startswith("tcp://[::1]:")
    pub.publish([AllBlocksCleared(), stored(list(range(4)), None, [1])])
    if publisher_binds:  # a lost batch, fetched again from the engine's replay socket
        pub.publish([stored(list(range(4, 8)), 1, [2])], drop=True)
    pub.publish([stored(list(range(8, 12)), 2 if publisher_binds else None, [3])])
    await until(lambda: index.blocks_of(R) == (3 if publisher_binds else 2))
    assert sub.stats.replayed == (1 if publisher_binds else 0)


async def test_a_gap_without_replay_clears_and_resyncs(make_pair: MakePair) -> None:
    pub, sub, index = await make_pair(replay=False)
    pub.publish([AllBlocksCleared(), stored(list(range(8)), None, [1, 2])])
    await until(lambda: index.blocks_of(R) == 2)
    pub.publish([stored(list(range(8, 12)), 2, [3])], drop=True)
    pub.publish([stored(list(range(20, 24)), None, [9])])
    await until(lambda: sub.stats.gaps == 1)
    # What the engine held before the gap is no longer trusted; the new root block is.
    assert index.match(HASHER.hash_tokens(list(range(8)))) == {}
    assert index.match(HASHER.hash_tokens(list(range(20, 24)))) == {R: 1}
    assert sub.state is StreamState.RESYNCING
    assert sub.stats.resyncs.get("gap") == 1
    pub.publish([AllBlocksCleared()])
    await until(lambda: sub.state is StreamState.LIVE)


async def test_a_replay_that_does_not_answer_counts_as_failed(
    context: zmq.asyncio.Context,
) -> None:
    index = indexed()
    silent = context.socket(zmq.ROUTER)  # accepts the request, never answers
    silent.bind("tcp://127.0.0.1:*")
    address = silent.getsockopt(zmq.LAST_ENDPOINT).decode()  # type: ignore[union-attr]
    endpoint = EventEndpoint("tcp://127.0.0.1:1", False, address)
    sub = subscriber(context, endpoint, index, replay_timeout_s=0.1)
    try:
        await sub.receive(frames(0, stored(list(range(4)), None, [1])))
        await sub.receive(frames(2, stored(list(range(4, 8)), 1, [2])))
    finally:
        silent.close(linger=0)
    assert sub.stats.replay_failures == 1
    assert sub.stats.resyncs == {"gap": 1}
    # Cleared; the block after the gap names block 1 as its parent, which the engine must
    # then hold: block 1 comes back from before the clear (_indexer: chains remembered).
    assert index.blocks_of(R) == 2 and sub.indexer.stats.recalled_blocks == 1
    assert sub.indexer.stats.orphan_blocks == 0


async def test_a_restarted_engine_starts_over(context: zmq.asyncio.Context) -> None:
    index = indexed()
    sub = subscriber(context, index=index)
    await sub.receive(frames(0, stored(list(range(4)), None, [1])))
    assert sub.state is StreamState.LIVE  # a stream from 0 is a fresh, empty engine
    await sub.receive(frames(1, stored(list(range(4, 8)), 1, [2])))
    assert index.blocks_of(R) == 2
    await sub.receive(frames(0, stored(list(range(50, 54)), None, [1])))  # restarted
    assert sub.stats.restarts == 1 and sub.stats.resyncs == {"restart": 1}
    assert sub.state is StreamState.LIVE
    assert index.blocks_of(R) == 1
    assert index.match(HASHER.hash_tokens(list(range(50, 54)))) == {R: 1}
    await sub.receive(frames(3, stored(list(range(60, 64)), None, [5])))  # a gap, no replay
    assert sub.state is StreamState.RESYNCING


async def test_a_stream_joined_late_is_resyncing_until_a_reset(
    context: zmq.asyncio.Context,
) -> None:
    index = indexed()
    sub = subscriber(context, index=index)
    assert sub.state is StreamState.WAITING
    await sub.receive(frames(7, stored(list(range(4)), None, [1])))
    assert sub.state is StreamState.RESYNCING  # the engine ran before we listened
    assert index.blocks_of(R) == 1  # what it tells us now is still used
    await sub.receive(frames(8, AllBlocksCleared()))
    assert sub.state is StreamState.LIVE and index.blocks_of(R) == 0


async def test_undecodable_messages_are_counted_and_skipped(
    context: zmq.asyncio.Context,
) -> None:
    index = indexed()
    sub = subscriber(context, BIND_ANY, index)
    with pytest.raises(EventDecodeError):
        await sub.receive([b"", (0).to_bytes(8, "big"), b"\xc1"])
    assert sub.sequence.last is None  # a bad payload does not move the sequence
    await sub.start()
    raw = context.socket(zmq.PUB)
    raw.connect(sub.address or "")
    try:
        while sub.stats.decode_errors == 0:
            await raw.send_multipart([b"", b"\x00", b"garbage"])
            await asyncio.sleep(0.01)
        await raw.send_multipart(frames(0, stored(list(range(4)), None, [1])))
        await until(lambda: sub.stats.batches == 1)
    finally:
        raw.close(linger=0)
        await sub.stop()
    assert index.blocks_of(R) == 1


async def test_a_busy_address_is_a_config_error(context: zmq.asyncio.Context) -> None:
    index = PrefixIndex()
    first = subscriber(context, BIND_ANY, index)
    await first.start()
    try:
        second = subscriber(context, EventEndpoint(first.address or "", True), index)
        with pytest.raises(BadEndpoint):
            await second.start()
    finally:
        await first.stop()


def test_replay_replies_of_both_vllm_generations_are_read() -> None:
    from prefixroute.events._subscriber import _replay_reply

    seq = (5).to_bytes(8, "big")
    end = (-1).to_bytes(8, "big", signed=True)
    assert _replay_reply([b"", b"kv", seq, b"p"]) == (5, b"p")  # vLLM 0.32: topic first
    assert _replay_reply([b"", seq, b"p"]) == (5, b"p")  # earlier: [seq, payload]
    assert _replay_reply([b"", b"", end, b""]) == (-1, b"")  # the end marker
    assert _replay_reply([b"", b"x"]) is None
    assert _replay_reply([b"", b"t", b"short", b"p"]) is None
