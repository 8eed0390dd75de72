"""Building ext_proc messages as Envoy sends them, and a picker's shared state without servers."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2 as mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf import struct_pb2

from prefixroute.epp import PickShared, PickStream
from prefixroute.gateway import GatewayConfig, Tenants, gateway_state

ENDPOINTS = ("10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000")
FULL_DUPLEX = mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
BUFFERED = mode_pb2.ProcessingMode.BUFFERED
STREAMED = mode_pb2.ProcessingMode.STREAMED


def completion(n: int, *, tag: str = "w", stream: bool = False) -> bytes:
    """A ``/v1/completions`` body whose prompt is ``n`` words: ``{tag}0 {tag}1 ...``."""
    prompt = " ".join(f"{tag}{i}" for i in range(n))
    return json.dumps({"model": "m", "prompt": prompt, "max_tokens": 4, "stream": stream}).encode()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def shared(
    policy: str = "prefix_affinity",
    endpoints: Sequence[str] = ENDPOINTS,
    fallbacks: int = 0,
    **settings: Any,
) -> PickShared:
    """A picker's shared state, wired as ``EndpointPicker`` wires it (the gateway's own state
    and tenants), with a clock the test moves; ``settings``: more ``GatewayConfig`` fields."""
    config = GatewayConfig(
        replicas=tuple(f"http://{e}" for e in endpoints), policy=policy, **settings
    )
    state = gateway_state(config, None)
    tenants = Tenants(config.tenancy, config.upstream_api_key, state.metrics.registry)
    return PickShared(state, tenants, fallbacks=fallbacks, clock=Clock())


def _headers(pairs: dict[str, str]) -> Any:
    return base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()]
    )


def request_headers(
    path: str = "/v1/completions",
    end_of_stream: bool = False,
    mode: int | None = FULL_DUPLEX,
    subset: Any = None,
    extra: dict[str, str] | None = None,
) -> pb.ProcessingRequest:
    """The request headers Envoy sends; ``extra``: the client's own (an API key, a tenant)."""
    sent = {":method": "POST", ":path": path, "content-type": "application/json"}
    req = pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(
            headers=_headers({**sent, **(extra or {})}),
            end_of_stream=end_of_stream,
        )
    )
    if mode is not None:
        req.protocol_config.request_body_mode = mode
        req.protocol_config.response_body_mode = mode
    if subset is not None:
        meta = struct_pb2.Struct()
        meta.update({"x-gateway-destination-endpoint-subset": subset})
        req.metadata_context.filter_metadata["envoy.lb.subset_hint"].CopyFrom(meta)
    return req


def request_body(body: bytes, end_of_stream: bool = True) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=end_of_stream))


def response_headers(
    status: int = 200, content_type: str = "application/json", end_of_stream: bool = False
) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(
        response_headers=pb.HttpHeaders(
            headers=_headers({":status": str(status), "content-type": content_type}),
            end_of_stream=end_of_stream,
        )
    )


def response_body(body: bytes, end_of_stream: bool = False) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(response_body=pb.HttpBody(body=body, end_of_stream=end_of_stream))


def set_headers(mutation: Any) -> dict[str, str]:
    return {h.header.key: h.header.raw_value.decode() for h in mutation.set_headers}


def picked(out: list[Any]) -> tuple[str | None, str | None]:
    """(destination header, envoy.lb metadata) set by a pick's answers."""
    header = meta = None
    for resp in out:
        kind = resp.WhichOneof("response")
        if kind in ("request_headers", "request_body"):
            headers = set_headers(getattr(resp, kind).response.header_mutation)
            header = headers.get("x-gateway-destination-endpoint", header)
        if resp.HasField("dynamic_metadata"):
            lb = resp.dynamic_metadata.fields["envoy.lb"].struct_value
            meta = lb.fields["x-gateway-destination-endpoint"].string_value
    return header, meta


async def pick(
    stream: PickStream,
    body: bytes,
    path: str = "/v1/completions",
    headers: dict[str, str] | None = None,
) -> list[Any]:
    """Full duplex: the headers (answered later, unless refused), then the whole body."""
    first = await stream.handle(request_headers(path, extra=headers))
    if first:
        return first  # refused on its headers
    return await stream.handle(request_body(body))
