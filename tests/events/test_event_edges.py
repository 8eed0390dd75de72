"""Events that decode but carry values no engine should send (an outside audit, 2026-12-02;
each test failed on the code before): the subscriber's docstring says a payload that does not
decode is counted and skipped and the stream goes on, and so it must for these too."""

from __future__ import annotations

import asyncio

import zmq
import zmq.asyncio

from .helpers import BIND_ANY, R, frames, indexed, stored, subscriber


async def test_a_token_id_out_of_range_skips_its_blocks_and_the_stream_goes_on(
    context: zmq.asyncio.Context,
) -> None:
    index = indexed()
    sub = subscriber(context, BIND_ANY, index)
    await sub.start()
    raw = context.socket(zmq.PUB)
    raw.connect(sub.address or "")
    try:
        while sub.stats.batches == 0:  # PUB/SUB: resend until the subscription is up
            await raw.send_multipart(frames(0, stored(list(range(4)), None, [1])))
            await asyncio.sleep(0.01)
        await raw.send_multipart(frames(1, stored([2**32, 0, 0, 0], None, [9])))
        await raw.send_multipart(frames(2, stored([-1, 0, 0, 0], None, [8])))
        await raw.send_multipart(frames(3, stored(list(range(10, 14)), None, [3])))
        for _ in range(200):
            if sub.stats.batches >= 4 or sub._task is None or sub._task.done():
                break
            await asyncio.sleep(0.01)
        assert sub._task is not None and not sub._task.done()
        assert index.blocks_of(R) == 2  # blocks 1 and 3, not 9 or 8
        assert sub.indexer.stats.skipped_blocks == 2
    finally:
        raw.close(linger=0)
        await sub.stop()


async def test_a_sequence_jump_past_2_to_the_63_is_a_gap_like_any_other(
    context: zmq.asyncio.Context,
) -> None:
    sub = subscriber(context)
    await sub.receive(frames(-2, stored(list(range(4)), None, [1])))
    await sub.receive(frames(2**63 - 1, stored(list(range(4, 8)), 1, [2])))  # OverflowError
    assert sub.stats.gaps == 1
    assert sub.stats.missed == 2**63
