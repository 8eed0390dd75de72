"""Streams out of ext_proc's order (epp/_order.py; an outside audit, 2026-12-06): each is
refused with a 500 that names the configuration to fix, and leaves no slot or load behind.
Envoy sends a request's headers once, first; a proxy that sends them twice, sends a body with
no headers (``request_header_mode: SKIP``) or never sends the body (``request_body_mode:
NONE``) is misconfigured or is not Envoy."""

from __future__ import annotations

import json
from typing import Any

from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2 as mode_pb2
from heard import Heard

from prefixroute.epp import PickShared, PickStream
from prefixroute.gateway import TenancyConfig, TenantLimits

from .support import (
    BUFFERED,
    ENDPOINTS,
    completion,
    pick,
    picked,
    request_body,
    request_headers,
    shared,
)

NONE = mode_pb2.ProcessingMode.NONE
DESTINATION = "x-gateway-destination-endpoint"


def refused(out: list[Any]) -> tuple[int, str]:
    """(status, error message) of a stream's ImmediateResponse."""
    assert [r.WhichOneof("response") for r in out] == ["immediate_response"], out
    answer = out[0].immediate_response
    return answer.status.code, json.loads(answer.body)["error"]["message"]


def in_flight(s: PickShared) -> int:
    return sum(s.router.replica_load(f"http://{e}").in_flight for e in ENDPOINTS)


async def test_a_second_headers_message_is_refused_and_gives_back_what_the_first_took() -> None:
    s = shared(tenancy=TenancyConfig(default_limits=TenantLimits(max_in_flight=2)))
    for _ in range(3):  # each took a tenant slot and a load it never gave back
        stream = PickStream(s)
        first = await stream.handle(request_headers("/v1/models", end_of_stream=True))
        assert picked(first)[0] in ENDPOINTS  # routed on its headers
        status, message = refused(await stream.handle(request_headers()))
        assert status == 500 and "a second request headers message" in message
        stream.close()
        assert in_flight(s) == 0
    held = [PickStream(s), PickStream(s)]  # both of the tenant's two slots are free
    for stream in held:
        assert picked(await pick(stream, completion(10)))[0] in ENDPOINTS


async def test_a_body_without_its_headers_is_refused_not_routed() -> None:
    """No path and no API key: it was routed without the tenant's authentication."""
    s = shared()
    stream = PickStream(s)
    status, message = refused(await stream.handle(request_body(completion(10))))
    assert status == 500 and "request_header_mode SEND" in message
    assert stream.decision is None and in_flight(s) == 0
    stream.close()
    assert in_flight(s) == 0


async def test_a_body_the_proxy_will_never_send_is_refused() -> None:
    """Body mode NONE: the client's own destination header went on to Envoy's cluster."""
    s = shared()
    stream = PickStream(s)
    out = await stream.handle(request_headers(mode=NONE, extra={DESTINATION: "192.0.2.9:80"}))
    status, message = refused(out)
    assert status == 500 and "request_body_mode NONE" in message
    assert in_flight(s) == 0
    # A request with no body needs none: picked on its headers, in the same mode.
    out = await PickStream(s).handle(request_headers("/v1/models", True, mode=NONE))
    assert picked(out)[0] in ENDPOINTS


async def test_a_headers_answer_without_the_pick_removes_the_clients_destination() -> None:
    """Buffered (also a proxy that does not say its mode, taken as buffered): the pick comes
    with the body, and meanwhile the client's own header must not reach the proxy's
    original-destination cluster (in body mode NONE, it went there)."""
    for mode in (BUFFERED, None):
        s = shared()
        s.default_full_duplex = False
        out = await PickStream(s).handle(
            request_headers(mode=mode, extra={DESTINATION: "192.0.2.9:80"})
        )
        assert [r.WhichOneof("response") for r in out] == ["request_headers"]
        mutation = out[0].request_headers.response.header_mutation
        assert list(mutation.remove_headers) == [DESTINATION]
        assert not mutation.set_headers


async def test_a_body_in_pieces_the_picker_cannot_wait_for_is_refused_whole_ones_picked() -> None:
    """STREAMED (and BUFFERED_PARTIAL) answer each piece before the next: the pick was made on
    the first piece, and a client's valid JSON was a 400 'not valid JSON', depending on how
    its bytes happened to arrive (an outside audit, 2026-12-06)."""
    partial = mode_pb2.ProcessingMode.BUFFERED_PARTIAL
    for mode in (mode_pb2.ProcessingMode.STREAMED, partial):
        s = shared()
        stream = PickStream(s)
        await stream.handle(request_headers(mode=mode))
        body = completion(50)
        status, message = refused(await stream.handle(request_body(body[:40], False)))
        assert status == 500 and "needs it whole" in message and in_flight(s) == 0
        whole = PickStream(s)  # the same body in one piece: picked as before
        await whole.handle(request_headers(mode=mode))
        assert picked(await whole.handle(request_body(body)))[0] in ENDPOINTS


class _Cancelled:
    """A stream the proxy cancels between the picker's read and its write."""

    def __init__(self, cancelled: bool) -> None:
        self.sent = [request_headers("/v1/models", end_of_stream=True)]
        self._cancelled = cancelled

    async def read(self) -> Any:
        import grpc

        return self.sent.pop(0) if self.sent else grpc.aio.EOF

    async def write(self, _: Any) -> None:
        raise RuntimeError("ExecuteBatchError, as gRPC raises it on a finished call")

    def cancelled(self) -> bool:
        return self._cancelled

    def done(self) -> bool:
        return self._cancelled


async def test_a_stream_cancelled_before_the_write_ends_quietly_and_releases() -> None:
    """gRPC logged such a write's ExecuteBatchError as a servicer traceback at ERROR (about 1
    cancel in 3,000: an outside audit, 2026-12-06); a write that fails on a live stream is
    still an error."""
    import pytest

    from prefixroute.epp._server import _Processor

    s = shared()
    await _Processor(s).Process(iter(()), _Cancelled(cancelled=True))  # type: ignore[arg-type]
    assert in_flight(s) == 0
    with pytest.raises(RuntimeError):
        await _Processor(s).Process(iter(()), _Cancelled(cancelled=False))  # type: ignore[arg-type]
    assert in_flight(s) == 0


def test_a_subset_hint_names_an_endpoint_however_its_address_is_written() -> None:
    from prefixroute.epp._candidates import narrow, replica_of

    v6, v4 = replica_of("[fd00::7]:8000"), replica_of("10.0.0.7:8000")
    assert narrow([v6, v4], ["[fd00:0:0::7]:8000"]) == [v6]  # an IPv6 address, not canonical
    assert narrow([v6, v4], ["10.0.0.7:08000"]) == [v4]  # a port with a leading zero
    assert narrow([v6, v4], ["[FD00::7]:8000", "10.0.0.7:8000"]) == [v6, v4]


async def test_a_pick_refused_afterwards_is_taken_back_at_the_other_pickers_too() -> None:
    s = shared()
    told = Heard()  # the other pickers' sync, as it hears the picker
    s.state.sync = told  # type: ignore[assignment]
    stream = PickStream(s)
    await stream.handle(request_headers("/v1/models", end_of_stream=True))
    refused(await stream.handle(request_headers()))  # the second headers message
    rid = stream.rid
    assert told.heard[0] == ("routed", rid) and ("withdrawn", rid) in told.heard
    assert told.heard.index(("withdrawn", rid)) < told.heard.index(("completed", rid))
