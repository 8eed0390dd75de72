"""The request side's edges, message by message, as Envoy 1.40 sends them (an outside audit,
2026-12-02; each test failed on the code before): trailers after the body or in its place, a
last chunk Envoy sends again, and the bodies ``serve`` refuses (over ``max_body_bytes``: 413;
none where a prompt belongs: 400)."""

from __future__ import annotations

import json

import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from prefixroute.epp import PickStream

from .support import (
    BUFFERED,
    completion,
    pick,
    picked,
    request_body,
    request_headers,
    response_body,
    response_headers,
    shared,
)

TRAILERS = pb.ProcessingRequest(request_trailers=pb.HttpTrailers())


def kinds(out: list[pb.ProcessingResponse]) -> list[str]:
    return [str(r.WhichOneof("response")) for r in out]


async def test_buffered_a_body_followed_by_trailers_is_picked_in_its_body_answer() -> None:
    """Buffered, with trailers to follow: Envoy sends the whole body with end_of_stream false
    and waits for its answer before it sends the trailers (it answered 504 after the message
    timeout, waiting)."""
    stream = PickStream(shared())
    await stream.handle(request_headers(mode=BUFFERED))
    out = await stream.handle(request_body(completion(20), end_of_stream=False))
    assert kinds(out) == ["request_body"]
    assert picked(out)[0]
    assert kinds(await stream.handle(TRAILERS)) == ["request_trailers"]  # picked once


async def test_full_duplex_trailers_without_a_body_get_the_headers_answer_only() -> None:
    """No body message came, so no body answer goes (Envoy answered the client 500 for the
    body answer it never asked: "Spurious response message")."""
    stream = PickStream(shared())
    await stream.handle(request_headers("/v1/models"))  # routed on load alone
    out = await stream.handle(TRAILERS)
    assert kinds(out) == ["request_headers", "request_trailers"]
    assert picked(out[:1])[0]
    # Where a prompt belongs, no body is serve's 400: the error alone, no trailers answer after.
    stream = PickStream(shared())
    await stream.handle(request_headers())
    out = await stream.handle(TRAILERS)
    assert kinds(out) == ["immediate_response"]
    assert out[0].immediate_response.status.code == 400


async def test_a_body_chunk_after_the_pick_is_not_routed_again() -> None:
    """Envoy >= 1.35 may send the last chunk again in full duplex (envoyproxy/envoy#46237)."""
    s = shared("round_robin")
    stream = PickStream(s)
    await pick(stream, completion(20))
    assert await stream.handle(request_body(completion(20))) == []
    await stream.handle(response_headers(200))
    await stream.handle(response_body(json.dumps({"usage": {}}).encode(), end_of_stream=True))
    stream.close()
    assert sum(s.router.replica_load(r).in_flight for r in s.router.replicas) == 0
    assert sum(s.router.replica_load(r).completed for r in s.router.replicas) == 1  # one route


async def test_a_body_over_max_body_bytes_is_a_413_as_serve() -> None:
    s = shared(max_body_bytes=1000)
    body = completion(2000)
    stream = PickStream(s)
    await stream.handle(request_headers())
    assert await stream.handle(request_body(body[:900], end_of_stream=False)) == []
    out = await stream.handle(request_body(body[900:1200], end_of_stream=False))
    assert kinds(out) == ["immediate_response"]  # at once: the rest is never held
    assert out[0].immediate_response.status.code == 413
    assert b"request_too_large" in out[0].immediate_response.body
    assert await stream.handle(request_body(body[1200:])) == []  # refused: nothing more
    stream.close()
    assert sum(s.router.replica_load(r).in_flight for r in s.router.replicas) == 0


async def test_no_body_where_a_prompt_belongs_is_a_400_as_serve() -> None:
    for empty in (
        await pick(PickStream(shared()), b""),
        await PickStream(shared()).handle(request_headers(end_of_stream=True)),
    ):
        assert kinds(empty) == ["immediate_response"]
        assert empty[0].immediate_response.status.code == 400
    # A call routed on load alone (no prompt) still is, body or not.
    out = await PickStream(shared()).handle(request_headers("/v1/models", end_of_stream=True))
    assert picked(out)[0]


async def test_a_prompt_body_a_page_could_send_cross_site_is_refused_as_serve_does() -> None:
    """A prompt body declared text/plain (a form, multipart) is a 415 before any pick, as in
    ``serve`` (gateway/_requests.py ``check_json_type``); JSON passes."""
    body = json.dumps({"model": "m", "prompt": "hi", "max_tokens": 1}).encode()
    for ctype in ("text/plain;charset=UTF-8", "application/x-www-form-urlencoded"):
        stream = PickStream(shared())
        out = await pick(stream, body, headers={"content-type": ctype})
        assert stream.decision is None
        answer = out[-1].immediate_response
        assert answer.status.code == 415, ctype
        assert json.loads(answer.body)["error"]["code"] == "unsupported_media_type"
    stream = PickStream(shared())
    await pick(stream, body, headers={"content-type": "application/json"})
    assert stream.decision is not None


async def test_a_long_body_goes_back_in_pieces_of_at_most_62000_bytes() -> None:
    """Full duplex hands the body back to the proxy; some data planes cap one streamed chunk at
    64 KiB, and the reference picker sends 62,000-byte pieces. A 4 MB prompt went back as one
    message. The pieces make the body as it came, and only the last one ends the stream."""
    body = completion(30_000)  # about 200 kB
    out = await pick(PickStream(shared()), body)
    assert kinds(out)[0] == "request_headers" and picked(out)[0]
    pieces = [r.request_body.response.body_mutation.streamed_response for r in out[1:]]
    assert len(pieces) == -(-len(body) // 62_000) >= 3
    assert all(0 < len(p.body) <= 62_000 for p in pieces)
    assert b"".join(p.body for p in pieces) == body
    assert [p.end_of_stream for p in pieces] == [False] * (len(pieces) - 1) + [True]


@pytest.mark.parametrize("method", ["OPTIONS", "GET", "DELETE"])
async def test_a_call_without_a_prompt_to_a_prompt_path_goes_on_to_a_replica(method: str) -> None:
    """Only a POST carries a prompt: a browser's CORS preflight (OPTIONS) to
    /v1/chat/completions got 400 "the request body is not valid JSON" from the picker. Like
    the reference picker, it goes on, routed on load alone, and the replica answers it."""
    sent = {":method": method}
    stream = PickStream(shared())
    out = await stream.handle(request_headers("/v1/chat/completions", True, extra=sent))
    assert kinds(out) == ["request_headers"] and picked(out)[0]
    # With a body that is no JSON: no prompt to read in it either, and it goes on as it came.
    stream = PickStream(shared())
    assert await stream.handle(request_headers("/v1/chat/completions", extra=sent)) == []
    out = await stream.handle(request_body(b"hello"))
    assert kinds(out) == ["request_headers", "request_body"] and picked(out)[0]
    assert out[1].request_body.response.body_mutation.streamed_response.body == b"hello"
