"""Whatever one message carries, the subscriber's task goes on reading the next (an events
audit, 2026-12; each test failed on the code before). vLLM numbers batches from 0 with
``seq.to_bytes(8, "big")`` (vllm/distributed/kv_events.py, ZmqEventPublisher._publisher_thread),
so a sequence frame at or above 2**63, which we read as negative, only comes from something
that is not a vLLM publisher: it must be survived, replay endpoint or not."""

from __future__ import annotations

import asyncio
import logging

import pytest
import zmq
import zmq.asyncio

from prefixroute.core import PrefixIndex
from prefixroute.events import EventEndpoint, EventSubscriber

from .helpers import R, frames, indexed, payload, stored, subscriber


async def applied_or_ended(index: PrefixIndex, sub: EventSubscriber) -> None:
    """Until the last batch's one block is in the index, or the subscriber's task has ended
    (3 s at most)."""
    for _ in range(300):
        if index.blocks_of(R) == 1 or sub._task is None or sub._task.done():
            return
        await asyncio.sleep(0.01)


async def test_a_sequence_above_2_to_the_63_then_a_gap_with_replay_keeps_the_task_alive(
    context: zmq.asyncio.Context,
) -> None:
    router = context.socket(zmq.ROUTER)  # a replay socket that never answers
    port = router.bind_to_random_port("tcp://127.0.0.1")
    index = indexed()
    endpoint = EventEndpoint("tcp://127.0.0.1:*", True, f"tcp://127.0.0.1:{port}")
    sub = subscriber(context, endpoint, index, replay_timeout_s=0.05)
    await sub.start()
    pub = context.socket(zmq.PUB)
    pub.connect(sub.address or "")
    try:
        while sub.stats.batches == 0:  # PUB/SUB: resend until the subscription is up
            await pub.send_multipart([b"", (2**64 - 2).to_bytes(8, "big"), payload()])
            await asyncio.sleep(0.01)
        # Read as -2: the next number's "missing" range starts at -1, which no replay request
        # can carry (to_bytes of a negative number raised OverflowError in the task).
        await pub.send_multipart(frames(5))
        await pub.send_multipart(frames(6, stored(list(range(4)), None, [1])))
        await applied_or_ended(index, sub)
        assert sub._task is not None and not sub._task.done()
        assert index.blocks_of(R) == 1
        assert sub.stats.resyncs.get("gap") == 1  # the gap is cleared for, as any other
    finally:
        pub.close(linger=0)
        router.close(linger=0)
        await sub.stop()


async def test_an_unexpected_error_is_one_log_line_and_a_resync_not_a_dead_task(
    context: zmq.asyncio.Context,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    index = indexed()
    sub = subscriber(context, "bind:tcp://127.0.0.1:*", index)
    await sub.start()
    pub = context.socket(zmq.PUB)
    pub.connect(sub.address or "")
    real_apply = sub.indexer.apply
    broken = {"once": True}

    def apply_once_broken(batch: object) -> None:  # a bug we do not know of yet
        if broken.pop("once", False):
            raise ValueError("boom")
        real_apply(batch)  # type: ignore[arg-type]

    monkeypatch.setattr(sub.indexer, "apply", apply_once_broken)
    try:
        seq = 0
        with caplog.at_level(logging.WARNING):
            while broken:  # until the broken apply was reached
                await pub.send_multipart(frames(seq))
                seq += 1
                await asyncio.sleep(0.01)
            await pub.send_multipart(frames(seq, stored(list(range(4)), None, [1])))
            await applied_or_ended(index, sub)
        assert sub._task is not None and not sub._task.done()
        assert index.blocks_of(R) == 1
        assert sub.stats.resyncs.get("error") == 1
        lines = [r for r in caplog.records if "boom" in r.getMessage()]
        assert len(lines) == 1 and lines[0].exc_info is None  # one line, no traceback
    finally:
        pub.close(linger=0)
        await sub.stop()
