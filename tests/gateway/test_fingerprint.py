"""``system_fingerprint`` when the gateway hides the usage event it asked for (``_fingerprint``).

vLLM 0.32 puts the fingerprint on the chunks that carry a ``finish_reason`` when the client did
not ask for usage, and only on the usage chunk when it did
(``vllm/entrypoints/openai/chat_completion/serving.py``). A client that did not ask must get
the chunks it would have got from vLLM directly, fingerprint included.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
from hypothesis import given
from hypothesis import strategies as st

from prefixroute.gateway._sse import SSEScanner

from .fakes import FakeReplica
from .helpers import FakeFactory, GatewayFactory, parse_stream

MARK = "vllm-0.32.0-1a2b3c4d"


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _chunk(index: int, text: str, finish: str | None = None, mark: bool = False) -> bytes:
    choice: dict[str, Any] = {"index": index, "delta": {"content": text}}
    if finish is not None:
        choice["finish_reason"] = finish
    obj: dict[str, Any] = {"id": "c", "object": "chat.completion.chunk", "choices": [choice]}
    if mark:
        obj["system_fingerprint"] = MARK
    return _event(obj)


def _usage(mark: str | None = MARK) -> bytes:
    obj: dict[str, Any] = {"id": "c", "choices": [], "usage": {"prompt_tokens": 4}}
    if mark is not None:
        obj["system_fingerprint"] = mark
    return _event(obj)


DONE = b"data: [DONE]\n\n"
# What vLLM sends when asked for usage (the gateway's ask), and when not (what the client wants).
ASKED = _chunk(0, "a") + _chunk(0, "b", "stop") + _usage() + DONE
NOT_ASKED = _chunk(0, "a") + _chunk(0, "b", "stop", mark=True) + DONE


def _relayed(stream: bytes, cuts: list[int], hide_usage: bool = True) -> bytes:
    s = SSEScanner(hide_usage=hide_usage)
    bounds = [0, *sorted(cuts), len(stream)]
    out = b"".join(s.feed(stream[a:b]) for a, b in zip(bounds, bounds[1:], strict=False))
    return out + s.flush()


def _parsed(stream: bytes) -> list[Any]:
    return [json.loads(e[6:]) if e != b"data: [DONE]" else "[DONE]" for e in stream.split(b"\n\n")
            if e]  # fmt: skip


@given(st.lists(st.integers(min_value=1, max_value=len(ASKED) - 1), max_size=6, unique=True))
def test_the_finish_chunk_gets_the_hidden_usage_events_fingerprint(cuts: list[int]) -> None:
    """However the upstream cuts its bytes, the client gets vLLM's stream for a client that
    did not ask: the usage event gone, its fingerprint on the finish chunk."""
    assert _parsed(_relayed(ASKED, cuts)) == _parsed(NOT_ASKED)


def test_the_rest_of_the_chunk_goes_out_as_the_replica_wrote_it() -> None:
    out = _relayed(ASKED, [])
    finish = _chunk(0, "b", "stop")
    assert out.startswith(_chunk(0, "a"))
    stamped = out[len(_chunk(0, "a")) :].split(b"\n\n")[0] + b"\n\n"
    assert stamped == finish.replace(b"{", b'{"system_fingerprint":"' + MARK.encode() + b'",', 1)


def test_without_a_fingerprint_in_the_usage_event_the_chunks_go_as_they_came() -> None:
    """SGLang and older vLLMs: no fingerprint to move; nothing is added."""
    stream = _chunk(0, "a") + _chunk(0, "b", "stop") + _usage(None) + DONE
    assert _relayed(stream, []) == _chunk(0, "a") + _chunk(0, "b", "stop") + DONE


def test_a_stream_without_a_usage_event_still_gets_its_finish_chunk() -> None:
    """Held for a usage event that never comes: out before [DONE], or at the stream's end."""
    for stream in (_chunk(0, "a", "stop") + DONE, _chunk(0, "a", "stop")):
        assert _relayed(stream, []) == stream
        assert _relayed(stream, [3, 20]) == stream


def test_one_choices_end_does_not_hold_up_another() -> None:
    """n=2: choice 1's tokens pass while choice 0's finish chunk waits for the fingerprint;
    each choice's chunks keep their order."""
    stream = (_chunk(0, "a") + _chunk(1, "x") + _chunk(0, "b", "stop") + _chunk(1, "y")
              + _chunk(1, "z", "length") + _usage() + DONE)  # fmt: skip
    s = SSEScanner(hide_usage=True)
    assert s.feed(_chunk(0, "a") + _chunk(1, "x") + _chunk(0, "b", "stop")) == (
        _chunk(0, "a") + _chunk(1, "x")
    )
    assert s.feed(_chunk(1, "y")) == _chunk(1, "y")  # not held behind choice 0's end
    events = _parsed(_relayed(stream, []))
    by_choice = [[e["choices"][0] for e in events[:-1] if e["choices"][0]["index"] == i]
                 for i in (0, 1)]  # fmt: skip
    assert [c["delta"]["content"] for c in by_choice[0]] == ["a", "b"]
    assert [c["delta"]["content"] for c in by_choice[1]] == ["x", "y", "z"]
    finished = [e for e in events[:-1] if e["choices"][0].get("finish_reason")]
    assert len(finished) == 2 and all(e["system_fingerprint"] == MARK for e in finished)
    assert events[-1] == "[DONE]"


def test_nothing_is_held_when_the_client_asked_for_usage() -> None:
    s = SSEScanner(hide_usage=False)
    assert s.feed(_chunk(0, "b", "stop")) == _chunk(0, "b", "stop")


async def test_through_the_gateway_a_stream_keeps_its_fingerprint(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """A replica that behaves as vLLM 0.32 does: the client that did not ask for usage gets,
    through the gateway (which asks), the same chunks as from the replica directly."""

    async def vllm_like(request: Any) -> Any:
        from aiohttp import web

        body = await request.json()
        asked = (body.get("stream_options") or {}).get("include_usage")
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        await out.write(ASKED if asked else NOT_ASKED)
        await out.write_eof()
        return out

    fake: FakeReplica = await make_fake(handler=vllm_like)
    gw = await make_gateway([fake.url])
    body = {"model": "emulated", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    streams = []
    for url in (fake.url, gw.url):
        async with session.post(url + "/v1/chat/completions", json=body) as r:
            assert r.status == 200
            streams.append(parse_stream(await r.text()))
    (direct, direct_done), (relayed, relayed_done) = streams
    assert direct_done and relayed_done
    assert relayed == direct
    assert relayed[-1]["system_fingerprint"] == MARK


async def test_a_stream_that_breaks_after_its_finish_chunk_still_delivers_it(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """The finish chunk held for a usage event that never comes goes out before the error
    event that ends the broken stream."""

    async def breaks(request: Any) -> Any:
        from aiohttp import web

        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        await out.write(_chunk(0, "a") + _chunk(0, "b", "stop"))
        await asyncio.sleep(0.05)
        assert request.transport is not None
        request.transport.abort()
        return out

    fake: FakeReplica = await make_fake(handler=breaks)
    gw = await make_gateway([fake.url])
    body = {"model": "emulated", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    async with session.post(gw.url + "/v1/chat/completions", json=body) as r:
        events, done = parse_stream(await r.text())
    assert done
    assert [e["choices"][0]["delta"]["content"] for e in events[:2]] == ["a", "b"]
    assert events[1]["choices"][0]["finish_reason"] == "stop" and "error" in events[2]
