"""A picker told to stop (SIGTERM: ``prefixroute epp`` leaves its ``async with``) drains as
``serve`` does: the calls under way, a stream's for as long as it runs, get
``shutdown_timeout_s`` to end, while new ones are refused (its gRPC health says NOT_SERVING at
once). It gave them 5 s: a rolling update of the picker cut every longer generation."""

from __future__ import annotations

import asyncio
import time

from prefixroute.epp import EndpointPicker

from .conftest import PickerFactory
from .grpc_envoy import Exchange

BODY = {"prompt": "a b c d", "max_tokens": 4, "stream": True}
ANSWER = b'data: {"choices":[{"text":"x"}]}\n\ndata: [DONE]\n\n'


async def test_a_stopping_picker_drains_for_shutdown_timeout_s(
    make_picker: PickerFactory,
) -> None:
    epp: EndpointPicker = await make_picker(shutdown_timeout_s=1.5)
    graces: list[float] = []
    stop = epp.stop

    async def recorded(grace_s: float = 5.0) -> None:
        graces.append(grace_s)
        await stop(grace_s)

    epp.stop = recorded  # type: ignore[method-assign]
    held = Exchange(epp)
    await held.pick("/v1/completions", BODY)  # a stream under way
    t0 = time.monotonic()
    stopping = asyncio.create_task(epp.__aexit__(None, None, None))
    await asyncio.sleep(0.5)
    assert not stopping.done()  # it waits for the call
    await held.answer(200, "text/event-stream", ANSWER)  # which ends normally, mid-drain
    async with asyncio.timeout(5):
        await stopping
    assert graces == [1.5]
    assert time.monotonic() - t0 < 1.5  # done when the last call was, not at the bound
