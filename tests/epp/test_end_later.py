"""A clean answer's end is accounted after Envoy has the last chunk's answer (``PickShared.later``).

From ``PickShared``'s docstrings: the picker's server runs a clean end's router work on the loop's
next turn, its time taken when the answer ended; a stream that is cut ends at once; on its own
(``later`` None) a PickStream ends at once, as before.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

from prefixroute.core.replica_load import ReplicaLoad
from prefixroute.epp import EndpointPicker, EppConfig, PickShared, PickStream

from .support import completion, pick, response_body, response_headers, shared

USAGE = {
    "prompt_tokens": 100, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 0}
}  # fmt: skip
FINAL = f"data: {json.dumps({'choices': [], 'usage': USAGE})}\n\ndata: [DONE]\n\n".encode()


async def _streaming() -> tuple[PickShared, list[Callable[[], None]], PickStream, ReplicaLoad]:
    """A picked stream whose answer has started, on a picker whose clean ends are held in the
    returned list (``PickShared.later``); with the picked replica's load."""
    s = shared()
    held: list[Callable[[], None]] = []
    s.later = held.append
    stream = PickStream(s)
    await pick(stream, completion(100, stream=True))
    load = s.router.loads.get(stream.decision.replica)  # type: ignore[union-attr]
    await stream.handle(response_headers(content_type="text/event-stream"))
    return s, held, stream, load


async def test_the_last_chunk_is_answered_before_the_router_hears_the_end() -> None:
    s, held, stream, load = await _streaming()
    s.clock.now = 100.5  # type: ignore[attr-defined]
    await stream.handle(response_body(b'data: {"choices":[{"text":"a"}]}\n\n'))
    s.clock.now = 101.0  # type: ignore[attr-defined]
    back = await stream.handle(response_body(FINAL, end_of_stream=True))
    assert back[0].response_body.response.body_mutation.streamed_response.end_of_stream
    assert len(held) == 1 and load.in_flight == 1  # answered; the end not heard yet
    s.clock.now = 105.0  # type: ignore[attr-defined]  # the loop's next turn comes late
    held[0]()
    assert load.in_flight == 0 and s.router.usage_reports == 1
    # Its decode phase was timed to the answer's end (101.0), not to when the turn came.
    assert load.speed.decode_observations == 1
    assert abs(load.speed._decode[-1].seconds - 0.5) < 1e-9
    stream.close()  # already ended: nothing more
    assert len(held) == 1 and load.in_flight == 0


async def test_a_cut_stream_ends_at_once_even_with_a_later() -> None:
    _, held, stream, load = await _streaming()
    stream.close()  # the gRPC stream ended mid-answer
    assert held == [] and load.in_flight == 0


async def test_the_pickers_server_ends_answers_on_the_loops_next_turn() -> None:
    picker = EndpointPicker(EppConfig())
    ran: list[int] = []
    later = picker.shared.later
    assert later is not None
    later(lambda: ran.append(1))
    assert ran == []
    await asyncio.sleep(0)
    assert ran == [1]
