"""The picker's plain answers, as the gateway's (gateway/_accounting.py): once the replica's
speed is its own, a request that asked for no stream stops counting as queued prefill when its
first token is due; at its end its whole time, with its usage, teaches the speed model. A
stream's first token is seen, so nothing is guessed for it."""

from __future__ import annotations

import asyncio
import json

from prefixroute.epp import PickShared, PickStream

from .support import completion, pick, response_body, response_headers, shared

USAGE = {"usage": {"prompt_tokens": 100, "completion_tokens": 4,
                   "prompt_tokens_details": {"cached_tokens": 0}}}  # fmt: skip


def warmed() -> PickShared:
    """A picker whose replicas' speeds are their own (eight first tokens each, 10,000 t/s)."""
    s = shared()
    for replica in s.router.replicas:
        speed = s.router.replica_load(replica).speed
        for i in range(8):
            speed.observe_first_token(0.0, 0.0, False, 1000 + 100 * i, (1000 + 100 * i) / 1e4)
        assert speed.warmed_up
    return s


async def routed(s: PickShared, stream_asked: bool) -> PickStream:
    stream = PickStream(s)
    await pick(stream, completion(100, stream=stream_asked))
    assert stream.decision is not None
    return stream


async def test_a_plain_answer_leaves_the_queue_when_due_and_teaches_whole() -> None:
    s = warmed()
    stream = await routed(s, stream_asked=False)
    load = s.router.replica_load(stream.decision.replica)  # type: ignore[union-attr]
    assert load.prefilling == 1
    await asyncio.sleep(0.1)  # 100 words at 10,000 tokens/s: due within milliseconds
    assert (load.in_flight, load.prefilling, load.queued_prefill_tokens) == (1, 0, 0)
    s.clock.now += 1.0  # type: ignore[attr-defined]
    await stream.handle(response_headers())
    await stream.handle(response_body(json.dumps(USAGE).encode(), end_of_stream=True))
    assert load.in_flight == 0 and load.speed.whole_observations == 1


async def test_nothing_is_guessed_for_a_stream_or_a_cold_replica() -> None:
    s = warmed()
    stream = await routed(s, stream_asked=True)
    load = s.router.replica_load(stream.decision.replica)  # type: ignore[union-attr]
    cold = shared()
    plain = await routed(cold, stream_asked=False)
    cold_load = cold.router.replica_load(plain.decision.replica)  # type: ignore[union-attr]
    await asyncio.sleep(0.1)
    assert load.prefilling == 1 and cold_load.prefilling == 1
