"""Envoy's part, played over gRPC: one ext_proc stream per request, without an Envoy binary.

:class:`Exchange` asks a picker where a request goes (request headers and body, full duplex, as
Envoy sends them), and then, as Envoy relays the answer, tells it the response's headers and
body. Between the two the test decides what the replica does: nothing yet (the request is still
in flight at the picker), or a real POST to the picked endpoint (:func:`through`).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from prefixroute.epp import EndpointPicker

from .support import picked, request_body, request_headers, response_body, response_headers
from .support import set_headers as headers_set

REFUSAL_WAIT_S = 5.0  # a refusal comes at once, on the headers


@dataclass
class Exchange:
    """One request through one picker's ext_proc stream."""

    epp: EndpointPicker
    channel: grpc.aio.Channel | None = None
    call: Any = None
    endpoint: str = ""  # the picked ip:port
    client_headers: dict[str, str] = field(default_factory=dict)  # added to the answer

    async def pick(
        self, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> str:
        """``headers``: the client's own (a tenant, an API key)."""
        self._open()
        await self.call.write(request_headers(path, extra=headers))
        await self.call.write(request_body(json.dumps(body).encode()))
        first = await self.call.read()
        if first.WhichOneof("response") == "immediate_response":  # nothing more would come
            await self.close()
            raise AssertionError(f"refused: {first.immediate_response.status.code}")
        answers = [first, await self.call.read()]  # headers, then the body
        header, meta = picked(answers)
        assert header is not None and header == meta, answers
        self.endpoint = header
        return header

    async def refused(self, path: str, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
        """A request the picker refuses on its headers (who, may they): the status and JSON
        body of its ``ImmediateResponse``, which Envoy sends the client."""
        self._open()
        await self.call.write(request_headers(path, extra=headers))
        try:  # admitted, the picker answers nothing before the body: fail, do not hang
            answer = await asyncio.wait_for(self.call.read(), REFUSAL_WAIT_S)
        except TimeoutError:
            raise AssertionError("not refused: the picker waits for the body") from None
        finally:
            await self.close()
        assert answer.WhichOneof("response") == "immediate_response", answer
        return answer.immediate_response.status.code, json.loads(answer.immediate_response.body)

    def _open(self) -> None:
        self.channel = grpc.aio.insecure_channel(self.epp.address)
        self.call = pb_grpc.ExternalProcessorStub(self.channel).Process()

    async def answer(self, status: int, content_type: str, body: bytes) -> None:
        """The replica's answer as Envoy relays it, then the stream's end."""
        await self.call.write(response_headers(status, content_type))
        resp = await self.call.read()
        self.client_headers = headers_set(resp.response_headers.response.header_mutation)
        await self.call.write(response_body(body, end_of_stream=True))
        await self.call.read()
        await self.close()

    async def close(self) -> None:
        if self.call is not None:
            await self.call.done_writing()
            while await self.call.read() != grpc.aio.EOF:
                pass
            self.call = None
        if self.channel is not None:
            await self.channel.close()
            self.channel = None


@dataclass
class Passed:
    """What the client got, through a picker, from the replica it picked."""

    endpoint: str
    headers: dict[str, str]  # the picker's x-prefixroute-* headers
    body: dict[str, Any]

    @property
    def predicted(self) -> int:
        return int(self.headers["x-prefixroute-predicted-cached-tokens"])

    @property
    def cached(self) -> int:
        return int(self.body["usage"]["prompt_tokens_details"]["cached_tokens"])


async def through(
    epp: EndpointPicker,
    session: aiohttp.ClientSession,
    path: str,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
) -> Passed:
    """One plain request, picked by ``epp`` and sent where it said, as Envoy would;
    ``headers``: the client's own, which the picker reads (a tenant, an API key)."""
    ex = Exchange(epp)
    try:
        endpoint = await ex.pick(path, body, headers)
        async with session.post(f"http://{endpoint}{path}", json=body) as resp:
            raw = await resp.read()
            await ex.answer(resp.status, resp.headers.get("Content-Type", ""), raw)
    finally:
        await ex.close()
    return Passed(endpoint, ex.client_headers, json.loads(raw))
